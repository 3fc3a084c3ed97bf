"""Files that are complete or absent: written under a temporary name beside the target, then renamed.

A full disk (``ENOSPC``), a quota or a kill in the middle of a write must never leave a truncated
checkpoint, a half-exported model or a short cache shard under its real name, where a later run
would take it for a whole one. Checkpoints (:mod:`lit_rlvr.checkpoint`), the Hugging Face export
(:class:`~lit_rlvr.callbacks.HFExport`) and the reference cache's shards and manifests
(:mod:`lit_rlvr.cache`) are written through :func:`atomic_file` / :func:`atomic_dir`: the data goes
to a temporary name in the same directory (so the rename never crosses filesystems), is flushed to
disk, and only then takes the real name with one ``rename``. On any error the temporary file or
folder is removed and an ``OSError`` becomes a :class:`WriteError` that names the path and the free
space of its filesystem.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


class WriteError(OSError):
    """Writing a file failed (full disk, quota, permissions); the message names the path and the free space."""


def free_space(path: str | Path) -> int | None:
    """Bytes free for this user on the filesystem that holds ``path`` (its nearest existing folder), or None."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def human_bytes(n: int) -> str:
    """``n`` bytes in B / KiB / MiB / GiB / TiB, three significant digits.

    Example:
        >>> human_bytes(512), human_bytes(3 * 2**20), human_bytes(int(1.5 * 2**30))
        ('512 B', '3.00 MiB', '1.50 GiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.3g} {unit}" if n >= 100 else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def write_error(path: str | Path, err: OSError, what: str = "") -> WriteError:
    """A :class:`WriteError` for ``err`` raised while writing ``path``, naming it and the free space.

    Example:
        >>> import errno
        >>> str(write_error("/no/such/dir/x.ckpt", OSError(errno.ENOSPC, "No space left on device"), "checkpoint"))
        '[Errno 28] cannot write checkpoint /no/such/dir/x.ckpt: No space left on device (... free on its filesystem)'
    """
    free = free_space(path)
    space = "free space unknown" if free is None else f"{human_bytes(free)} free on its filesystem"
    reason = err.strerror or str(err)
    return WriteError(err.errno, f"cannot write {what + ' ' if what else ''}{path}: {reason} ({space})")


def _os_error(err: BaseException) -> OSError | None:
    """The ``OSError`` behind ``err``: itself, or one it was raised from or during (a writer such as
    torch's zip writer turns its stream's ``OSError`` into a ``RuntimeError``)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _temporary(path: Path) -> Path:
    """``path``'s temporary name: fixed, so a write killed midway leaves a file the next write of
    ``path`` replaces (one process writes a given path: rank 0, or the rank that owns a shard)."""
    return path.with_name(f"{path.name}.tmp")


@contextmanager
def atomic_file(path: str | Path, what: str = "") -> Iterator[BinaryIO]:
    """Yield a binary file to write ``path``'s content into; ``path`` appears only once it is complete.

    The file is opened under a temporary name in ``path``'s folder (created if needed); on a clean
    exit it is flushed, ``fsync``-ed and renamed to ``path`` (replacing an older one at once). On
    any exception the temporary file is removed; an ``OSError`` (also one a writer wrapped in
    another exception) is raised as a :class:`WriteError` naming ``path`` (described as ``what``)
    and the free space.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "a.bin"
        >>> with atomic_file(target) as f:
        ...     _ = f.write(b"complete")
        >>> target.read_bytes(), sorted(p.name for p in target.parent.iterdir())
        (b'complete', ['a.bin'])
    """
    path = Path(path)
    tmp = _temporary(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        cause = _os_error(err)
        if cause is not None and not isinstance(err, WriteError):
            raise write_error(path, cause, what) from err
        raise


@contextmanager
def atomic_dir(path: str | Path, what: str = "") -> Iterator[Path]:
    """Yield an empty temporary folder to fill; it becomes ``path`` only once the block completes.

    An existing ``path`` is replaced only after the new folder is complete (it is moved aside,
    the new one renamed in, then it is deleted). On any exception the temporary folder is removed
    and ``path`` is left as it was; an ``OSError`` is raised as a :class:`WriteError` naming
    ``path`` and the free space.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "export"
        >>> with atomic_dir(target) as tmp:
        ...     _ = (tmp / "config.json").write_text("{}")
        >>> sorted(p.name for p in target.iterdir()), sorted(p.name for p in target.parent.iterdir())
        (['config.json'], ['export'])
    """
    path = Path(path)
    tmp, old = _temporary(path), path.with_name(f"{path.name}.old")
    try:
        for leftover in (tmp, old):  # of a write that was killed
            shutil.rmtree(leftover, ignore_errors=True)
        tmp.mkdir(parents=True)
        yield tmp
        for file in tmp.rglob("*"):  # flushed before the folder takes the real name
            if file.is_file():
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not path.exists():
            os.replace(old, path)  # the previous export stays
        cause = _os_error(err)
        if cause is not None and not isinstance(err, WriteError):
            raise write_error(path, cause, what) from err
        raise
    shutil.rmtree(old, ignore_errors=True)
