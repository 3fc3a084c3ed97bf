"""On-disk format of the reference cache, and the fingerprints that bind it to a model and data.

A cache is a directory::

    manifest.json              what was built, from what, and the list of finished shards
    shard-00000.safetensors    prompts [0, S), flat arrays + offsets (layout below)
    shard-00001.safetensors    prompts [S, 2S), ...

Each shard holds P prompts with n samples each (prompt-major, sample ``j`` of prompt ``i`` is
row ``i·n + j``), as flat arrays with offsets so nothing is padded:

- ``prompt_offsets (P+1,) int64``, ``prompt_tokens (ΣLp,) int32`` — prompt token ids;
- ``sample_offsets (P·n+1,) int64``, ``completion_ids (ΣT,) int32``, ``ref_logprobs (ΣT,)
  float32`` — completion tokens and their log π_ref at temperature 1.0 over the full vocabulary;
- ``rewards (P·n,) float32``, ``finished (P·n,) uint8`` (1 = stopped, 0 = hit the length cap),
  ``pass_counts (P,) int32``;
- a multi-turn cache (sampled with an environment) also ``loss_mask (ΣT,) uint8``: 1 on the model's
  tokens, 0 on the environment's (the anchors' divergence acts on the model's only), and its manifest
  records the environments (``name@version``), turn limits and the options given to them
  (``environment``, None for single-turn): a run with another environment, another version of it,
  other limits or other options refuses it;
- safetensors metadata ``lit_rlvr``: JSON with ``ids`` (the P prompt row ids) and the scorer's
  ``status_counts``.

Shards are ordinary safetensors files (inspectable with any safetensors tool); the reader does
not map them but reads byte ranges with ``os.pread``, so streaming a cache never grows the
process's resident memory with the cache size. The manifest records each shard's size and
sha256, so a truncated or corrupt shard is detected before it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np

from lit_rlvr.atomic import atomic_file
from lit_rlvr.contracts import StartupError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARD_ARRAYS = (
    "prompt_offsets",
    "prompt_tokens",
    "sample_offsets",
    "completion_ids",
    "ref_logprobs",
    "rewards",
    "finished",
    "pass_counts",
)
# Manifest keys that define *what* a cache is; a resumed build must agree on all of them.
IDENTITY_KEYS = (
    "format_version",
    "model",
    "tokenizer_sha256",
    "sampling",
    "rewards",
    "dataset_fingerprint",
    "num_prompts",
    "n",
    "seed",
    "prompts_per_shard",
    "prompts_per_call",
    "correct_threshold",
    "environment",
)
_DTYPES = {"I32": np.int32, "I64": np.int64, "F32": np.float32, "U8": np.uint8}


class CacheError(RuntimeError):
    """Base class for reference-cache problems."""


class CacheMismatchError(CacheError, StartupError):
    """The cache was built from another model, tokenizer, dataset, sampling setup, environment or turn
    limits: a run refuses it at set-up (a :class:`~lit_rlvr.contracts.StartupError`: ``lit-rlvr`` exits 2)."""


class CacheCorruptError(CacheError):
    """A shard is missing, truncated or does not match its recorded sha256."""


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file, read in 1 MiB chunks (constant memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON to ``path`` through a temporary file and a rename (never half-written;
    :func:`~lit_rlvr.atomic.atomic_file`: a failed write names the path and the free space)."""
    with atomic_file(path, "the reference cache's") as f:
        f.write((json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_safetensors_header(path: str | Path) -> tuple[dict, int]:
    """A safetensors file's header dict and the byte offset where tensor data starts."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CacheCorruptError(f"{path}: truncated safetensors header")
        (n,) = struct.unpack("<Q", raw)
        header = f.read(n)
        if len(header) != n:
            raise CacheCorruptError(f"{path}: truncated safetensors header")
    return json.loads(header), 8 + n


def pread_array(fd: int, spec: dict, data_start: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Elements ``[start, stop)`` of a 1-D tensor described by a safetensors header entry."""
    dtype = np.dtype(_DTYPES[spec["dtype"]])
    begin, end = spec["data_offsets"]
    length = (end - begin) // dtype.itemsize
    stop = length if stop is None else stop
    nbytes = (stop - start) * dtype.itemsize
    buf = os.pread(fd, nbytes, data_start + begin + start * dtype.itemsize)
    if len(buf) != nbytes:
        raise CacheCorruptError(f"short read ({len(buf)} of {nbytes} bytes): shard truncated")
    return np.frombuffer(buf, dtype=dtype)


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what decides a tokenizer's ids: its vocabulary, special tokens and chat template.

    Example:
        >>> from lit_rlvr.demo.tiny import build_char_tokenizer
        >>> tokenizer_fingerprint(build_char_tokenizer("ab")) == tokenizer_fingerprint(build_char_tokenizer("ab"))
        True
        >>> tokenizer_fingerprint(build_char_tokenizer("ab")) == tokenizer_fingerprint(build_char_tokenizer("ba"))
        False
    """
    payload = {
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": sorted(str(t) for t in tokenizer.all_special_tokens),
        "chat_template": getattr(tokenizer, "chat_template", None),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def model_fingerprint(model) -> dict:
    """Identity of a model: its name/path and the sha256 of every weight tensor (name, dtype, shape, bytes).

    Hashing copies each tensor to the CPU once; for a multi-billion-parameter model this takes
    about as long as reading its checkpoint.
    """
    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    config = getattr(model, "config", None)
    return {"name_or_path": getattr(config, "_name_or_path", "") or "", "weights_sha256": h.hexdigest()}


def dataset_fingerprint(rows: list[dict], prompt_ids: list[list[int]]) -> str:
    """sha256 over every row's id, prompt token ids, gold answer and reward name, in order.

    Covers what the cache's samples depend on: change one prompt, answer, template or the order
    of the prompts, and the fingerprint changes.

    Example:
        >>> rows = [{"id": "a/0", "answer": "1", "reward": "math"}]
        >>> dataset_fingerprint(rows, [[1, 2]]) == dataset_fingerprint(rows, [[1, 3]])
        False
    """
    h = hashlib.sha256()
    for row, ids in zip(rows, prompt_ids, strict=True):
        h.update(
            json.dumps([row["id"], list(ids), row.get("answer"), row.get("reward")]).encode()
        )  # TRL rows may have neither
        h.update(b"\n")
    return h.hexdigest()


def _same_model(a: dict | None, b: dict | None) -> bool:
    """The model is its weights: the same folder named by a relative or an absolute path is the same."""
    return (a or {}).get("weights_sha256") == (b or {}).get("weights_sha256")


_SAME = {"model": _same_model}  # identity keys compared by more than equality


def identity_diff(expected: dict, found: dict) -> list[str]:
    """Human-readable differences between two manifests on :data:`IDENTITY_KEYS`.

    Example:
        >>> a = {"model": {"name_or_path": "base", "weights_sha256": "ab"}}
        >>> identity_diff(a, {"model": {"name_or_path": "/abs/base", "weights_sha256": "ab"}})
        []
        >>> identity_diff(a, {"model": {"name_or_path": "base", "weights_sha256": "cd"}})[0].startswith("model: cache has")
        True
    """
    return [
        f"{key}: cache has {found.get(key)!r}, expected {expected.get(key)!r}"
        for key in IDENTITY_KEYS
        if not _SAME.get(key, lambda x, y: x == y)(expected.get(key), found.get(key))
    ]
