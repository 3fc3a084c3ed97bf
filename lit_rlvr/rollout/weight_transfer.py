"""``lit_rlvr_file``: a weight-transfer backend for vLLM's RL routes where NCCL is not there (CPU, one machine).

vLLM 0.32's ``vllm serve`` updates its weights through ``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update`` with a backend from its
``WeightTransferEngineFactory``: NCCL and CUDA IPC on GPUs. On CPU neither exists, so this module
adds one through vLLM's own plug-in mechanism (the ``vllm.general_plugins`` entry point,
:func:`lit_rlvr.vllm_plugin.register`), not a private RPC: the trainer writes each chunk of
the policy's weights as a safetensors file into a private folder (mode 0700) of a directory both
processes see (``/dev/shm`` when it exists), and posts its path to ``/update_weights``; each worker loads it into its model with
vLLM's ``load_weights`` inside a layerwise reload, exactly as the IPC backend does with its tensors.

Both halves are here: :class:`FileWeightTransferEngine` runs in vLLM's worker,
:class:`FileTrainerWeightTransferEngine` in the trainer (driven through vLLM's
``VLLMWeightSyncClient``). This module imports only torch, safetensors and vLLM, so a vLLM worker
imports it cheaply.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

BACKEND = "lit_rlvr_file"


def buckets(weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a weight stream into consecutive buckets of at most ``bucket_bytes`` (a larger tensor alone).

    Each bucket is handed over before the next tensor is taken from ``weights``, so a sender that
    copies a bucket holds at most one bucket of copies (plus the one tensor in hand).

    Example:
        >>> w = [("a", torch.ones(4)), ("b", torch.zeros(2, 2)), ("c", torch.arange(3.0)), ("d", torch.ones(9))]
        >>> [[name for name, _ in bucket] for bucket in buckets(w, bucket_bytes=32)]
        [['a', 'b'], ['c'], ['d']]
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket, size = [], 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def default_directory() -> str:
    """Where the chunks go: RAM-backed ``/dev/shm`` when this machine has it, else the temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


@dataclass
class FileWeightTransferInitInfo(WeightTransferInitInfo):
    """Worker-side init info (nothing to rendezvous: the files carry everything)."""


@dataclass
class FileWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """One chunk: the safetensors file to load and the names it holds."""

    path: str
    names: list[str] = field(default_factory=list)


class FileWeightTransferEngine(WeightTransferEngine[FileWeightTransferInitInfo, FileWeightTransferUpdateInfo]):
    """vLLM-worker side: load each posted file into the model (layerwise reload, as vLLM's IPC backend)."""

    init_info_cls = FileWeightTransferInitInfo
    update_info_cls = FileWeightTransferUpdateInfo

    def init_transfer_engine(self, init_info: FileWeightTransferInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: FileWeightTransferUpdateInfo) -> None:
        from safetensors.torch import load_file

        tensors = load_file(update_info.path, device=str(self.device))
        missing = sorted(set(update_info.names) - set(tensors))
        if missing:
            raise ValueError(
                f"{update_info.path} lacks {len(missing)} of the tensors it was posted with, e.g. {missing[:3]}"
            )
        self.model.load_weights(list(tensors.items()))

    def shutdown(self) -> None:
        pass


@dataclass
class FileTrainerInitInfo(TrainerInitInfo):
    """Trainer-side init info: the bytes per chunk (``rollout.sync_bucket_mb``) and the directory both
    sides see (rank 0 sends)."""

    backend: ClassVar[str] = BACKEND

    chunk_bytes: int
    directory: str = field(default_factory=default_directory)


class FileTrainerWeightTransferEngine(TrainerWeightTransferEngine[FileTrainerInitInfo]):
    """Trainer side: stream the source's ``(name, tensor)`` pairs into chunk files of at most
    ``chunk_bytes`` (:func:`buckets`) and post each.

    Every rank iterates the source (under FSDP2 each tensor is a collective gather); only the
    sender writes and posts. A chunk's file is deleted once the server has loaded it, so the
    sender's extra memory (and ``/dev/shm``'s) is one chunk, whatever the model's size.
    """

    init_info_cls = FileTrainerInitInfo

    def __init__(self, *, client, chunk_bytes: int, source=None, is_sender: bool = True, directory: str = ""):
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.directory, self.chunk_bytes = directory, chunk_bytes

    @classmethod
    def trainer_init(cls, init_info: FileTrainerInitInfo, *, client, source=None) -> FileTrainerWeightTransferEngine:
        if source is None:
            raise ValueError(f"the {BACKEND} weight transfer needs a WeightSource")
        engine = cls(
            client=client,
            source=source,
            is_sender=init_info.is_sender,
            directory=init_info.directory,
            chunk_bytes=init_info.chunk_bytes,
        )
        if engine.is_sender:
            Path(engine.directory).mkdir(parents=True, exist_ok=True)
            client.init_weight_transfer_engine({})
        return engine

    def send_weights(self) -> None:
        """One sync: the chunks go into a folder of their own that only this user can open (mode
        0700, removed afterwards): no other local user reads the policy's weights."""
        if not self.is_sender:  # the other ranks join the gathers and keep nothing
            for _ in self.source:
                pass
            return
        folder = Path(tempfile.mkdtemp(prefix="lit_rlvr_weights_", dir=self.directory))
        try:
            self.client.start_weight_update()
            copies = ((name, tensor.detach().to("cpu", copy=True).contiguous()) for name, tensor in self.source)
            for bucket in buckets(copies, self.chunk_bytes):  # one bucket of copies at a time
                self._post(folder, dict(bucket))
            self.client.finish_weight_update()
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _post(self, folder: Path, chunk: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        path = folder / f"lit_rlvr_weights_{os.getpid()}_{uuid.uuid4().hex}.safetensors"
        try:
            save_file(chunk, str(path))
            self.client.update_weights({"path": str(path), "names": sorted(chunk)})
        finally:
            path.unlink(missing_ok=True)
