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

The temporary name is ``<name>.<12 random hex digits>.tmp``, created exclusively (``open(…, "x")``,
``mkdir``: an existing name, a planted symlink included, is never followed or reused), and the
writer holds an ``flock`` on it until the rename. So a link planted at a guessable name cannot
redirect a write, two writers never share a temporary, the temporary of a write that was killed
(no lock held) is removed by the next write of the same path, and a folder that another process
is writing (its temporary locked) is refused with :class:`ConcurrentWriteError` instead of mixing
two exports' files.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


class WriteError(OSError):
    """Writing a file failed (full disk, quota, permissions); the message names the path and the free space."""


class ConcurrentWriteError(RuntimeError):
    """Another process is writing the same folder (its temporary folder is locked)."""


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


def _temporary(path: Path, kind: str = "tmp") -> Path:
    """A fresh temporary name beside ``path``: ``<name>.<12 random hex digits>.<kind>``."""
    return path.with_name(f"{path.name}.{secrets.token_hex(6)}.{kind}")


def _locked(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` without waiting; False if another open file holds one."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _others(path: Path) -> list[tuple[Path, bool]]:
    """``(temporary, held)`` for each temporary of another write of ``path`` in its folder: held by a
    live writer (it has the lock), or left by a killed one (also the fixed ``<name>.tmp`` /
    ``<name>.old`` of lit_rlvr 0.2 and earlier)."""
    pattern = re.compile(re.escape(path.name) + r"(\.[0-9a-f]{12})?\.(tmp|old)")
    found = []
    for entry in path.parent.iterdir() if path.parent.is_dir() else ():
        if not pattern.fullmatch(entry.name):
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # a link (never ours) or gone: not a live write
            found.append((entry, False))
            continue
        try:
            found.append((entry, not _locked(fd)))
        finally:
            os.close(fd)  # releases the probe's lock
    return found


def _remove(entry: Path) -> None:
    """Remove a file, link or folder, without following a link."""
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def _remove_leftovers(path: Path) -> list[Path]:
    """Remove the temporaries of killed writes of ``path``; return those of live ones."""
    live = []
    for entry, held in _others(path):
        if held:
            live.append(entry)
        else:
            _remove(entry)
    return live


@contextmanager
def atomic_file(path: str | Path, what: str = "") -> Iterator[BinaryIO]:
    """Yield a binary file to write ``path``'s content into; ``path`` appears only once it is complete.

    The file is created exclusively under a fresh temporary name in ``path``'s folder (created if
    needed; module docstring); on a clean exit it is flushed, ``fsync``-ed and renamed to ``path``
    (replacing an older one, or a link planted there, at once). On any exception the temporary
    file is removed; an ``OSError`` (also one a writer wrapped in another exception) is raised as a
    :class:`WriteError` naming ``path`` (described as ``what``) and the free space.

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
        _remove_leftovers(path)
        with open(tmp, "xb") as f:  # "x": O_EXCL, never an existing file or link
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # a live write: the next writer leaves it alone
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

    Raises:
        ConcurrentWriteError: another process is writing ``path`` (before anything is written).

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "export"
        >>> with atomic_dir(target) as tmp:
        ...     _ = (tmp / "config.json").write_text("{}")
        >>> sorted(p.name for p in target.iterdir()), sorted(p.name for p in target.parent.iterdir())
        (['config.json'], ['export'])
    """
    path = Path(path)
    tmp, old = _temporary(path), _temporary(path, "old")
    lock = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()  # exclusive: fails on any existing name, a link included
        lock = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        fcntl.flock(lock, fcntl.LOCK_EX)
        live = [other for other in _remove_leftovers(path) if other != tmp]
        if live:
            raise ConcurrentWriteError(
                f"cannot write {what + ' ' if what else ''}{path}: another process is writing it (its temporary "
                f"folder {live[0].name} is in use); two writes of one folder would mix their files"
            )
        yield tmp
        for file in tmp.rglob("*"):  # flushed before the folder takes the real name
            if file.is_file():
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
        if path.exists() or path.is_symlink():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException as err:
        _remove(tmp)
        if (old.exists() or old.is_symlink()) and not path.exists():
            os.replace(old, path)  # the previous export stays
        cause = _os_error(err)
        if cause is not None and not isinstance(err, WriteError):
            raise write_error(path, cause, what) from err
        raise
    finally:
        if lock is not None:
            os.close(lock)
    _remove(old)
