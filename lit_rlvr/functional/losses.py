"""The RLVR policy loss (GRPO / DAPO family), loss aggregation and KL estimators (docs/methods.md §1).

- Clipped surrogate of PPO (Schulman et al. 2017, arXiv 1707.06347, Eq. 7) with the decoupled
  "clip-higher" bounds of DAPO (Yu et al. 2025, arXiv 2503.14476, Eq. 10: ε_low = 0.2,
  ε_high = 0.28) and the dual clip of Ye et al. 2020 (arXiv 1912.09729, Eq. 6) for A < 0.
- Aggregations: ``token_mean`` (DAPO §3.3, default), ``seq_mean_token_mean`` (original GRPO,
  Shao et al. 2024, arXiv 2402.03300, Eq. 3), ``seq_mean_token_sum_norm`` (Dr. GRPO, Liu et al.
  2025, arXiv 2503.20783, §3.1: a constant normaliser B · max_new_tokens).
- KL estimators k1, k2, k3 of Schulman's note "Approximating KL Divergence" (2020).

Departures, and why:

- Masked positions are replaced by zeros *before* any ``exp`` (not multiplied by 0 after), so
  padding holding ``-inf`` or garbage log-probs cannot turn the loss or its gradient into NaN.
- The log-ratio of real tokens is clamped to ±20 before ``exp`` (as verl's ``core_algos``): a
  sampler log-prob of ``-inf`` (or NaN, treated as ``-inf``) on a real token gives a finite loss
  and a zero gradient for that token instead of a NaN step.
- Empty batches and rows are not errors: ``token_mean`` of a fully masked batch is 0 and the
  ``seq_mean_*`` modes skip rows without tokens (a step with nothing to learn contributes 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_rlvr.registry import Registry

AGGREGATIONS = Registry("loss aggregation")
KL_ESTIMATORS = Registry("KL estimator")
LOG_RATIO_CLAMP = 20.0  # exp(20) ≈ 4.9e8: one outlier token cannot overflow float32


@dataclass(frozen=True)
class Aggregation:
    """A loss aggregation mode: the reduction and the normaliser it divides by.

    ``normaliser(mask)`` is the count the reduction divides a batch's sum by (tokens, non-empty
    rows, rows). A micro-batch's share of its mini-batch's normaliser is the weight that makes
    accumulated micro-batch losses equal the full-batch loss
    (:func:`lit_rlvr.functional.batching.aggregation_weight`), so every registered mode is
    accumulation-exact by construction.

    Attributes:
        reduce: ``(values (B, T), mask (B, T), max_len) -> scalar``.
        normaliser: ``(mask (B, T)) -> scalar`` count.
    """

    reduce: Callable[[Tensor, Tensor, "int | None"], Tensor]
    normaliser: Callable[[Tensor], Tensor]

    def __call__(self, values: Tensor, mask: Tensor, max_len: int | None = None) -> Tensor:
        return self.reduce(values, mask, max_len)


def register_aggregation(name: str, normaliser: Callable[[Tensor], Tensor]):
    """Register ``reduce(values, mask, max_len)`` as aggregation ``name`` with its ``normaliser``.

    Example:
        >>> @register_aggregation("_doc_row_sum", normaliser=lambda mask: torch.tensor(1))
        ... def row_sum(values, mask, max_len=None):
        ...     return _masked(values, mask).sum()
        >>> aggregate(torch.ones(2, 3), torch.ones(2, 3), "_doc_row_sum")
        tensor(6.)
        >>> _ = AGGREGATIONS.pop("_doc_row_sum")
    """

    def decorator(reduce):
        AGGREGATIONS.register(name)(Aggregation(reduce, normaliser))
        return reduce

    return decorator


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` with masked-out entries set to 0 (by selection, so NaN/inf there vanish)."""
    return torch.where(mask.bool(), values, values.new_zeros(()))


def masked_row_mean(values: Tensor, mask: Tensor) -> Tensor:
    """``(B,)`` mean of ``values (B, T)`` over each row's real tokens (0 for empty rows).

    Example:
        >>> masked_row_mean(torch.tensor([[1.0, 3.0, 9.0], [2.0, 0.0, 0.0]]), torch.tensor([[1, 1, 0], [0, 0, 0]]))
        tensor([2., 0.])
    """
    return _masked(values, mask).sum(-1) / mask.sum(-1).clamp(min=1)


