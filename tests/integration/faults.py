"""Fault injection for the tests: a disk that fills up, in this process or as a real small filesystem.

:func:`full_disk` makes every write to a file under a folder fail with ``ENOSPC`` once a byte budget
is spent, as a full filesystem does: the bytes up to the budget land in the file, the write that
crosses it raises ``OSError(ENOSPC)``, and later writes raise at once. It covers Python file
objects (``open``, ``io.open``, ``Path.open`` / ``write_text`` / ``write_bytes``: torch.save into a
file object, JSON, the cache's shards) and safetensors' own file writer as transformers calls it
(the export's weights), so the write paths of checkpoints, exports and cache shards run into it
inside ``make test``. :func:`tmpfs_prefix` gives the real thing where the kernel lets a user mount
a size-limited ``tmpfs`` in a private namespace (``unshare -rm``).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class _Budget:
    def __init__(self, free_bytes: int):
        self.left = free_bytes
        self.failed: list[str] = []  # the paths whose writes hit the full disk


class _FillingFile:
    """A file whose writes stop with ENOSPC when the disk's budget is spent."""

    def __init__(self, raw, budget: _Budget, path: str):
        self._raw, self._budget, self._path = raw, budget, path

    def write(self, data):
        n = len(data)
        if n > self._budget.left:
            if self._budget.left:
                self._raw.write(data[: self._budget.left])  # what fits lands, as on a real disk
                self._raw.flush()
            self._budget.left = 0
            self._budget.failed.append(self._path)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)
        self._budget.left -= n
        return self._raw.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._raw.close()

    def __iter__(self):
        return iter(self._raw)

    def __getattr__(self, name):
        return getattr(self._raw, name)


@contextmanager
def full_disk(monkeypatch, root: str | Path, free_bytes: int = 0) -> Iterator[_Budget]:
    """Writes to files under ``root`` fail with ``ENOSPC`` after ``free_bytes`` bytes (all files together).

    Yields the budget; its ``failed`` lists the paths whose writes ran out of space.
    """
    root = os.path.abspath(root)
    budget = _Budget(free_bytes)
    real_open = builtins.open

    def filling_open(file, mode="r", *args, **kwargs):
        raw = real_open(file, mode, *args, **kwargs)
        writes = any(c in mode for c in "wax+")
        if writes and isinstance(file, (str, os.PathLike)) and os.path.abspath(file).startswith(root + os.sep):
            return _FillingFile(raw, budget, os.path.abspath(file))
        return raw

    def python_save_file(tensors, filename, metadata=None):  # safetensors' writer, through `open`
        from safetensors.torch import save

        with filling_open(filename, "wb") as f:
            f.write(save(tensors, metadata=metadata))

    import transformers.modeling_utils

    with monkeypatch.context() as m:
        m.setattr(builtins, "open", filling_open)
        m.setattr(io, "open", filling_open)
        m.setattr(transformers.modeling_utils, "safe_save_file", python_save_file)
        yield budget


def tmpfs_prefix(folder: Path, size: str, after: str = "true") -> list[str] | None:
    """A command prefix that runs a command with a real ``tmpfs`` of ``size`` (``"3m"``) mounted at
    ``folder`` in a private mount namespace (``unshare -rm``), then the shell command ``after``
    (while the filesystem is still there), exiting with the command's status; None where the kernel
    or the container does not let a user do that."""
    if shutil.which("unshare") is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={size} none "{folder}" || exit 97; "$@"; status=$?; {after}; exit $status'
    prefix = ["unshare", "-rm", "sh", "-c", script, "sh"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    return prefix if probe.returncode == 0 else None
