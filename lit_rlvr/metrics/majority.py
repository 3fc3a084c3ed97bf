"""``MajorityAtK``: majority vote over final answers (self-consistency, Wang et al. 2023,
arXiv 2203.11171) as a torchmetrics ``Metric``.

maj@k uses the first k samples of each prompt: they are i.i.d., so this is an unbiased estimate
of the majority-vote accuracy with k samples. Answers are canonical keys computed with the
reward's own equivalence before they reach the metric.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from lit_rlvr.functional.metrics import Answers, check_ks, per_prompt_majority_at_k


class MajorityAtK(Metric):
    """Mean over prompts of maj@k, for every budget in ``k``.

    Votes go to answer keys; ``None`` (no answer) never wins unless all k samples are ``None``
    (then incorrect); ties go to the answer seen first; the winner is correct if its first sample
    is. See :func:`lit_rlvr.functional.metrics.per_prompt_majority_at_k`.

    Args:
        k: budgets; each must be <= the samples per prompt.
        **kwargs: forwarded to ``torchmetrics.Metric``.

    Example:
        >>> metric = MajorityAtK(k=(1, 3))
        >>> metric.update([["12", "10", "10"], [None, "4", None]], torch.tensor([[1, 0, 0], [0, 1, 0]]))
        >>> metric.compute()
        {'maj@1': tensor(0.5000, dtype=torch.float64), 'maj@3': tensor(0.5000, dtype=torch.float64)}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, k: Sequence[int] = (1, 4, 8, 16), **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = check_ks(k, "MajorityAtK")
        self.add_state("maj_sum", torch.zeros(len(self.k), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_prompts", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, answers: Answers, correct: Tensor) -> None:
        """Add P prompts: ``answers`` P lists of n keys (``None`` = no answer), ``correct (P, n)``."""
        self.maj_sum += per_prompt_majority_at_k(answers, correct, self.k).sum(0).to(self.maj_sum.device)
        self.num_prompts += len(answers)

    def compute(self) -> dict[str, Tensor]:
        """``{"maj@k": mean over prompts}`` for each budget (nan before any prompt)."""
        return {f"maj@{kj}": self.maj_sum[j] / self.num_prompts for j, kj in enumerate(self.k)}
