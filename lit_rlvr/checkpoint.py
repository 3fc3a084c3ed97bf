"""Checkpoints that are whole or absent, and that carry their own sha256, verified before a resume.

Lightning's default writer stages a checkpoint in the system's temporary folder and copies it into
place, so a full disk leaves a truncated ``.ckpt`` under its real name, which a resume then fails
to read deep inside torch's zip reader; and torch does not check the archive's CRCs, so a flipped
byte in a tensor loads (and trains) without a word. :class:`SafeCheckpointIO` (the ``lit-rlvr``
CLI's default ``CheckpointIO``) instead:

- writes each checkpoint through :func:`~lit_rlvr.atomic.atomic_file` (temporary name beside it,
  ``fsync``, rename): a failed write leaves no file and raises a
  :class:`~lit_rlvr.atomic.WriteError` naming the path and the free space;
- stores the sha256 of the archive in the zip's own comment field (``lit_rlvr-sha256:<hex>``, the
  archive as torch wrote it), so the checksum travels with the file and any zip tool shows it;
  torch and Lightning read the file as before;
- verifies that checksum before loading (:func:`verify_checkpoint`): a damaged file is refused
  with :class:`CheckpointCorruptError` naming it. A checkpoint without the comment (written by
  Lightning's default writer, or by lit_rlvr 0.1) loads unverified, as before.

The random states a checkpoint carries for an exact resume are :func:`rng_state`'s.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from typing_extensions import override

from lit_rlvr.atomic import atomic_file

_TAG = b"lit_rlvr-sha256:"
_COMMENT_LEN = len(_TAG) + 64  # the tag and the hex digest
_EOCD = b"PK\x05\x06"  # the zip's end-of-central-directory record: 22 bytes, the comment's length last
_EOCD_SIZE = 22


class CheckpointCorruptError(RuntimeError):
    """A checkpoint's bytes do not match the sha256 it carries, or it is not a complete archive."""


class _HashingWriter:
    """A write-only stream that hashes what passes through and keeps the last bytes (the zip's EOCD)."""

    def __init__(self, f):
        self.f, self.sha, self.tail = f, hashlib.sha256(), b""

    def write(self, data) -> int:
        data = bytes(data)
        self.sha.update(data)
        self.tail = (self.tail + data)[-_EOCD_SIZE:]
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def save_with_checksum(checkpoint: dict[str, Any], f) -> str:
    """``torch.save`` ``checkpoint`` into the binary file ``f`` and seal it with its sha256; returns the digest.

    The digest is that of the archive exactly as torch wrote it (zip comment empty); the comment
    then holds ``lit_rlvr-sha256:<digest>`` and its length.

    Example:
        >>> import io, torch
        >>> buffer = io.BytesIO()
        >>> digest = save_with_checksum({"w": torch.ones(2)}, buffer)
        >>> buffer.getvalue().endswith(b"lit_rlvr-sha256:" + digest.encode()), torch.load(io.BytesIO(buffer.getvalue()))
        (True, {'w': tensor([1., 1.])})
    """
    import torch

    sink = _HashingWriter(f)
    torch.save(checkpoint, sink)
    if not (sink.tail.startswith(_EOCD) and sink.tail[-2:] == b"\0\0"):
        raise RuntimeError("torch.save did not end its archive with an empty zip comment; cannot seal the checkpoint")
    digest = sink.sha.hexdigest()
    f.seek(-2, 2)  # the comment's length, then the comment
    f.write(_COMMENT_LEN.to_bytes(2, "little") + _TAG + digest.encode())
    return digest


