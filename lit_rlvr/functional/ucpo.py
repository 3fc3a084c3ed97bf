"""UCPO's advantage: GRPO's, with each group's positive mass moved toward its least likely correct samples.

Lochab et al. 2026, "Uniform Correct Policy Optimization" (UCPO, arXiv 2605.00365); formulas and
departures in ``docs/methods.md`` §10. GRPO gives every correct sample of a group the same
advantage, but the policy gradient reinforces each in proportion to its probability, so the
likeliest correct answer gains most and the correct set collapses onto it. UCPO redistributes the
correct set's total advantage toward the samples the policy finds least likely (weight ∝ 1/q),
interpolated with GRPO's uniform weights by τ, keeping the total unchanged.

Registered in :data:`~lit_rlvr.functional.advantages.ADVANTAGES` as ``ucpo`` (this module is imported
by :mod:`lit_rlvr.functional`, which registers it; ``advantages.py`` is at the length limit).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlvr.functional.advantages import _check_binary, _grouped, _zscore, register_advantage

UCPO_STD_MODES = ("sample", "population")


def _check_ucpo(tau, std, eps) -> None:
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 <= tau <= 1.0:
        raise ValueError(f"ucpo: tau must be in [0, 1] (0 is GRPO, 0.2 in the paper's runs), got {tau!r}")
    if std not in UCPO_STD_MODES:
        raise ValueError(f"ucpo: std must be one of {UCPO_STD_MODES}; got {std!r}")
    if not eps >= 0:
        raise ValueError(f"ucpo: eps must be >= 0; got {eps}")


@register_advantage("ucpo", check=_check_ucpo, min_group_size=2, binary_rewards=True)
def ucpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    mean_logprobs: Tensor,
    tau: float = 0.2,
    std: str = "sample",
    eps: float = 1e-8,
) -> Tensor:
    """UCPO (Lochab et al. 2026, arXiv 2605.00365): GRPO, then inverse-likelihood weights on each correct set (docs/methods.md §10).

    Within a group, A_i = (r_i − mean_g)/(std_g + ε) is GRPO's advantage (the release's: sample std,
    ε = 1e-8). Where the group has n_c > 1 correct rows C, with ℓ_i the row's mean token log π_old,

        q_i = softmax_{j∈C}(ℓ_j)_i,   w_i = (1 − τ)/n_c + τ · (1/q̃_i) / Σ_{j∈C} 1/q̃_j,   q̃ = max(q, 1e-6)
        A_i ← A_base · n_c · w_i                                                          (i ∈ C)

    where A_base is GRPO's (shared) advantage of the correct rows: Σ_{i∈C} A_i is unchanged, τ = 0
    is GRPO and τ = 1 gives each correct row an advantage ∝ 1/q. Incorrect rows keep GRPO's.

    Equal (``tests/functional/test_ucpo.py``) to the authors' release (AnamikaLochab/UCPO 22a3b99,
    ``verl/verl/trainer/ppo/core_algos.py``, ``compute_dgrpo_advantage_outcome_invq_l``, estimator
    ``iq``) with ``alpha = 0``, the paper's runs (``scripts_c/run_ucpo_*.sh``: ``tau=0.2``,
    ``alpha=0.0``). Departures: the release's ``alpha`` (a penalty on the incorrect rows by their
    surprisal, 0 in the paper's runs) is not offered; a row whose ℓ is not finite (a NaN log-prob,
    passed as −inf) keeps GRPO's advantage and is left out of the redistribution (the release's
    softmax would give it q = 0, weight ∝ 10⁶, or NaN for the whole set), so the others share
    their own mass; float64 throughout.

    Args:
        rewards: ``(B,)`` binary rewards (0/1).
        group_ids: ``(B,)`` integer group of each row.
        mean_logprobs: ``(B,)`` mean token log π_old of each row's completion (the module passes it).
        tau: τ ∈ [0, 1], the share of the inverse-q weights (the release's name; 0.2 in the paper).
        std: ``"sample"`` (the release) or ``"population"``, GRPO's std.
        eps: added to GRPO's std (the release's 1e-8).

    Returns:
        ``(B,)`` float32 advantages.

    Raises:
        ValueError: non-binary rewards, a ``mean_logprobs`` of another shape, or a bad option.

    Example:
        >>> r = torch.tensor([1.0, 1.0, 1.0, 0.0])
        >>> ucpo(r, torch.zeros(4, dtype=torch.long), mean_logprobs=torch.tensor([-0.1, -0.5, -2.0, -1.0]), tau=0.5)
        tensor([ 0.3317,  0.3719,  0.7964, -1.5000])
    """
    _check_ucpo(tau, std, eps)
    groups = _grouped(rewards, group_ids)
    if mean_logprobs.shape != rewards.shape:
        raise ValueError(
            f"mean_logprobs must have the shape of rewards {tuple(rewards.shape)}; got {tuple(mean_logprobs.shape)}"
        )
    _check_binary(rewards, "ucpo")
    r, ell = rewards.double(), mean_logprobs.double().to(rewards.device)
    out = torch.zeros_like(r)
    for rows in groups.blocks():  # (P_n, n)
        base = _zscore(r[rows], std, eps)  # (P_n, n) GRPO
        correct = (r[rows] > 0) & ell[rows].isfinite()  # the rows redistributed
        n_c = correct.sum(1, keepdim=True).double()  # (P_n, 1)
        log_q = torch.log_softmax(torch.where(correct, ell[rows], -torch.inf), dim=1)
        inv_q = torch.where(correct, 1.0 / log_q.exp().clamp(min=1e-6), 0.0)
        target = inv_q / inv_q.sum(1, keepdim=True).clamp(min=1e-300)
        weight = (1.0 - tau) / n_c.clamp(min=1.0) + tau * target  # (P_n, n), sums to 1 over C
        a_base = (base * correct).sum(1, keepdim=True) / n_c.clamp(min=1.0)  # the correct rows' shared A
        redistribute = correct & (n_c > 1)
        out[rows] = torch.where(redistribute, a_base * n_c * weight, base)
    return out.float()
