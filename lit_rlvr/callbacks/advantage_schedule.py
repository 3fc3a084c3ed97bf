"""AdvantageSchedule: switch the advantage estimator at given optimizer steps.

Pass@k Training's strongest recipe trains with the Pass@k advantage first and then with Pass@1
("P@k T. + P@1 T.", arXiv 2508.10751 §4): a schedule of registry names, not a new trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightning import Callback, LightningModule, Trainer
from typing_extensions import override

from lit_rlvr.contracts import AdvantageHost, require


@dataclass
class Phase:
    """From optimizer step ``start_step`` on, use ``advantage`` with ``options``."""

    start_step: int
    advantage: str
    options: dict[str, Any] = field(default_factory=dict)


class AdvantageSchedule(Callback):
    """Sets ``pl_module``'s advantage estimator to the phase that covers the current global step.

    Args:
        phases: phases sorted by ``start_step``; the first must start at 0.

    Example:
        >>> AdvantageSchedule([Phase(0, "passk", {"k": 4}), Phase(200, "grpo")]).phase_at(250).advantage
        'grpo'
    """

    def __init__(self, phases: list[Phase]):
        if not phases or phases[0].start_step != 0:
            raise ValueError(f"AdvantageSchedule.phases must start at step 0, got {phases}")
        starts = [p.start_step for p in phases]
        if starts != sorted(set(starts)):
            raise ValueError(f"AdvantageSchedule.phases: start steps must be strictly increasing, got {starts}")
        self.phases = phases

    def phase_at(self, step: int) -> Phase:
        return [p for p in self.phases if p.start_step <= step][-1]

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        require(pl_module, AdvantageHost, "AdvantageSchedule")
        for phase in self.phases:  # fail at start-up, not when a phase begins
            pl_module.set_advantage(phase.advantage, phase.options)
        self._apply(pl_module, 0)

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._apply(pl_module, trainer.global_step)

    def _apply(self, pl_module: LightningModule, step: int) -> None:
        phase = self.phase_at(step)
        if pl_module.advantage_name != phase.advantage or pl_module.advantage_options != phase.options:
            pl_module.set_advantage(phase.advantage, phase.options)
