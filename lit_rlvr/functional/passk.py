"""Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", Eq. 1) and pass^k.

    pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{i = n−c+1}^{n} (1 − k / i)
    pass^k = C(c, k) / C(n, k)         = Π_{i < k} (c − i) / (n − i)

The product form (docs/methods.md §4.1) never forms a binomial, so it is stable for n up to thousands in
float64. pass@k is exactly 1 when n − c < k (every k-subset holds a correct sample). pass^k, the
chance that k samples drawn without replacement are all correct (Yao et al. 2024, τ-bench, arXiv
2406.12045; prime-rl's ``compute_pass_metrics``; docs/methods.md §4.5), is exactly 0 when c < k.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(n: Tensor, c: Tensor, k: Tensor, name: str = "pass@k") -> None:
    """Raise ``ValueError`` naming the first offending (n, c, k) triple."""
    bad = (k < 1) | (k > n) | (c > n) | (c < 0)
    if bad.any():
        n_b, c_b, k_b = torch.broadcast_tensors(n, c, k)
        i = bad.nonzero()[0].tolist() if bad.dim() else []
        nv, cv, kv = (int(t[tuple(i)]) for t in (n_b, c_b, k_b))
        raise ValueError(
            f"{name} needs 1 <= k <= n and 0 <= c <= n; got n={nv}, c={cv}, k={kv}"
            + (" (k > n: draw more samples or lower k)" if kv > nv else "")
        )


def _log_prod_table(n: int, k: float, device: torch.device) -> Tensor:
    """``table[c] = Σ_{i=n−c+1}^{n} log(1 − k/i)`` for c = 0..n, by one cumulative sum: (n+1,)."""
    i = torch.arange(n, 0, -1, dtype=torch.float64, device=device)  # n, n−1, …, 1
    terms = torch.log1p(-k / i)  # −inf or nan once i <= k: those c are set to 1 by the caller
    return torch.cat([torch.zeros(1, dtype=torch.float64, device=device), terms.cumsum(0)])


def _log_prod_grid(n: Tensor, c: Tensor, k: Tensor) -> Tensor:
    """The same sum for broadcast (n, c, k) of any shape, over a (…, max c) grid."""
    c_max = int(c.max().item()) if c.numel() else 0
    j = torch.arange(c_max, dtype=torch.float64, device=c.device)
    i = (n.unsqueeze(-1) - j).clamp(min=1.0)  # (..., c_max), i = n, n−1, …
    terms = torch.where(j < c.unsqueeze(-1), torch.log1p(-k.unsqueeze(-1) / i), 0.0)
    return terms.sum(-1)


def pass_at_k(n: int | Tensor, c: int | Tensor, k: int | Tensor) -> float | Tensor:
    """Unbiased estimate of the probability that at least one of k samples is correct.

    Args:
        n: samples drawn per problem (int or tensor, broadcasts with ``c`` and ``k``).
        c: correct samples among them.
        k: budget.

    Returns:
        A float if all inputs are ints, else a float64 tensor of the broadcast shape.

    Raises:
        ValueError: when k < 1, k > n, c > n or c < 0, naming the values.

    Example:
        >>> pass_at_k(4, 1, 2)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        0.5
        >>> pass_at_k(torch.tensor([10, 10]), torch.tensor([0, 9]), 2)
        tensor([0., 1.], dtype=torch.float64)
    """
    scalar = all(isinstance(x, int) for x in (n, c, k))
    n_t, c_t, k_t = (torch.as_tensor(x, dtype=torch.float64) for x in (n, c, k))
    _check(n_t, c_t, k_t)
    if n_t.dim() == 0 and k_t.dim() == 0:
        log_prod = _log_prod_table(int(n_t), float(k_t), c_t.device)[c_t.long()]  # fast path: one (n, k)
    else:
        log_prod = _log_prod_grid(*torch.broadcast_tensors(n_t, c_t, k_t))
    n_t, c_t, k_t = torch.broadcast_tensors(n_t, c_t, k_t)
    value = torch.where(n_t - c_t < k_t, torch.ones_like(log_prod), -torch.expm1(log_prod) + 0.0)  # +0: no -0.0
    return float(value) if scalar else value


def pass_hat_k(n: int | Tensor, c: int | Tensor, k: int | Tensor) -> float | Tensor:
    """Unbiased estimate of the probability that all of k samples are correct (pass^k).

    C(c, k)/C(n, k) = Π_{i<k} (c − i)/(n − i), the product of k ratios in (0, 1] in float64 (no
    binomial is formed, so nothing overflows); exactly 0 when c < k. At k = 1 it is c/n, pass@1. pass@k measures coverage (one of k
    right), pass^k consistency (k of k right): RL that sharpens the policy raises pass^k while pass@k
    falls (docs/methods.md §4.5).

    Args:
        n: samples drawn per problem (int or tensor, broadcasts with ``c`` and ``k``).
        c: correct samples among them.
        k: budget.

    Returns:
        A float if all inputs are ints, else a float64 tensor of the broadcast shape.

    Raises:
        ValueError: when k < 1, k > n, c > n or c < 0, naming the values.

    Example:
        >>> pass_hat_k(4, 3, 2)  # C(3,2)/C(4,2) = 3/6
        0.5
        >>> pass_hat_k(torch.tensor([10, 10, 10]), torch.tensor([1, 9, 10]), 2)
        tensor([0.0000, 0.8000, 1.0000], dtype=torch.float64)
    """
    scalar = all(isinstance(x, int) for x in (n, c, k))
    n_t, c_t, k_t = (torch.as_tensor(x, dtype=torch.float64) for x in (n, c, k))
    _check(n_t, c_t, k_t, "pass^k")
    n_t, c_t, k_t = torch.broadcast_tensors(n_t, c_t, k_t)
    i = torch.arange(int(k_t.max().item()) if k_t.numel() else 0, dtype=torch.float64, device=n_t.device)
    live = (i < k_t.unsqueeze(-1)) & (c_t >= k_t).unsqueeze(-1)  # (..., max k): the factors of the product
    ratios = (c_t.unsqueeze(-1) - i) / (n_t.unsqueeze(-1) - i).clamp(min=1.0)
    value = torch.where(live, ratios, 1.0).prod(-1) * (c_t >= k_t)  # 0 where c < k
    return float(value) if scalar else value
