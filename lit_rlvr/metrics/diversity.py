"""Diversity-collapse signals (docs/methods.md §4) as torchmetrics ``Metric``s.

RLVR tends to sharpen the policy onto few solutions (pass@1 up, pass@k down; DPH-RL arXiv
2509.07430, Pass@k Training arXiv 2508.10751). These track it directly: distinct final answers,
distinct correct answers and distinct completions per group, the share of zero-variance groups
(which carry no group-normalised learning signal), and mean token entropy. All states are sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from lit_rlvr.functional.metrics import (
    Answers,
    distinct_answers,
    distinct_completions,
    distinct_correct_answers,
    masked_entropy_sum,
    zero_variance_groups,
)


class _GroupMean(Metric):
    """Mean of a per-group count: states are the sum of the counts and the number of groups."""

    is_differentiable = False
    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_groups", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def _add(self, per_group: Tensor) -> None:
        self.total += per_group.sum().to(self.total)
        self.num_groups += per_group.numel()

    def compute(self) -> Tensor:
        """Mean over all groups seen (nan before any group)."""
        return self.total / self.num_groups


class DistinctAnswers(_GroupMean):
    """Mean number of distinct final answers per group (``None`` = no answer is not counted).

    Example:
        >>> metric = DistinctAnswers()
        >>> metric.update([["1", "2", "2"], ["5", None, None]])
        >>> metric.compute()
        tensor(1.5000, dtype=torch.float64)
    """

    higher_is_better = True

    def update(self, answers: Answers) -> None:
        """Add P groups of answer keys."""
        self._add(distinct_answers(answers))


class DistinctCorrectAnswers(_GroupMean):
    """Mean number of distinct final answers among each group's correct samples.

    Example:
        >>> metric = DistinctCorrectAnswers()
        >>> metric.update([["a", "b", "c"], ["d", "d", "e"]], torch.tensor([[1, 1, 0], [1, 1, 0]]))
        >>> metric.compute()
        tensor(1.5000, dtype=torch.float64)
    """

    higher_is_better = True

    def update(self, answers: Answers, correct: Tensor) -> None:
        """Add P groups: ``answers`` P lists of n keys, ``correct (P, n)`` bool or 0/1."""
        self._add(distinct_correct_answers(answers, correct))


class DistinctCompletions(_GroupMean):
    """Mean number of distinct completion texts (exact match) per group.

    Example:
        >>> metric = DistinctCompletions()
        >>> metric.update([["x = 1", "x = 1"], ["y", "z"]])
        >>> metric.compute()
        tensor(1.5000, dtype=torch.float64)
    """

    higher_is_better = True

    def update(self, completions: Sequence[Sequence[str]]) -> None:
        """Add P groups of completion texts."""
        self._add(distinct_completions(completions))


class ZeroVarianceShare(_GroupMean):
    """Share of groups whose rewards are all equal (no group-normalised advantage signal).

    Example:
        >>> metric = ZeroVarianceShare()
        >>> metric.update(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]))
        >>> metric.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    higher_is_better = False

    def update(self, rewards: Tensor, group_ids: Tensor) -> None:
        """Add a batch: ``rewards (B,)``, ``group_ids (B,)`` (ids local to this batch)."""
        self._add(zero_variance_groups(rewards, group_ids))


class MeanTokenEntropy(Metric):
    """Mean per-token entropy over all real completion tokens (token-weighted across batches).

    Example:
        >>> metric = MeanTokenEntropy()
        >>> metric.update(torch.tensor([[0.5, 1.5, 0.0]]), torch.tensor([[1, 1, 0]]))
        >>> metric.update(torch.tensor([[4.0, 0.0, 0.0]]), torch.tensor([[1, 0, 0]]))
        >>> metric.compute()
        tensor(2., dtype=torch.float64)
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("entropy_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_tokens", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, entropy: Tensor, loss_tokens: Tensor) -> None:
        """Add a batch: ``entropy (B, T)``, ``loss_tokens (B, T)`` (:func:`~lit_rlvr.functional.metrics.masked_entropy_sum`)."""
        total, count = masked_entropy_sum(entropy, loss_tokens)
        self.entropy_sum += total.to(self.entropy_sum)
        self.num_tokens += count.to(self.num_tokens)

    def compute(self) -> Tensor:
        """Token-weighted mean entropy (nan before any token)."""
        return self.entropy_sum / self.num_tokens