@register_aggregation("token_mean", normaliser=lambda mask: mask.sum())
def token_mean(values: Tensor, mask: Tensor, max_len: int | None = None) -> Tensor:
    """Σ over the batch's unmasked tokens / their count (DAPO); 0 for a fully masked batch."""
    return _masked(values, mask).sum() / mask.sum().clamp(min=1)


@register_aggregation("seq_mean_token_mean", normaliser=lambda mask: (mask.sum(-1) > 0).sum())
def seq_mean_token_mean(values: Tensor, mask: Tensor, max_len: int | None = None) -> Tensor:
    """Mean over non-empty rows of each row's token mean (GRPO); 0 when every row is empty."""
    counts = mask.sum(-1)  # (B,)
    row_means = _masked(values, mask).sum(-1) / counts.clamp(min=1)  # (B,)
    return row_means.sum() / (counts > 0).sum().clamp(min=1)


@register_aggregation("seq_mean_token_sum_norm", normaliser=lambda mask: torch.tensor(mask.shape[0]))
def seq_mean_token_sum_norm(values: Tensor, mask: Tensor, max_len: int | None = None) -> Tensor:
    """Σ of all unmasked tokens / (B · max_len) (Dr. GRPO); ``max_len`` defaults to T."""
    B, T = values.shape
    return _masked(values, mask).sum() / (B * (T if max_len is None else max_len))


def aggregate(
    values: Tensor, mask: Tensor, mode: str = "token_mean", max_len: int | None = None
) -> Tensor:
    """Reduce per-token values to the scalar loss with one of :data:`AGGREGATIONS`.

    Args:
        values: ``(B, T)`` per-token losses.
        mask: ``(B, T)`` bool or 0/1, the tokens that count (``response_mask``).
        mode: ``"token_mean"`` (default), ``"seq_mean_token_mean"`` or
            ``"seq_mean_token_sum_norm"``.
        max_len: the Dr. GRPO normaliser (``max_new_tokens``); defaults to T; only used by
            ``seq_mean_token_sum_norm``.

    Returns:
        A scalar tensor. A fully masked batch gives 0 in every mode; ``seq_mean_token_mean``
        averages over non-empty rows only, ``seq_mean_token_sum_norm`` always divides by B.

    Raises:
        ValueError: unknown ``mode`` (lists the valid ones), shapes that differ or are not 2-D,
            or ``max_len < 1``.

    Example:
        >>> values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
        >>> mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
        >>> aggregate(values, mask, "token_mean")  # 10 / 4
        tensor(2.5000)
        >>> aggregate(values, mask, "seq_mean_token_mean")  # (2 + 4) / 2
        tensor(3.)
        >>> aggregate(values, mask, "seq_mean_token_sum_norm", max_len=5)  # 10 / (2 · 5)
        tensor(1.)
    """
    fn = checked_aggregation(mode, "agg")
    if values.dim() != 2 or values.shape != mask.shape:
        raise ValueError(
            f"aggregate needs values and mask of the same (B, T) shape; "
            f"got values {tuple(values.shape)} and mask {tuple(mask.shape)}"
        )
    if max_len is not None and max_len < 1:
        raise ValueError(f"max_len (max_new_tokens) must be >= 1, got {max_len}")
    return fn(values, mask, max_len)


