"""PassCountsWriter: write each validation's per-prompt correct counts to a JSON file.

The file (``{set name: {prompt id: correct samples}}``) is what ``model.retention_reference``
reads to measure retention against a base policy: validate the base with this callback, then
validate a trained policy with the file as its reference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from typing_extensions import override


class PassCountsWriter(Callback):
    """Collect ``validation_step``'s per-prompt counts and write them after each validation (rank 0).

    ``validation_step`` returns ``{"set": name, "ids": [...], "num_correct": [...]}`` per batch
    (:class:`lit_rlvr.module.RLVRModule` does); counts from every rank are gathered first.

    Args:
        path: the JSON file; None disables writing.
    """

    def __init__(self, path: str | None = None):
        self.path = path
        self._counts: dict[str, dict[str, int]] = {}

    @override
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._counts = {}

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.path is None or not isinstance(outputs, dict) or "num_correct" not in outputs:
            return
        self._counts.setdefault(outputs["set"], {}).update(zip(outputs["ids"], map(int, outputs["num_correct"])))

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.path is None or trainer.sanity_checking:
            return
        parts = [self._counts]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            parts = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(parts, self._counts)
        if trainer.is_global_zero:
            merged: dict[str, dict[str, int]] = {}
            for part in parts:
                for name, counts in part.items():
                    merged.setdefault(name, {}).update(counts)
            path = Path(self.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(merged, indent=0, sort_keys=True))
