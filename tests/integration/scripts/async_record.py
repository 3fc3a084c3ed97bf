"""Recorder of the asynchronous-rollout tests (imported by in-process and ``lit-rlvr fit`` runs).

``BatchRecorder(path)`` appends one JSON line per training batch (its position, prompts,
rollouts, loss and the step) and at fit end the weights' SHA-256; the first line names the
rollout server's pid, so a test can check the server dies with a killed trainer. Importing this
module registers the ``test_async_seven`` reward (1 if the completion contains a 7) and
``test_async_digit`` (1 if it contains any digit: the tiny model's groups are mixed and its
cache has prompts with passes, so DPH-RL has anchors).
"""

from __future__ import annotations

import hashlib
import json
import os

from lightning import Callback

from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.rewards import REWARDS


def contains_seven(completion: str, answer: str, **row) -> float:
    return float("7" in completion)


def contains_a_digit(completion: str, answer: str, **row) -> float:
    return float(any(c.isdigit() for c in completion))


for _name, _fn in (("test_async_seven", contains_seven), ("test_async_digit", contains_a_digit)):
    if _name not in REWARDS:
        REWARDS.register(_name)(_fn)


def weights_digest(module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(
            tensor.detach().cpu().contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes()
        )
    return digest.hexdigest()


class BatchRecorder(Callback):
    def __init__(self, path: str):
        self.path = path

    def _write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def on_train_start(self, trainer, pl_module):
        rollout = next(cb for cb in trainer.callbacks if isinstance(cb, RolloutCallback))
        servers = getattr(rollout.engine, "servers", [])
        self._write({"server_pids": [s.proc.pid for s in servers], "trainer_pid": os.getpid()})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self._write(
            {
                "step": trainer.global_step,
                "position": list(batch.position),
                "prompt_ids": batch.prompt_ids,
                "completions": batch.rollouts.completion_ids,
                "logprobs": batch.rollouts.sampler_logprobs,
                "loss": float(loss),
                "anchors": 0 if batch.anchor is None else len(batch.anchor.rewards),
            }
        )

    def on_fit_end(self, trainer, pl_module):
        self._write({"weights": weights_digest(pl_module.policy)})


def read(path) -> tuple[dict, list[dict], str | None]:
    """``(first line, batch records, weights digest or None)``."""
    lines = [json.loads(line) for line in open(path)]
    digest = next((r["weights"] for r in lines if "weights" in r), None)
    return lines[0], [r for r in lines if "position" in r], digest
