"""f-divergence generators and the DPH-RL preservation loss (docs/methods.md §2).

DPH-RL (Li et al. 2025, "The Choice of Divergence: A Neglected Key to Mitigating Diversity
Collapse in Reinforcement Learning with Verifiable Reward", arXiv 2509.07430) adds
η · D_f(π_θ‖π_ref) = η · E_{y∼π_ref}[f(π_θ(y)/π_ref(y))] estimated on stored π_ref samples.
Each generator here takes the log-ratio x = log π_θ − log π_ref and returns f(eˣ), written in x
(``expm1``, ``softplus``) so that values and gradients stay accurate near u = 1 and finite for
|x| up to the clamp (20 by default).

Where this departs from the released reference code, and why:

- ``js`` is the standard Jensen–Shannon generator ½[u log u − (u+1) log((u+1)/2)]; the
  reference code's JS is 2× ours, so its η is half of ours for the same effect.
- ``forward_kl`` is u − log u − 1 (the same expectation under π_ref as −log u, since E[u] = 1,
  with lower variance and a gradient that vanishes at u = 1). The release computes the same
  form (verl's ``low_var_kl`` with its arguments swapped), so this is *not* a departure.
- The release caps each per-token value at 10 (zero gradient beyond). That is the real
  departure: uncapped is the exact divergence and our default; ``value_cap=10.0`` in
  :func:`f_divergence` (``model.divergence_value_cap``) reproduces the released setups exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_rlvr.functional.losses import aggregate, cap_value
from lit_rlvr.registry import Registry

DIVERGENCES = Registry("f-divergence")
register_divergence = DIVERGENCES.register
DIVERGENCE_LEVELS = Registry("divergence level")

LOG2 = math.log(2.0)


@register_divergence("forward_kl")
def forward_kl(log_ratio: Tensor) -> Tensor:
    """f(u) = u − log u − 1: E_{π_ref}[f] = KL(π_ref‖π_θ) (DPH-F); ∂f/∂x = u − 1.

    Example:
        >>> forward_kl(torch.tensor([0.0, math.log(2.0)]))
        tensor([0.0000, 0.3069])
    """
    return torch.expm1(log_ratio) - log_ratio


@register_divergence("reverse_kl")
def reverse_kl(log_ratio: Tensor) -> Tensor:
    """f(u) = u log u − u + 1: E_{π_ref}[f] = KL(π_θ‖π_ref); ∂f/∂x = u log u.

    Example:
        >>> reverse_kl(torch.tensor([0.0, math.log(2.0)]))
        tensor([0.0000, 0.3863])
    """
    return log_ratio * torch.exp(log_ratio) - torch.expm1(log_ratio)


@register_divergence("js")
def js(log_ratio: Tensor) -> Tensor:
    """f(u) = ½[u log u − (u+1) log((u+1)/2)]: Jensen–Shannon (DPH-JS); ∂f/∂x = ½ u log(2u/(u+1)).

    This is the standard JS, ½[KL(π_θ‖m) + KL(π_ref‖m)] with m the mixture, bounded by log 2.
    The released reference code's JS is 2× this, so its η is half of ours for the same effect.
    Written as ½[u (log 2 − softplus(−x)) + log 2 − softplus(x)] so no two large terms cancel.

    Example:
        >>> js(torch.tensor([0.0, -50.0]))  # f(1) = 0; f(u) → ½ log 2 as u → 0
        tensor([0.0000, 0.3466])
    """
    u = torch.exp(log_ratio)
    return 0.5 * (u * (LOG2 - F.softplus(-log_ratio)) + LOG2 - F.softplus(log_ratio))


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha-divergence needs alpha in (0, 1), got {alpha}")


@register_divergence("alpha", check=_check_alpha)
def alpha(log_ratio: Tensor, *, alpha: float = 0.5) -> Tensor:
    """f(u) = (u^{1−α} − (1−α)u − α) / (α(α−1)): the α-divergence; ∂f/∂x = (u − u^{1−α})/α.

    α → 1 gives ``forward_kl``, α → 0 gives ``reverse_kl``; α = 0.5 is 2× ``hellinger``.

    Args:
        log_ratio: x = log π_θ − log π_ref, any shape.
        alpha: α in the open interval (0, 1).

    Example:
        >>> alpha(torch.tensor([0.0, math.log(4.0)]), alpha=0.5)  # 2 (√4 − 1)²
        tensor([0., 2.])
    """
    _check_alpha(alpha)
    num = (1.0 - alpha) * torch.expm1(log_ratio) - torch.expm1((1.0 - alpha) * log_ratio)
    return num / (alpha * (1.0 - alpha))


@register_divergence("tv")
def tv(log_ratio: Tensor) -> Tensor:
    """f(u) = ½|u − 1|: total variation ½Σ|π_θ − π_ref|.

    Example:
        >>> tv(torch.tensor([0.0, math.log(3.0)]))
        tensor([0., 1.])
    """
    return 0.5 * torch.expm1(log_ratio).abs()


@register_divergence("hellinger")
def hellinger(log_ratio: Tensor) -> Tensor:
    """f(u) = (√u − 1)²: squared Hellinger Σ(√π_θ − √π_ref)².

    Example:
        >>> hellinger(torch.tensor([0.0, math.log(9.0)]))
        tensor([0., 4.])
    """
    return torch.expm1(0.5 * log_ratio).square()


@register_divergence("chi2")
def chi2(log_ratio: Tensor) -> Tensor:
    """f(u) = (u − 1)²: Pearson χ² Σ(π_θ − π_ref)²/π_ref.

    Example:
        >>> chi2(torch.tensor([0.0, math.log(3.0)]))
        tensor([0., 4.])
    """
    return torch.expm1(log_ratio).square()


@DIVERGENCE_LEVELS.register("token")
def token_level(log_ratio: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """One ratio per token (as released): ``(log_ratio (B, T), mask (B, T))`` unchanged."""
    return log_ratio, mask


@DIVERGENCE_LEVELS.register("sequence")
def sequence_level(log_ratio: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """One ratio per row: ``(Σ_t log_ratio (B, 1), row has a token (B, 1))``.

    Example:
        >>> sequence_level(torch.tensor([[0.5, 0.25], [0.0, 0.0]]), torch.tensor([[1, 1], [0, 0]]))
        (tensor([[0.7500],
                [0.0000]]), tensor([[ True],
                [False]]))
    """
    return log_ratio.sum(-1, keepdim=True), mask.bool().any(-1, keepdim=True)


def divergence_units(loss_tokens: Tensor, level: str) -> Tensor:
    """The mask of the units the divergence averages at ``level``: tokens ``(B, T)`` or rows ``(B, 1)``.

    Its count is the normaliser of the anchor term, so gradient accumulation over anchor
    micro-batches weights each by its share of the units (not of the tokens at ``sequence``).

    Example:
        >>> divergence_units(torch.tensor([[1, 1, 0], [1, 0, 0]]), "sequence").sum().item()
        2
    """
    level_fn = DIVERGENCE_LEVELS.get_checked(level, "level")
    return level_fn(loss_tokens.float(), loss_tokens)[1]


def f_divergence(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    loss_tokens: Tensor,
    name: str = "forward_kl",
    level: str = "token",
    clamp: float = 20.0,
    agg: str = "token_mean",
    value_cap: float | None = None,
    **options,
) -> Tensor:
    """The DPH-RL preservation loss L_pef: D_f(π_θ‖π_ref) estimated on samples of π_ref.

    ``level="token"`` (as released): u_t = exp(clamp(logprobs − ref_logprobs, ±clamp)) per token
    and the loss is ``aggregate(f(u_t), loss_tokens, agg)``. ``level="sequence"`` (exactness
    studies): u = exp(clamp(Σ_t masked (logprobs − ref_logprobs), ±clamp)) per row, and the loss
    aggregates f(u) over the rows with at least one token (a ``(B, 1)`` unit per row, so
    ``token_mean`` is their mean). The levels are :data:`DIVERGENCE_LEVELS`. Rows or batches
    without tokens contribute 0. Clamping zeroes the gradient of outlier ratios; ``value_cap``
    (the release's 10) caps each unit's f value with zero gradient beyond.

    Args:
        logprobs: ``(B, T)`` log π_θ of the stored π_ref samples (differentiable).
        ref_logprobs: ``(B, T)`` the stored log π_ref of the same tokens (temperature 1).
        loss_tokens: ``(B, T)`` the tokens the loss reads (``StepData.loss_tokens``).
        name: a key of :data:`DIVERGENCES`.
        level: ``"token"`` or ``"sequence"``.
        clamp: bound on the log-ratio (> 0).
        agg: aggregation mode over the level's units (see :func:`lit_rlvr.functional.losses.aggregate`).
        value_cap: cap on each unit's f value (None = uncapped, the exact divergence).
        **options: the generator's options, e.g. ``alpha=0.3`` for ``name="alpha"``.

    Returns:
        A scalar tensor.

    Raises:
        ValueError: unknown ``name`` or ``level`` (listing the valid ones), an option the
            generator does not take, ``clamp <= 0`` or differing shapes.

    Example:
        >>> lp = torch.log(torch.tensor([[0.5, 0.25, 1.0]]))
        >>> ref = torch.log(torch.tensor([[0.25, 0.25, 0.5]]))
        >>> mask = torch.tensor([[1, 1, 0]])
        >>> f_divergence(lp, ref, mask, "forward_kl")  # mean of f(2), f(1) = (1 − log 2) / 2
        tensor(0.1534)
        >>> f_divergence(lp, ref, mask, "chi2", level="sequence")  # f(2 · 1) = 1
        tensor(1.)
    """
    fn = DIVERGENCES.get_checked(name, "divergence", options, "divergence options")
    if logprobs.dim() != 2 or not logprobs.shape == ref_logprobs.shape == loss_tokens.shape:
        raise ValueError(
            "f_divergence needs logprobs, ref_logprobs and loss_tokens of one (B, T) shape; got "
            f"{tuple(logprobs.shape)}, {tuple(ref_logprobs.shape)}, {tuple(loss_tokens.shape)}"
        )
    if not clamp > 0:
        raise ValueError(f"clamp must be > 0, got {clamp}")
    if level not in DIVERGENCE_LEVELS:
        raise ValueError(f"level must be {' or '.join(map(repr, DIVERGENCE_LEVELS))}, got {level!r}")
    mask = loss_tokens.bool()
    log_ratio = torch.where(mask, logprobs - ref_logprobs, logprobs.new_zeros(()))  # (B, T)
    x, units = DIVERGENCE_LEVELS[level](log_ratio, mask)  # (B, U) each
    values = cap_value(fn(x.clamp(-clamp, clamp), **options), value_cap)
    return aggregate(values, units, agg)
