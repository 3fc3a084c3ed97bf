"""What a training step came to, for the logs: its loss components, what it trained on and the
behaviour of multi-turn rollouts.

:func:`log_step` is the shell between :meth:`RLVRModule.training_step <lit_rlvr.module.RLVRModule.training_step>`
and the module's logger, as :class:`~lit_rlvr.rewards.report.RewardReport` is for the rewards. The
rollouts' own statistics are the rollout callback's (``rollout/mean_len``, ``rollout/truncated``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_rlvr.functional.losses import nonfinite_count
from lit_rlvr.metrics.behaviour import batch_behaviour


def log_step(
    module: Any, data: Any, keep: Tensor, losses: list[dict[str, Tensor]], rollouts: Any, max_turns: int | None
) -> None:
    """Log under ``train/`` through ``module`` (a LightningModule) every loss component of the step
    (each one's mean over the step's optimizer steps in ``losses``), the step's rewards, the share
    of rows it kept (``keep``, ``(B,)`` bool) and the sampler's non-finite log-probs of ``data``
    (the step's ``StepData``), and multi-turn ``rollouts``' behaviour as validation reports it
    (:func:`~lit_rlvr.metrics.behaviour.batch_behaviour`, up to ``max_turns``)."""
    B = len(keep)
    mean = {k: torch.stack([p[k] for p in losses if k in p]).mean() for k in (losses[0] if losses else {})}
    module.log_dict({f"train/{k}": v for k, v in mean.items() if k != "loss"}, batch_size=B)
    if "loss" in mean:
        module.log("train/loss", mean["loss"], prog_bar=True, batch_size=B)
    rewards = data.rewards
    module.log("train/reward", rewards.mean() if len(rewards) else torch.zeros(()), prog_bar=True, batch_size=B)
    stats = {
        "train/nonfinite_old_logprobs": nonfinite_count(data.old_logprobs, data.loss_tokens).float(),
        "train/kept_rows": keep.float().mean(),
    }
    module.log_dict(stats, batch_size=B)
    if (behaviour := rollouts.behaviour()) is not None:
        values = batch_behaviour(behaviour, rollouts.tool_sequences(), max_turns)
        module.log_dict({f"train/{k}": v for k, v in values.items()}, batch_size=len(rollouts.completion_ids))
