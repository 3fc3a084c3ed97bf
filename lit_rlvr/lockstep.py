"""Data-parallel ranks in lock step: the same optimizer steps and passes, and weights that make each step the global batch's.

Under DDP and FSDP2 every backward (and every FSDP forward) is a collective, so a rank with fewer
micro-batches or optimizer steps than another would leave that one waiting forever; and the
ranks' gradients are averaged, so a micro-batch's loss must be weighted by its normaliser over
the *ranks' mean* normaliser for the averaged gradient to be the global batch's however unevenly
its tokens (or rows) fall on the ranks (docs/methods.md §5). :class:`Lockstep` is the one place
that talks to the other ranks about this; with one process every reduction is the value itself.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    Args:
        trainer: the Lightning Trainer (None: a single process).
        device: where the reduced scalars live (the module's device).
    """

    def __init__(self, trainer=None, device: torch.device | str = "cpu"):
        self.trainer = trainer
        self.device = device

    @property
    def world(self) -> int:
        return 1 if self.trainer is None else self.trainer.world_size

    def reduce(self, value: float, op: str) -> float:
        """``value`` reduced over the ranks (``"sum"`` or ``"max"``); ``value`` itself in one process."""
        if self.world == 1:
            return float(value)
        return float(self.trainer.strategy.reduce(torch.tensor(float(value), device=self.device), reduce_op=op))

    def most(self, passes: int) -> int:
        """The number of passes every rank runs when this rank has ``passes``: the most any rank has."""
        return int(self.reduce(passes, "max"))

    def optimizer_steps(self, rows: int, mini_batch_size: int | None) -> int:
        """Optimizer steps per PPO epoch on every rank: the most any rank's ``rows`` split into
        mini-batches gives (0 when no rank has a row to learn from)."""
        return self.most(len(split_indices(rows, mini_batch_size)) if rows else 0)

    def plan(
        self,
        mini_mask: Tensor | None,
        part_masks: list[Tensor],
        aggregation: str,
        anchor_mask: Tensor | None = None,
        anchor_masks: list[Tensor] = (),
        anchor_level: str | None = None,
    ) -> StepPlan:
        """Weights and filler passes of one optimizer step (collectives: every rank calls it, in step).

        Args:
            mini_mask: ``(b, T)`` response mask of this rank's mini-batch (None: none this step).
            part_masks: the masks of its micro-batches.
            aggregation: the policy loss's aggregation (its normaliser weights the micro-batches).
            anchor_mask: ``(A, T)`` response mask of this rank's anchor batch (None: none).
            anchor_masks: the masks of its anchor micro-batches.
            anchor_level: the divergence level whose units weight the anchor micro-batches; None
                when the run has no anchor term (the same on every rank).
        """
        passes = len(part_masks) + len(anchor_masks)
        filler = self.most(passes) - passes  # before any backward's collective
        own = aggregation_normaliser(mini_mask, aggregation) if mini_mask is not None else 0.0
        den = self.reduce(own, "sum") / self.world
        loss_weights = [aggregation_weight(m, den, aggregation) for m in part_masks]
        anchor_weights: list[float] = []
        if anchor_level is not None:
            units = float(divergence_units(anchor_mask, anchor_level).sum()) if anchor_mask is not None else 0.0
            units = self.reduce(units, "sum") / self.world
            anchor_weights = [float(divergence_units(m, anchor_level).sum()) / units if units > 0 else 0.0 for m in anchor_masks]
        return StepPlan(loss_weights, anchor_weights, filler)
