"""Multi-turn behaviour as torchmetrics ``Metric``s: what tool-using trajectories do, and how diverse it stays.

Agents trained with RL are reported to collapse to single-turn answers after a few dozen steps
(VerlTool, arXiv 2509.01055; verl's text-to-SQL tutorial): a diversity collapse of behaviour, which
these track at validation (``val/<set>/turns``, …; docs/agents.md), as the module logs them for the
training rollouts (:func:`batch_behaviour`). Thin shells over :func:`~lit_rlvr.functional.metrics.behaviour_sums` and
:func:`~lit_rlvr.functional.metrics.distinct_tool_sequences`; all states are sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from lit_rlvr.functional.metrics import (
    BEHAVIOUR_SUMS,
    TURN_HISTOGRAM_BINS,
    behaviour_means,
    behaviour_sums,
    distinct_tool_sequences,
)
from lit_rlvr.metrics.diversity import _GroupMean


class TurnBehaviour(Metric):
    """Turns per trajectory (mean and histogram), tool calls, tool errors, environment failures, single-turn share.

    Args:
        max_turns: the loop's turn limit (the histogram's bins are 1 … max_turns, at most
            :data:`~lit_rlvr.functional.metrics.TURN_HISTOGRAM_BINS`: ``turns_16_plus`` counts the tail).

    Example:
        >>> metric = TurnBehaviour(max_turns=2)
        >>> metric.update(torch.tensor([1, 2]), torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([False, False]))
        >>> metric.update(torch.tensor([2, 2]), torch.tensor([1, 1]), torch.tensor([0, 0]), torch.tensor([False, True]))
        >>> {k: float(v) for k, v in metric.compute().items()}  # doctest: +NORMALIZE_WHITESPACE
        {'turns': 1.75, 'tool_calls': 0.75, 'tool_errors': 0.25, 'env_failed': 0.25, 'single_turn': 0.25,
         'turns_1': 0.25, 'turns_2': 0.75}
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, max_turns: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_turns = max_turns
        bins = min(max_turns, TURN_HISTOGRAM_BINS)
        self.add_state("sums", torch.zeros(len(BEHAVIOUR_SUMS) + bins, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, turns: Tensor, tool_calls: Tensor, tool_errors: Tensor, env_failed: Tensor) -> None:
        """Add B trajectories (each ``(B,)``: turns, tool calls, failed calls, environment failed)."""
        self.sums += behaviour_sums(turns, tool_calls, tool_errors, env_failed, self.max_turns).to(self.sums)

    def compute(self) -> dict[str, Tensor]:
        """Every value by name (:func:`~lit_rlvr.functional.metrics.behaviour_means`; NaN before any trajectory)."""
        return behaviour_means(self.sums)


class DistinctToolSequences(_GroupMean):
    """Mean number of distinct tool-call sequences per group.

    Example:
        >>> metric = DistinctToolSequences()
        >>> metric.update([[("a",), ("a",)], [(), ("b",)]])
        >>> metric.compute()
        tensor(1.5000, dtype=torch.float64)
    """

    higher_is_better = True

    def update(self, sequences: Sequence[Sequence[Sequence[str]]]) -> None:
        """Add P groups of tool-call sequences."""
        self._add(distinct_tool_sequences(sequences))


def batch_behaviour(
    behaviour: Sequence[Tensor], tool_sequences: Sequence[Sequence[Sequence[str]]], max_turns: int
) -> dict[str, Tensor]:
    """One batch's behaviour by name, the values :class:`TurnBehaviour` and :class:`DistinctToolSequences`
    report over a validation set (what the module logs as ``train/turns``, …, ``train/distinct_tool_sequences``).

    Args:
        behaviour: ``(turns, tool_calls, tool_errors, env_failed)``, each ``(B,)``.
        tool_sequences: P groups of n tool-call sequences.
        max_turns: the loop's turn limit.

    Returns:
        ``{name: float32 scalar}``.

    Example:
        >>> values = batch_behaviour((torch.tensor([1, 2]), torch.tensor([0, 1]), torch.tensor([0, 0]),
        ...                           torch.tensor([False, False])), [[(), ("a",)]], max_turns=2)
        >>> {k: float(v) for k, v in values.items()}  # doctest: +NORMALIZE_WHITESPACE
        {'turns': 1.5, 'tool_calls': 0.5, 'tool_errors': 0.0, 'env_failed': 0.0, 'single_turn': 0.5,
         'turns_1': 0.5, 'turns_2': 0.5, 'distinct_tool_sequences': 2.0}
    """
    values = behaviour_means(behaviour_sums(*behaviour, max_turns))
    values["distinct_tool_sequences"] = distinct_tool_sequences(tool_sequences).double().mean()
    return {k: v.float() for k, v in values.items()}