def checked_aggregation(mode: str, key: str) -> Aggregation:
    """The :class:`Aggregation` registered as ``mode``, with errors naming the config ``key``.

    A mode registered as a bare function (no normaliser) is refused: gradient accumulation could
    not weight its micro-batches exactly.
    """
    agg = AGGREGATIONS.get_checked(mode, key)
    if not isinstance(agg, Aggregation):
        raise ValueError(
            f"{key}: loss aggregation {mode!r} was registered without a micro-batch normaliser; register it "
            "with lit_rlvr.functional.losses.register_aggregation(name, normaliser=...)"
        )
    return agg


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    agg: str = "token_mean",
    max_len: int | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate loss with clip-higher and an optional dual clip (docs/methods.md §1).

    Per token, with ρ_t = exp(clamp(logprobs − old_logprobs, ±20))::

        l_t = −min(ρ_t·A, clip(ρ_t, 1 − clip_low, 1 + clip_high)·A)
        l_t = min(l_t, −dual_clip·A)            for A < 0 when dual_clip is set

    Args:
        logprobs: ``(B, T)`` log π_θ of the completion tokens (differentiable).
        old_logprobs: ``(B, T)`` log π_old, the sampling policy's log-probs (no gradient used).
            A non-finite value on a real token (``-inf``, NaN) gives that token a clamped ratio
            and a zero gradient (count them with :func:`nonfinite_count` and log it).
        advantages: ``(B,)`` one per completion, or ``(B, T)`` per token.
        response_mask: ``(B, T)`` real completion tokens.
        clip_low: ε_low ∈ [0, 1) (DAPO default 0.2).
        clip_high: ε_high ≥ 0 (DAPO clip-higher default 0.28).
        dual_clip: c > 1 bounding the loss of negative-advantage tokens by −c·A (3.0 in
            Ye et al. 2020); ``None`` disables it.
        agg: aggregation mode, see :func:`aggregate`.
        max_len: ``max_new_tokens`` for ``seq_mean_token_sum_norm``.
        token_weights: ``(B, T)`` detached per-token weights of ``l_t`` before aggregation (the
            rollout correction's importance weights, :mod:`lit_rlvr.functional.correction`);
            None: all 1. They do not change the aggregation's normaliser.

    Returns:
        ``(loss, stats)``: the scalar loss and a dict of detached scalar tensors computed over
        unmasked tokens: ``clipfrac_low`` (A < 0, ρ < 1 − ε_low), ``clipfrac_high`` (A > 0,
        ρ > 1 + ε_high), ``clipfrac_dual`` (A < 0 and the dual bound is active),
        ``ratio_mean`` and ``approx_kl`` (k3 estimate of KL(π_old‖π_θ) on π_old's samples).

    Raises:
        ValueError: shapes that disagree, ``clip_low`` outside [0, 1), ``clip_high < 0`` or
            ``dual_clip <= 1``; unknown ``agg``.

    Example:
        >>> lp = torch.log(torch.tensor([[1.1, 1.5, 0.5, 5.0]]))  # old log-probs are 0
        >>> adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])  # inside, clip high, clip low, dual
        >>> loss, stats = policy_loss(lp, torch.zeros(1, 4), adv, torch.ones(1, 4), dual_clip=3.0)
        >>> loss  # (-1.1 - 1.28 + 0.8 + 3.0) / 4
        tensor(0.3550)
        >>> {k: round(v.item(), 2) for k, v in stats.items() if k.startswith("clipfrac")}
        {'clipfrac_low': 0.25, 'clipfrac_high': 0.25, 'clipfrac_dual': 0.25}
    """
    _check_policy_args(
        logprobs, old_logprobs, advantages, response_mask, clip_low, clip_high, dual_clip
    )
    mask = response_mask.bool()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    old = torch.where(torch.isnan(old_logprobs), float("-inf"), old_logprobs)  # NaN: no usable mass, as -inf
    log_ratio = _masked(logprobs - old, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T), 0 on padding
    ratio = torch.exp(log_ratio)  # (B, T), 1 on padding
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_t = torch.maximum(-adv * ratio, -adv * clipped)  # (B, T) = −min(ρA, clip(ρ)A)
    dual = torch.zeros_like(mask)
    if dual_clip is not None:
        bound = -dual_clip * adv
        dual = (adv < 0) & (loss_t > bound)
        loss_t = torch.where(adv < 0, torch.minimum(loss_t, bound), loss_t)
    if token_weights is not None:
        if token_weights.shape != loss_t.shape:
            raise ValueError(f"token_weights must be (B, T) = {tuple(loss_t.shape)}, got {tuple(token_weights.shape)}")
        loss_t = loss_t * token_weights.detach()
    loss = aggregate(loss_t, mask, agg, max_len)

    with torch.no_grad():  # shares of unmasked tokens in each clipped branch, for logging
        stats = {
            "clipfrac_low": token_mean(((adv < 0) & (ratio < 1.0 - clip_low)).float(), mask),
            "clipfrac_high": token_mean(((adv > 0) & (ratio > 1.0 + clip_high)).float(), mask),
            "clipfrac_dual": token_mean(dual.float(), mask),
            "ratio_mean": token_mean(ratio, mask),
            "approx_kl": token_mean(kl_estimate(old, logprobs.detach(), "k3"), mask),
        }
    return loss, stats


def nonfinite_count(values: Tensor, mask: Tensor) -> Tensor:
    """Number of real (unmasked) entries of ``values`` that are not finite (``-inf``, ``inf``, NaN).

    Example:
        >>> nonfinite_count(torch.tensor([[-float("inf"), -1.0, float("nan")]]), torch.tensor([[1, 1, 0]]))
        tensor(1)
    """
    return (~torch.isfinite(values) & mask.bool()).sum()


def _check_policy_args(
    logprobs, old_logprobs, advantages, response_mask, clip_low, clip_high, dual_clip
) -> None:
    """Raise ``ValueError`` for inconsistent shapes or clip settings, naming the values."""
    shapes = {
        "logprobs": tuple(logprobs.shape),
        "old_logprobs": tuple(old_logprobs.shape),
        "response_mask": tuple(response_mask.shape),
    }
    if logprobs.dim() != 2 or len(set(shapes.values())) != 1:
        raise ValueError(f"policy_loss needs (B, T) tensors of one shape; got {shapes}")
    B, T = logprobs.shape
    if tuple(advantages.shape) not in {(B,), (B, T)}:
        raise ValueError(
            f"advantages must be (B,) = ({B},) or (B, T) = ({B}, {T}); "
            f"got {tuple(advantages.shape)}"
        )
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low (ε_low) must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high (ε_high) must be >= 0, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None, got {dual_clip}")


@KL_ESTIMATORS.register("k1")
def _k1(x: Tensor) -> Tensor:
    return -x


@KL_ESTIMATORS.register("k2")
def _k2(x: Tensor) -> Tensor:
    return 0.5 * x.square()


@KL_ESTIMATORS.register("k3")
def _k3(x: Tensor) -> Tensor:
    x = x.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(x) - x


def cap_value(values: Tensor, cap: float | None) -> Tensor:
    """``min(values, cap)`` with zero gradient where the cap binds (None: unchanged).

    The released DPH-RL loss and verl's ``low_var_kl`` cap per-token values at 10 this way.

    Example:
        >>> cap_value(torch.tensor([0.5, 12.0]), 10.0), cap_value(torch.tensor([12.0]), None)
        (tensor([ 0.5000, 10.0000]), tensor([12.]))
    """
    if cap is None:
        return values
    if not cap > 0:
        raise ValueError(f"a value cap must be > 0 or None (uncapped), got {cap}")
    return values.clamp(max=cap)


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k1", value_cap: float | None = None) -> Tensor:
    """Per-token estimators of KL(π_θ‖π_ref) on tokens sampled from π_θ (Schulman 2020).

    With x = ref_logprobs − logprobs: k1 = −x (unbiased), k2 = x²/2 (biased, low variance),
    k3 = exp(x) − x − 1 (unbiased, non-negative; the ``low_var_kl`` of verl). For k3, x is
    clamped to [−20, 20] so a single outlier token stays finite (this biases only such
    outliers); k1 and k2 are polynomial in x and are left exact.

    Departure from verl: verl's ``low_var_kl`` also caps the per-token k3 value at 10 (zero
    gradient beyond). Uncapped is the exact estimator and our default; ``value_cap=10.0``
    reproduces verl (and the RKL baseline of the DPH-RL release) exactly.

    Args:
        logprobs: ``(B, T)`` log π_θ of the sampled tokens.
        ref_logprobs: ``(B, T)`` log π_ref of the same tokens.
        kind: ``"k1"``, ``"k2"`` or ``"k3"``.
        value_cap: cap on each per-token value (None = uncapped).

    Returns:
        ``(B, T)`` per-token estimates (unmasked; reduce them with :func:`aggregate`).

    Raises:
        ValueError: unknown ``kind`` (lists the valid ones), differing shapes, ``value_cap <= 0``.

    Example:
        >>> lp, ref = torch.tensor([[0.0, -0.5]]), torch.tensor([[-1.0, -1.0]])
        >>> kl_estimate(lp, ref, "k1"), kl_estimate(lp, ref, "k3")
        (tensor([[1.0000, 0.5000]]), tensor([[0.3679, 0.1065]]))
        >>> kl_estimate(torch.tensor([[-30.0]]), torch.tensor([[-1.0]]), "k3", value_cap=10.0)
        tensor([[10.]])
    """
    fn = KL_ESTIMATORS.get_checked(kind, "kind")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"kl_estimate needs logprobs and ref_logprobs of one shape; "
            f"got {tuple(logprobs.shape)} and {tuple(ref_logprobs.shape)}"
        )
    return cap_value(fn(ref_logprobs - logprobs), value_cap)
