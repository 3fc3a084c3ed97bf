"""``PassAtK``: the unbiased pass@k (Chen et al. 2021, Eq. 1) as a torchmetrics ``Metric``, and
``PassHatK``: pass^k, the chance that k samples are all correct (docs/methods.md §4.5), the same shell.

Two forms, following torchmetrics' conventions: ``PassAtK(k=16)`` (an int) computes one scalar
tensor, so ``self.log("val/pass@16", metric)`` logs the metric object itself; ``PassAtK(k=(1, 4,
16))`` computes the ladder ``{"pass@1": ..., "pass@4": ..., "pass@16": ...}`` for ``log_dict``.
:meth:`PassAtK.plot` draws the ladder as pass@k against k.

The states are sums (per-prompt pass@k summed over prompts, and the prompt count), so
multi-process evaluation reduces by sum and the result equals a single-process run over all
prompts. Each prompt's estimate uses its own n, so updates with different n mix correctly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.plot import _AX_TYPE, _PLOT_OUT_TYPE, _error_on_missing_matplotlib

from lit_rlvr.functional.metrics import (
    check_ks,
    correct_counts,
    per_prompt_pass_at_k,
    per_prompt_pass_hat_k,
    valid_pass_at_k_sums,
)

Ladder = dict[str, Tensor]


class PassAtK(Metric):
    """Mean over prompts of the unbiased pass@k, for one budget or a ladder of budgets.

    Args:
        k: one budget (an int: ``compute()`` returns a scalar tensor) or a sequence of budgets
            (``compute()`` returns ``{"pass@k": tensor}``); each must be <= the samples per
            prompt of every update.
        **kwargs: forwarded to ``torchmetrics.Metric``.

    Example:
        >>> metric = PassAtK(k=(1, 2))
        >>> metric.update(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]))
        >>> metric.update(num_correct=torch.tensor([0]), n=2)  # counts: 0 of 2 correct
        >>> metric.compute()
        {'pass@1': tensor(0.2500, dtype=torch.float64), 'pass@2': tensor(0.4444, dtype=torch.float64)}
        >>> scalar = PassAtK(k=2)
        >>> scalar.update(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]))
        >>> scalar.compute()
        tensor(0.6667, dtype=torch.float64)
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    prefix = "pass@"  # the ladder's keys: pass@k
    per_prompt = staticmethod(per_prompt_pass_at_k)  # (num_correct (P,), n (P,), ks) -> (P, K)

    def __init__(self, k: int | Sequence[int] = (1, 2, 4, 8, 16), **kwargs) -> None:
        super().__init__(**kwargs)
        self.scalar = isinstance(k, int)  # bools are ints too: check_ks rejects them
        self.k = check_ks((k,) if self.scalar else k, type(self).__name__)
        self.add_state("pass_sum", torch.zeros(len(self.k), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_prompts", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("k_prompts", torch.zeros(len(self.k), dtype=torch.float64), dist_reduce_fx="sum")

    def update(
        self,
        correct: Tensor | None = None,
        *,
        num_correct: Tensor | None = None,
        n: int | Tensor | None = None,
        valid: Tensor | None = None,
    ) -> None:
        """Add P prompts: ``correct (P, n)`` bool/0-1, or ``num_correct (P,)`` with ``n`` (int or ``(P,)``).

        With ``valid`` (``(P, n)`` bool, with ``correct``) only the valid samples count (a trajectory whose
        environment failed is left out): a prompt enters budget k's mean when it has at least k of them
        (:func:`~lit_rlvr.functional.metrics.valid_pass_at_k_sums`).
        """
        if valid is not None:
            if correct is None:
                raise ValueError(f"{type(self).__name__}.update: `valid` needs `correct` (P, n)")
            sums, prompts = valid_pass_at_k_sums(correct, valid.to(correct.device), self.k, self.per_prompt)
            self.pass_sum += sums.to(self.pass_sum.device)
            self.k_prompts += prompts.to(self.k_prompts.device)
            self.num_prompts += float(valid.any(1).sum())  # prompts with a valid sample
            return
        c, n_t = correct_counts(correct, num_correct=num_correct, n=n)
        self.pass_sum += self.per_prompt(c, n_t, self.k).sum(0).to(self.pass_sum.device)
        self.num_prompts += c.numel()
        self.k_prompts += c.numel()

    def compute(self) -> Tensor | Ladder:
        """Mean over prompts (nan before any prompt): a scalar for an int ``k``, else ``{"pass@k": ...}``
        (``{"pass^k": ...}`` for :class:`PassHatK`)."""
        mean = self.pass_sum / self.k_prompts  # (len(k),): each budget over the prompts it counted
        if self.scalar:
            return mean[0]
        return {f"{self.prefix}{kj}": mean[j] for j, kj in enumerate(self.k)}

    def plot(
        self, val: Tensor | Ladder | Sequence[Tensor] | Sequence[Ladder] | None = None, ax: _AX_TYPE | None = None
    ) -> _PLOT_OUT_TYPE:
        """Plot the metric with matplotlib (torchmetrics' ``Metric.plot`` API).

        The ladder form draws pass@k against k on a log2 axis, one curve per ladder in ``val``
        (e.g. one per checkpoint, labelled by position); the scalar form draws torchmetrics'
        single value, or a list of values as a series over steps.

        Args:
            val: a result of :meth:`compute` or ``forward``, or a list of them; None plots
                :meth:`compute`.
            ax: a matplotlib axis to draw on; None creates a figure.

        Returns:
            ``(figure, axis)``; the figure is None when ``ax`` was given.

        Example:
            >>> metric = PassAtK(k=(1, 2, 4))
            >>> metric.update(torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]]))
            >>> fig, ax = metric.plot()
            >>> line = ax.lines[0]
            >>> line.get_xdata().tolist(), line.get_ydata().round(3).tolist(), ax.get_xscale()
            ([1, 2, 4], [0.125, 0.25, 0.5], 'log')
        """
        if self.scalar:
            return self._plot(val, ax)
        return plot_pass_at_k(self.compute() if val is None else val, ax)


class PassHatK(PassAtK):
    """Mean over prompts of pass^k = C(c, k)/C(n, k), the chance that k samples are all correct
    (τ-bench, arXiv 2406.12045; prime-rl's eval metric; docs/methods.md §4.5), for one budget or a
    ladder: :class:`PassAtK`'s shell (sum states, ``valid`` samples, ``plot``) over
    :func:`~lit_rlvr.functional.metrics.per_prompt_pass_hat_k`, with keys ``pass^k``.

    Example:
        >>> metric = PassHatK(k=(1, 2))
        >>> metric.update(torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]))
        >>> metric.compute()
        {'pass^1': tensor(0.5000, dtype=torch.float64), 'pass^2': tensor(0.2500, dtype=torch.float64)}
    """

    prefix = "pass^"
    per_prompt = staticmethod(per_prompt_pass_hat_k)


def plot_pass_at_k(val: Ladder | Sequence[Ladder], ax: _AX_TYPE | None = None) -> _PLOT_OUT_TYPE:
    """pass@k (or pass^k) against k (log2 x axis, y in [0, 1]) for one ladder or a list of ladders.

    Args:
        val: ``{"pass@k": tensor}`` (as :meth:`PassAtK.compute` returns, or ``{"pass^k": …}``), or a list of them,
            each drawn as its own curve labelled by its position.
        ax: a matplotlib axis to draw on; None creates a figure.

    Returns:
        ``(figure, axis)``; the figure is None when ``ax`` was given.
    """
    _error_on_missing_matplotlib()
    import matplotlib.pyplot as plt

    ladders = [val] if isinstance(val, dict) else list(val)
    if not ladders or not all(isinstance(v, dict) and v for v in ladders):
        raise ValueError(
            f"PassAtK.plot: val must be a non-empty {{'pass@k': tensor}} dict or a list of them, got {val!r:.200}"
        )
    fig, ax = plt.subplots() if ax is None else (None, ax)
    budgets: set[int] = set()
    for i, ladder in enumerate(ladders):
        ks = [_budget(key) for key in ladder]
        budgets.update(ks)
        values = [float(v) for v in ladder.values()]
        ax.plot(ks, values, marker="o", linestyle="-", label=str(i) if len(ladders) > 1 else None)
    ax.set_xscale("log", base=2)
    ticks = sorted(budgets)
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.minorticks_off()
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("k (samples per prompt)")
    ax.set_ylabel(next(iter(ladders[0]))[:5] + "k")  # pass@k or pass^k
    ax.grid(True)
    if len(ladders) > 1:
        ax.legend()
    return fig, ax


def _budget(key: str) -> int:
    """``"pass@16"`` (or ``"pass^16"``) → 16, with an error naming the key otherwise."""
    k = key[5:]
    if key[:5] not in ("pass@", "pass^") or not k.isdigit():
        raise ValueError(f"PassAtK.plot: expected keys like 'pass@16' or 'pass^16', got {key!r}")
    return int(k)
