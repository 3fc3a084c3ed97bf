"""Data-parallel ranks in lock step: the same optimizer steps and passes, and weights that make each step the global batch's.

Under DDP and FSDP2 every backward (and every FSDP forward) is a collective, so a rank with fewer
micro-batches or optimizer steps than another would leave that one waiting forever; and the
ranks' gradients are averaged, so a micro-batch's loss must be weighted by its normaliser over
the *ranks' mean* normaliser for the averaged gradient to be the global batch's however unevenly
its tokens (or rows) fall on the ranks (docs/methods.md §5). :class:`Lockstep` is the one place
that talks to the other ranks about this; with one process every reduction is the value itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from lit_rlvr.functional.batching import aggregation_normaliser, aggregation_weight, split_indices
from lit_rlvr.functional.divergences import divergence_units


@dataclass(frozen=True)
class StepPlan:
    """The passes of one optimizer step on this rank.

    Attributes:
        loss_weights: one weight per RL micro-batch (its share of the ranks' mean normaliser).
        anchor_weights: one weight per anchor micro-batch (its share of the ranks' mean units).
        filler_passes: forward/backward passes of weight 0 that keep this rank in step with the
            rank that has the most micro-batches.
    """

    loss_weights: list[float]
    anchor_weights: list[float]
    filler_passes: int


class Lockstep:
    """The training ranks of ``trainer`` (one process without a trainer).

    :class:`~lit_rlvr.module.RLVRModule` holds one, made at ``setup`` for the Trainer it runs under.

    Args:
        trainer: the Lightning Trainer (None: a single process). The reductions run on its
            strategy's root device (a CUDA tensor for NCCL, a CPU one for gloo).
    """

    def __init__(self, trainer=None):
        self.trainer = trainer

    @property
    def world(self) -> int:
        return 1 if self.trainer is None else self.trainer.world_size

    def reduce(self, value: float, op: str) -> float:
        """``value`` reduced over the ranks (``"sum"`` or ``"max"``); ``value`` itself in one process."""
        if self.world == 1:
            return float(value)
        return float(self.reduce_tensor(torch.tensor(float(value)), op))

    def reduce_tensor(self, value: Tensor, op: str = "sum") -> Tensor:
        """``value`` (any shape) reduced over the ranks, on the CPU; ``value`` itself in one process."""
        if self.world == 1:
            return value
        return self.trainer.strategy.reduce(value.to(self.trainer.strategy.root_device), reduce_op=op).cpu()

    def most(self, passes: int) -> int:
        """The number of passes every rank runs when this rank has ``passes``: the most any rank has."""
        return int(self.reduce(passes, "max"))

    def optimizer_steps(self, rows: int, mini_batch_size: int | None) -> int:
        """Optimizer steps per PPO epoch on every rank: the most any rank's ``rows`` split into
        mini-batches gives (0 when no rank has a row to learn from)."""
        return self.most(len(split_indices(rows, mini_batch_size)) if rows else 0)

    def plan(
        self,
        mini: Rows | None,
        parts: Sequence[Rows],
        aggregation: str,
        anchor: Rows | None = None,
        anchors: Sequence[Rows] = (),
        anchor_level: str | None = None,
    ) -> StepPlan:
        """Weights and filler passes of one optimizer step (collectives: every rank calls it, in step).

        Each batch is weighed by its ``loss_tokens`` ``(b, T)`` mask (the tokens its loss acts on:
        :class:`~lit_rlvr.contracts.StepData`, :class:`~lit_rlvr.contracts.AnchorBatch`).

        Args:
            mini: this rank's mini-batch (None: none this step).
            parts: its micro-batches.
            aggregation: the policy loss's aggregation (its normaliser weights the micro-batches).
            anchor: this rank's anchor batch (None: none).
            anchors: its anchor micro-batches.
            anchor_level: the divergence level whose units weight the anchor micro-batches; None
                when the run has no anchor term (the same on every rank).
        """
        passes = len(parts) + len(anchors)
        filler = self.most(passes) - passes  # before any backward's collective
        own = aggregation_normaliser(mini.loss_tokens, aggregation) if mini is not None else 0.0
        den = self.reduce(own, "sum") / self.world
        loss_weights = [aggregation_weight(p.loss_tokens, den, aggregation) for p in parts]
        anchor_weights: list[float] = []
        if anchor_level is not None:
            units = float(divergence_units(anchor.loss_tokens, anchor_level).sum()) if anchor is not None else 0.0
            units = self.reduce(units, "sum") / self.world
            anchor_weights = [
                float(divergence_units(a.loss_tokens, anchor_level).sum()) / units if units > 0 else 0.0
                for a in anchors
            ]
        return StepPlan(loss_weights, anchor_weights, filler)


class Rows(Protocol):
    """Rows that a step plan weighs: their ``loss_tokens`` ``(b, T)``."""

    loss_tokens: Tensor