def carried_checksum(path: str | Path) -> str | None:
    """The sha256 a checkpoint carries in its zip comment (None: a checkpoint without one)."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        if size < _EOCD_SIZE + _COMMENT_LEN:
            return None
        f.seek(size - _COMMENT_LEN - _EOCD_SIZE)
        tail = f.read()
    eocd, comment = tail[:_EOCD_SIZE], tail[_EOCD_SIZE:]
    if not (eocd.startswith(_EOCD) and eocd[-2:] == _COMMENT_LEN.to_bytes(2, "little") and comment.startswith(_TAG)):
        return None
    return comment[len(_TAG) :].decode("ascii", "replace")


def verify_checkpoint(path: str | Path) -> bool:
    """Check a checkpoint against the sha256 it carries; True if verified, False if it carries none.

    Raises:
        CheckpointCorruptError: the file's bytes differ from those its checksum was taken of.
    """
    expected = carried_checksum(path)
    if expected is None:
        return False
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(0, 2)
        remaining = f.tell() - _COMMENT_LEN - 2  # up to the comment's length field
        f.seek(0)
        while remaining > 0:
            block = f.read(min(1 << 20, remaining))
            if not block:
                break
            sha.update(block)
            remaining -= len(block)
    sha.update(b"\0\0")  # the archive as torch wrote it: no comment
    if sha.hexdigest() != expected:
        raise CheckpointCorruptError(
            f"checkpoint {path} is damaged: its sha256 is {sha.hexdigest()[:16]}…, but it was written with "
            f"{expected[:16]}… (a changed or lost byte); resume from another checkpoint"
        )
    return True


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO``, with atomic writes and a sha256 verified on load (module docstring).

    The ``lit-rlvr`` CLI uses it unless a config gives another ``CheckpointIO``; with the Python API:
    ``Trainer(plugins=[SafeCheckpointIO()])``. Paths on remote filesystems (``s3://`` …) go to
    Lightning's own writer.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if not _local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"SafeCheckpointIO.save_checkpoint takes no storage_options, got {storage_options!r}")
        with atomic_file(path, "checkpoint") as f:
            save_with_checksum(checkpoint, f)

    @override
    def load_checkpoint(self, path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if not (_local(path) and Path(path).is_file()):
            return super().load_checkpoint(path, *args, **kwargs)
        verify_checkpoint(path)
        try:
            return super().load_checkpoint(path, *args, **kwargs)  # Lightning's map_location and weights_only
        except RuntimeError as err:
            if "zip archive" in str(err) or "central directory" in str(err):
                raise CheckpointCorruptError(
                    f"checkpoint {path} is not a complete archive (truncated?): {err}"
                ) from err
            raise


def _local(path) -> bool:
    return "://" not in str(path)


def save_training_state(checkpoint: dict[str, Any], generator: torch.Generator, entropy: Any | None) -> None:
    """Put into ``checkpoint`` what an exact resume needs beyond Lightning's: the random states
    (:func:`rng_state`) and the adaptive entropy coefficient (an ``EntropyState``; None: no bonus)."""
    checkpoint["lit_rlvr_rng"] = rng_state(generator)
    if entropy is not None:  # the adaptive coefficient moves with training: it resumes where it was
        checkpoint["lit_rlvr_entropy_control"] = {"coef": entropy.coef, "active": entropy.active}


def load_training_state(checkpoint: dict[str, Any], generator: torch.Generator, entropy: Any | None = None) -> Any:
    """Restore what :func:`save_training_state` saved: the random states, and the entropy coefficient
    as ``entropy`` (an ``EntropyState``) with the saved values, returned (``entropy`` as it is when
    none was saved or there is no bonus, None)."""
    if "lit_rlvr_rng" in checkpoint:
        restore_rng(checkpoint["lit_rlvr_rng"], generator)
    control = checkpoint.get("lit_rlvr_entropy_control")
    if control is None or entropy is None:
        return entropy
    return replace(entropy, coef=float(control["coef"]), active=bool(control["active"]))


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """The random states a resumed run needs to draw what the uninterrupted run would: torch's global
    generator, Python's, and ``generator`` (the module's own: bootstrap advantages, mini-batch order)."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "generator": generator.get_state()}


def restore_rng(state: dict[str, Any], generator: torch.Generator) -> None:
    """Put back what :func:`rng_state` saved."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    generator.set_state(state["generator"])
