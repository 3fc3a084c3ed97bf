"""Clip-Cov and KL-Cov: restrain the few tokens whose log-prob/advantage covariance drives entropy down.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
(arXiv 2505.22617). Under policy-gradient updates the entropy of the policy falls by roughly the
covariance between a token's log-probability and its advantage (the paper's entropy dynamics); a
small share of tokens with a large centred product

    Cov_t = (A_t − mean A) · (log π(y_t) − mean log π)          (means over the batch's real tokens)

carries most of it. The paper restrains those tokens in two ways, here two entries of
:data:`~lit_rlvr.functional.losses.POLICY_LOSSES` (formulas as in the authors' released code):

- ``clip_cov`` ("Clip-Cov"): draw, uniformly without replacement, ⌊clip_cov_ratio · N⌋ (at
  least 1) of the tokens with clip_cov_lb < Cov_t < clip_cov_ub that the PPO clip does not already
  cover, and detach them: their loss (and gradient) is 0; every other token keeps the clipped
  surrogate.
- ``kl_cov`` ("KL-Cov"): the ⌊kl_cov_ratio · N⌋ (at least 1) tokens of largest Cov_t get
  ppo_kl_coef · |log π_θ − log π_old| added to the *unclipped* surrogate −ρ_t·A; the others get
  −ρ_t·A. KL-Cov does not clip, so it refuses ``dual_clip`` (and ignores ``clip_low``/``clip_high``).

N is the number of real tokens in the batch the selection sees. Options are named as in verl
(``clip_cov_ratio``, ``clip_cov_lb``, ``clip_cov_ub``, ``kl_cov_ratio``, ``ppo_kl_coef``) with
verl's defaults; the paper's 7B recipes use Clip-Cov with clip_cov_ratio 2e-4, bounds (1, 5) and
``clip_low = clip_high = 1`` (the covariance clip replaces PPO's), and KL-Cov with kl_cov_ratio
2e-3, ppo_kl_coef 1.

Compared with verl's ``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov``
(``verl/trainer/ppo/core_algos.py`` at verl-project/verl 1dda039b, the same code as the authors'
PRIME-RL release except that the authors' ``k_percent`` is a percentage and verl's ``kl_cov_ratio``
a fraction): on the same inputs the losses agree to float rounding (``tests/functional/
test_covariance.py`` holds verl's outputs). Where this departs, and why:

- **Which batch.** verl selects within each micro-batch it is given, on the current log-probs.
  :class:`~lit_rlvr.module.RLVRModule` selects once per rollout batch (each process's rows), on
  the trainer's log-probs of π_θ at the start of the step, and the selection then travels with the
  rows through mini- and micro-batches, so micro-batching does not change the update
  (docs/methods.md §5). With one optimizer step per rollout batch and no micro-batches this is
  verl's selection; with several, later optimizer steps keep the first one's. Called alone,
  :func:`~lit_rlvr.functional.losses.policy_loss` selects within the batch it gets, as verl.
- **Ties and the draw.** KL-Cov's top tokens are taken by a stable sort (ties go to the earlier
  token in row-major order; ``torch.topk``'s order is unspecified). Clip-Cov's draw uses the
  module's seeded generator (saved in checkpoints) instead of torch's global one.
- **Clamp.** ρ_t is exp of the log-ratio clamped to ±20 and padding holds 0 (docs/methods.md
  §1.1); verl does not clamp, which only differs for tokens whose ratio overflows anyway.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlvr.functional.losses import register_policy_loss, vanilla


def _check_ratio(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be a share of the batch's tokens in (0, 1], got {value!r}")


def _check_clip_cov(clip_cov_ratio, clip_cov_lb, clip_cov_ub) -> None:
    _check_ratio(clip_cov_ratio, "clip_cov_ratio")
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"clip_cov_lb ({clip_cov_lb}) must be below clip_cov_ub ({clip_cov_ub})")


def _check_kl_cov(kl_cov_ratio, ppo_kl_coef) -> None:
    _check_ratio(kl_cov_ratio, "kl_cov_ratio")
    if not ppo_kl_coef > 0:
        raise ValueError(f"ppo_kl_coef must be > 0, got {ppo_kl_coef!r}")


def token_covariance(logprobs: Tensor, advantages: Tensor, loss_tokens: Tensor) -> Tensor:
    """``(B, T)`` centred products (A_t − mean A)(log π_t − mean log π), means over real tokens.

    Padding holds −inf (never selected).

    Example:
        >>> lp = torch.tensor([[-1.0, -3.0, 0.0]])
        >>> token_covariance(lp, torch.tensor([[1.0, -1.0, 5.0]]), torch.tensor([[1, 1, 0]]))
        tensor([[1., 1., -inf]])
    """
    mask = loss_tokens.bool()
    n = mask.sum().clamp(min=1)
    lp = torch.where(mask, logprobs, 0.0)
    adv = torch.where(mask, advantages, 0.0)
    cov = (adv - adv.sum() / n) * (lp - lp.sum() / n)
    return torch.where(mask, cov, float("-inf"))


def clip_cov_select(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_tokens: Tensor,
    *,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    clip_low: float,
    clip_high: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Clip-Cov's detached tokens: a uniform draw of ⌊ratio·N⌋ (≥ 1) tokens with lb < Cov_t < ub.

    Tokens whose clipped branch is active (the PPO clip already cuts their gradient) are not
    candidates, as in the release.

    Args:
        logprobs: ``(B, T)`` log π_θ (detached) of the tokens.
        old_logprobs: ``(B, T)`` log π_old (the ratio decides which tokens are clipped already).
        advantages: ``(B, T)`` per-token advantages.
        loss_tokens: ``(B, T)`` the tokens the loss reads (``StepData.loss_tokens``).
        clip_cov_ratio: share of the batch's tokens to detach.
        clip_cov_lb, clip_cov_ub: the open band of Cov_t a candidate must fall in.
        clip_low, clip_high: the clip bounds of the surrogate (injected).
        generator: randomness of the draw (None: torch's global generator).

    Returns:
        ``(B, T)`` bool, the detached tokens.

    Example:
        >>> lp = torch.tensor([[-0.2, -3.0, -0.5, -2.5]])
        >>> adv = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
        >>> clip_cov_select(lp, lp, adv, torch.ones(1, 4), clip_cov_ratio=0.5, clip_low=0.2, clip_high=0.2,
        ...                 generator=torch.Generator().manual_seed(0)).sum().item()  # 4 candidates, 2 drawn
        2
    """
    mask = loss_tokens.bool()
    log_ratio = torch.where(mask, logprobs - old_logprobs, 0.0).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high) > -advantages * ratio  # (B, T)
    cov = token_covariance(logprobs, advantages, mask)
    candidates = ((cov > clip_cov_lb) & (cov < clip_cov_ub) & mask & ~clipped).nonzero()  # (K, 2) row-major
    n = max(int(clip_cov_ratio * int(mask.sum())), 1)
    order = torch.randperm(
        len(candidates), generator=generator, device=generator.device if generator is not None else "cpu"
    )
    chosen = candidates[order[:n].to(candidates.device)]
    selected = torch.zeros_like(mask)
    selected[chosen[:, 0], chosen[:, 1]] = True
    return selected


