"""``PassAtK``: the unbiased pass@k ladder (Chen et al. 2021, Eq. 1) as a torchmetrics ``Metric``.

The states are sums (per-prompt pass@k summed over prompts, and the prompt count), so
multi-process evaluation reduces by sum and the result equals a single-process run over all
prompts. Each prompt's estimate uses its own n, so updates with different n mix correctly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from lit_rlvr.functional.metrics import check_ks, correct_counts, per_prompt_pass_at_k


class PassAtK(Metric):
    """Mean over prompts of the unbiased pass@k, for every budget in ``k``.

    Args:
        k: budgets; each must be <= the samples per prompt of every update.
        **kwargs: forwarded to ``torchmetrics.Metric``.

    Example:
        >>> metric = PassAtK(k=(1, 2))
        >>> metric.update(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]))
        >>> metric.update(num_correct=torch.tensor([0]), n=2)  # counts: 0 of 2 correct
        >>> metric.compute()
        {'pass@1': tensor(0.2500, dtype=torch.float64), 'pass@2': tensor(0.4444, dtype=torch.float64)}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, k: Sequence[int] = (1, 2, 4, 8, 16), **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = check_ks(k, "PassAtK")
        self.add_state("pass_sum", torch.zeros(len(self.k), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_prompts", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(
        self, correct: Tensor | None = None, *, num_correct: Tensor | None = None, n: int | Tensor | None = None
    ) -> None:
        """Add P prompts: ``correct (P, n)`` bool/0-1, or ``num_correct (P,)`` with ``n`` (int or ``(P,)``)."""
        c, n_t = correct_counts(correct, num_correct=num_correct, n=n)
        self.pass_sum += per_prompt_pass_at_k(c, n_t, self.k).sum(0).to(self.pass_sum.device)
        self.num_prompts += c.numel()

    def compute(self) -> dict[str, Tensor]:
        """``{"pass@k": mean over prompts}`` for each budget (nan before any prompt)."""
        return {f"pass@{kj}": self.pass_sum[j] / self.num_prompts for j, kj in enumerate(self.k)}
