"""MetricsWriter: append each validation's metrics to a JSON-lines file.

Loggers (CSV, TensorBoard, W&B) are for curves; this is for tools that compare runs — the demo's
Pass@k table and the diversity-collapse benchmark read these files.
"""

from __future__ import annotations

import json
from pathlib import Path

from lightning import Callback, LightningModule, Trainer
from typing_extensions import override


class MetricsWriter(Callback):
    """After every validation, append ``{"step", "label", **val metrics}`` to ``path`` (rank 0).

    Args:
        path: the JSON-lines file (parent folders are created).
        label: a name for the run, stored with every record (e.g. ``"base"``, ``"dph_f"``).
        prefix: only metrics whose name starts with this are written.
    """

    def __init__(self, path: str, label: str = "run", prefix: str = "val/"):
        self.path, self.label, self.prefix = Path(path), label, prefix

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(self.prefix)}
        if not metrics:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps({"step": trainer.global_step, "label": self.label, **metrics}) + "\n")