@register_policy_loss("clip_cov", select=clip_cov_select, check=_check_clip_cov)
def clip_cov(
    log_ratio: Tensor,
    advantages: Tensor,
    selected: Tensor | None,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> Tensor:
    """Clip-Cov's per-token loss: the clipped surrogate, 0 (no gradient) on the ``selected`` tokens.

    Example:
        >>> clip_cov(torch.zeros(1, 2), torch.tensor([[1.0, 1.0]]), torch.tensor([[True, False]]), clip_low=0.2, clip_high=0.2)
        tensor([[ 0., -1.]])
    """
    loss_t = vanilla(log_ratio, advantages, None, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    return torch.where(selected, 0.0, loss_t) if selected is not None else loss_t


def kl_cov_select(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_tokens: Tensor, *, kl_cov_ratio: float = 0.0002
) -> Tensor:
    """KL-Cov's penalised tokens: the ⌊kl_cov_ratio·N⌋ (≥ 1) real tokens of largest Cov_t.

    Args:
        logprobs: ``(B, T)`` log π_θ (detached) of the tokens.
        old_logprobs: unused (the selection depends on π_θ and A only).
        advantages: ``(B, T)`` per-token advantages.
        loss_tokens: ``(B, T)`` the tokens the loss reads (``StepData.loss_tokens``).
        kl_cov_ratio: share of the batch's tokens to penalise.

    Returns:
        ``(B, T)`` bool (all False for a batch without tokens).

    Example:
        >>> lp = torch.tensor([[-0.1, -2.0, -0.3, -1.0]])
        >>> kl_cov_select(lp, lp, torch.tensor([[1.0, -1.0, 1.0, -1.0]]), torch.ones(1, 4), kl_cov_ratio=0.5)
        tensor([[ True,  True, False, False]])
    """
    mask = loss_tokens.bool()
    selected = torch.zeros_like(mask)
    n_tokens = int(mask.sum())
    if not n_tokens:
        return selected
    cov = token_covariance(logprobs, advantages, mask).flatten()  # −inf on padding
    top = torch.argsort(cov, descending=True, stable=True)[: max(1, int(n_tokens * kl_cov_ratio))]
    selected.view(-1)[top] = True
    return selected


@register_policy_loss("kl_cov", select=kl_cov_select, check=_check_kl_cov)
def kl_cov(log_ratio: Tensor, advantages: Tensor, selected: Tensor | None, *, ppo_kl_coef: float = 1.0) -> Tensor:
    """KL-Cov's per-token loss: −ρ_t·A (unclipped), plus ppo_kl_coef·|log ρ_t| on the ``selected`` tokens.

    Example:
        >>> kl_cov(torch.log(torch.tensor([[2.0, 2.0]])), torch.tensor([[1.0, 1.0]]), torch.tensor([[True, False]]))
        tensor([[-1.3069, -2.0000]])
    """
    loss_t = -advantages * torch.exp(log_ratio)
    if selected is None:
        return loss_t
    return loss_t + ppo_kl_coef * log_ratio.abs() * selected
