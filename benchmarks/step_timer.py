"""The benchmarks' per-step clock for ``lit-rlvr fit`` runs (``benchmarks/async.py``), apart from
``common`` so that ``import common`` does not import Lightning (a script's own helpers, and the tests of
them, start in a fraction of a second)."""

from __future__ import annotations

import os
import time

from lightning import Callback


class RolloutStepTimer(Callback):
    """``step_timer.RolloutStepTimer`` in a config's ``trainer.callbacks``: one JSON line per training batch
    at ``path`` with its end time, its rollout tokens and the step's rollout metrics
    (``rollout/seconds``: the time the loop waited for rollouts; ``rollout/tokens_per_s``: tokens
    over the sampler's own seconds; ``rollout/staleness``) and the rollout callback's cumulative
    ``trainer_idle_s`` (asynchronous rollouts: the loop's waits for rollouts and for the batch in
    generation before a weight sync)."""

    def __init__(self, path: str, pin_cpus: list[int] | None = None):
        self.path, self.pin_cpus = path, pin_cpus

    def on_train_start(self, trainer, pl_module):
        if self.pin_cpus is not None:  # the training loop's thread (and the threads it starts later) on these cores
            os.sched_setaffinity(0, set(self.pin_cpus))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import json

        from lit_rlvr.callbacks import RolloutCallback

        m = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("rollout/")}
        rollout = next(cb for cb in trainer.callbacks if isinstance(cb, RolloutCallback))
        record = {
            "end": time.perf_counter(),
            "tokens": batch.rollouts.num_tokens(),
            "wait_s": m.get("rollout/seconds"),
            "tokens_per_s": m.get("rollout/tokens_per_s"),
            "staleness": m.get("rollout/staleness"),
            "trainer_idle_s": rollout.asynchronous.trainer_idle_s if rollout.asynchronous is not None else 0.0,
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
