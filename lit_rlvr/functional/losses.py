"""The RLVR policy loss (GRPO / DAPO family), loss aggregation and KL estimators (docs/methods.md §1).

- Clipped surrogate of PPO (Schulman et al. 2017, arXiv 1707.06347, Eq. 7) with the decoupled
  "clip-higher" bounds of DAPO (Yu et al. 2025, arXiv 2503.14476, Eq. 10: ε_low = 0.2,
  ε_high = 0.28) and the dual clip of Ye et al. 2020 (arXiv 1912.09729, Eq. 6) for A < 0.
- Policy losses (:data:`POLICY_LOSSES`, verl's ``loss_mode``): ``vanilla`` is the clipped
  surrogate above; the covariance methods of Cui et al. 2025 (``clip_cov``, ``kl_cov``) are in
  :mod:`lit_rlvr.functional.covariance`. An entry is a per-token loss and, optionally, a token
  selection it needs (:class:`PolicyLoss`).
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

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lit_rlvr.registry import Registry

AGGREGATIONS = Registry("loss aggregation")
KL_ESTIMATORS = Registry("KL estimator")
POLICY_LOSSES = Registry("policy loss", injected=("clip_low", "clip_high", "dual_clip", "generator"))
"""Name → :class:`PolicyLoss` (verl's ``policy_loss.loss_mode``): ``vanilla``, ``clip_cov``, ``kl_cov``.
The loss-wide settings (``clip_low``, ``clip_high``, ``dual_clip``) and the module's ``generator``
are passed by the library to the entries that declare them; every other keyword-only parameter of
an entry's functions is an option (``model.loss.policy_loss_options``), checked at start-up."""
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

    reduce: Callable[[Tensor, Tensor, int | None], Tensor]
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


def aggregate(values: Tensor, mask: Tensor, mode: str = "token_mean", max_len: int | None = None) -> Tensor:
    """Reduce per-token values to the scalar loss with one of :data:`AGGREGATIONS`.

    Args:
        values: ``(B, T)`` per-token losses.
        mask: ``(B, T)`` bool or 0/1, the tokens that count (``loss_tokens``).
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


@dataclass(frozen=True)
class PolicyLoss:
    """A policy loss: the per-token loss and, optionally, the tokens it treats apart.

    ``token_loss(log_ratio (B, T), advantages (B, 1) or (B, T), selected (B, T) bool or None, *,
    <injected>, <options>) -> (B, T)`` is the loss of every token before aggregation (log_ratio is
    log π_θ − log π_old, clamped to ±20 and 0 on padding). ``select(logprobs (B, T), old_logprobs
    (B, T), advantages (B, T), loss_tokens (B, T), *, <injected>, <options>) -> (B, T) bool``
    chooses the tokens ``token_loss`` treats apart (Clip-Cov's detached tokens, KL-Cov's penalised
    ones) from detached statistics of the batch; None for losses that treat every token alike.
    Each function gets the injected settings and the options its own signature names.
    """

    token_loss: Callable[..., Tensor]
    select: Callable[..., Tensor] | None = None
    _names: dict[str, frozenset] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        for role in ("token_loss", "select"):
            if getattr(self, role) is not None:
                self._names[role] = frozenset(inspect.signature(getattr(self, role)).parameters)

    def _kwargs(self, role: str, values: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if k in self._names[role]}

    def loss(self, log_ratio: Tensor, advantages: Tensor, selected: Tensor | None, **values) -> Tensor:
        """``token_loss`` with the values (injected settings and options) it declares."""
        return self.token_loss(log_ratio, advantages, selected, **self._kwargs("token_loss", values))

    def choose(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_tokens: Tensor, **values
    ) -> Tensor:
        """``select`` with the values it declares: ``(B, T)`` bool, False off ``loss_tokens``."""
        return self.select(logprobs, old_logprobs, advantages, loss_tokens, **self._kwargs("select", values))


def register_policy_loss(
    name: str, *, select: Callable[..., Tensor] | None = None, check: Callable[..., None] | None = None
):
    """Register ``token_loss`` (and its ``select``) as policy loss ``name`` (:class:`PolicyLoss`).

    The entry's options are the keyword-only parameters of both functions less the injected
    settings; ``check(**options)`` refuses values at start-up.

    Example:
        >>> @register_policy_loss("_doc_unclipped")
        ... def unclipped(log_ratio, advantages, selected):
        ...     return -advantages * torch.exp(log_ratio)
        >>> loss, _ = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), loss="_doc_unclipped")
        >>> loss
        tensor(-1.)
        >>> _ = POLICY_LOSSES.pop("_doc_unclipped")
    """

    def decorator(token_loss):
        params: dict[str, inspect.Parameter] = {}
        for fn in (token_loss, select):
            for p in inspect.signature(fn).parameters.values() if fn is not None else ():
                if p.kind is inspect.Parameter.KEYWORD_ONLY:
                    params.setdefault(p.name, p)
        POLICY_LOSSES.register(name, check=check, signature=inspect.Signature(list(params.values())))(
            PolicyLoss(token_loss, select)
        )
        return token_loss

    return decorator


def clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float) -> Tensor:
    """``(B, T)`` −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A) (PPO Eq. 7 with DAPO's bounds).

    Example:
        >>> clipped_surrogate(torch.tensor([[1.1, 1.5, 0.5]]), torch.tensor([[1.0, 1.0, -1.0]]), 0.2, 0.28)
        tensor([[-1.1000, -1.2800,  0.8000]])
    """
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high))


@register_policy_loss("vanilla")
def vanilla(
    log_ratio: Tensor,
    advantages: Tensor,
    selected: Tensor | None,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> Tensor:
    """The clipped surrogate with clip-higher and an optional dual clip (verl's ``vanilla``; §1.2).

    l_t = −min(ρ_t·A, clip(ρ_t, 1 − ε_low, 1 + ε_high)·A), and min(l_t, −c·A) where A < 0 when
    ``dual_clip`` c is set. ``selected`` is unused (no token is treated apart).

    Example:
        >>> vanilla(torch.log(torch.tensor([[5.0]])), torch.tensor([[-1.0]]), None, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
        tensor([[3.]])
    """
    loss_t = clipped_surrogate(torch.exp(log_ratio), advantages, clip_low, clip_high)
    if dual_clip is not None:
        loss_t = torch.where(advantages < 0, torch.minimum(loss_t, -dual_clip * advantages), loss_t)
    return loss_t


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_tokens: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    agg: str = "token_mean",
    max_len: int | None = None,
    token_weights: Tensor | None = None,
    loss: str | PolicyLoss = "vanilla",
    options: dict[str, Any] | None = None,
    selected: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss ``loss`` of :data:`POLICY_LOSSES` (default: the clipped surrogate, docs/methods.md §1).

    Per token, with ρ_t = exp(clamp(logprobs − old_logprobs, ±20)), the ``vanilla`` loss is::

        l_t = −min(ρ_t·A, clip(ρ_t, 1 − clip_low, 1 + clip_high)·A)
        l_t = min(l_t, −dual_clip·A)            for A < 0 when dual_clip is set

    and the others are documented with their entries (``clip_cov``, ``kl_cov``: §8). A loss that
    treats some tokens apart gets them as ``selected``; when None, its ``select`` chooses them
    here from this batch (``logprobs`` detached), as verl's functions do within the batch they get.

    Args:
        logprobs: ``(B, T)`` log π_θ of the completion tokens (differentiable).
        old_logprobs: ``(B, T)`` log π_old, the sampling policy's log-probs (no gradient used).
            A non-finite value on a real token (``-inf``, NaN) gives that token a clamped ratio
            and a zero gradient (count them with :func:`nonfinite_count` and log it).
        advantages: ``(B,)`` one per completion, or ``(B, T)`` per token.
        loss_tokens: ``(B, T)`` the tokens the loss reads (1/0): the model's own completion tokens, not padding nor an environment's tokens (``StepData.loss_tokens``).
        clip_low: ε_low ∈ [0, 1] (DAPO default 0.2; 1 removes the lower bound, as Clip-Cov's release).
        clip_high: ε_high ≥ 0 (DAPO clip-higher default 0.28).
        dual_clip: c > 1 bounding the loss of negative-advantage tokens by −c·A (3.0 in
            Ye et al. 2020); ``None`` disables it. Refused by losses that do not clip.
        agg: aggregation mode, see :func:`aggregate`.
        max_len: ``max_new_tokens`` for ``seq_mean_token_sum_norm``.
        token_weights: ``(B, T)`` detached per-token weights of ``l_t`` before aggregation (the
            rollout correction's importance weights, a token mask); None: all 1. They do not
            change the aggregation's normaliser.
        loss: a key of :data:`POLICY_LOSSES` (its options checked here), or its entry, already
            checked with ``options`` and ``dual_clip`` (:attr:`LossOptions.entry
            <lit_rlvr.options.LossOptions.entry>`: once per run, not per micro-batch).
        options: the entry's options (``{"clip_cov_ratio": 0.0002}``).
        selected: ``(B, T)`` bool tokens the entry treats apart, chosen beforehand (the module
            chooses them once per rollout batch); None: chosen here.
        generator: randomness of a selection (Clip-Cov's draw); None: torch's global generator.

    Returns:
        ``(loss, stats)``: the scalar loss and a dict of detached scalar tensors computed over
        unmasked tokens: ``clipfrac_low`` (A < 0, ρ < 1 − ε_low), ``clipfrac_high`` (A > 0,
        ρ > 1 + ε_high), ``clipfrac_dual`` (A < 0 and the dual bound is active),
        ``ratio_mean``, ``approx_kl`` (k3 estimate of KL(π_old‖π_θ) on π_old's samples), and
        ``selected`` (share of tokens selected) for a loss with a selection.

    Raises:
        ValueError: shapes that disagree, ``clip_low`` outside [0, 1], ``clip_high < 0`` or
            ``dual_clip <= 1``; unknown ``agg`` or ``loss``, options it does not take, a
            ``dual_clip`` it does not take.

    Example:
        >>> lp = torch.log(torch.tensor([[1.1, 1.5, 0.5, 5.0]]))  # old log-probs are 0
        >>> adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])  # inside, clip high, clip low, dual
        >>> loss, stats = policy_loss(lp, torch.zeros(1, 4), adv, torch.ones(1, 4), dual_clip=3.0)
        >>> loss  # (-1.1 - 1.28 + 0.8 + 3.0) / 4
        tensor(0.3550)
        >>> {k: round(v.item(), 2) for k, v in stats.items() if k.startswith("clipfrac")}
        {'clipfrac_low': 0.25, 'clipfrac_high': 0.25, 'clipfrac_dual': 0.25}
    """
    entry = loss if isinstance(loss, PolicyLoss) else checked_policy_loss(loss, options, dual_clip, "loss")
    _check_policy_args(logprobs, old_logprobs, advantages, loss_tokens, clip_low, clip_high, dual_clip)
    mask = loss_tokens.bool()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    old = torch.where(torch.isnan(old_logprobs), float("-inf"), old_logprobs)  # NaN: no usable mass, as -inf
    log_ratio = _masked(logprobs - old, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T), 0 on padding
    values = {
        "clip_low": clip_low,
        "clip_high": clip_high,
        "dual_clip": dual_clip,
        "generator": generator,
        **(options or {}),
    }
    if entry.select is not None and selected is None:
        with torch.no_grad():
            selected = entry.choose(logprobs.detach(), old, adv.expand_as(log_ratio), mask, **values)
    if selected is not None and selected.shape != log_ratio.shape:
        raise ValueError(f"selected must be (B, T) = {tuple(log_ratio.shape)}, got {tuple(selected.shape)}")
    loss_t = entry.loss(log_ratio, adv, selected.bool() if selected is not None else None, **values)  # (B, T)
    if token_weights is not None:
        if token_weights.shape != loss_t.shape:
            raise ValueError(f"token_weights must be (B, T) = {tuple(loss_t.shape)}, got {tuple(token_weights.shape)}")
        loss_t = loss_t * token_weights.detach()
    total = aggregate(loss_t, mask, agg, max_len)

    with torch.no_grad():  # shares of unmasked tokens in each clipped branch, for logging
        ratio = torch.exp(log_ratio)  # 1 on padding
        dual = torch.zeros_like(mask)
        if dual_clip is not None:
            dual = (adv < 0) & (clipped_surrogate(ratio, adv, clip_low, clip_high) > -dual_clip * adv)
        stats = {
            "clipfrac_low": token_mean(((adv < 0) & (ratio < 1.0 - clip_low)).float(), mask),
            "clipfrac_high": token_mean(((adv > 0) & (ratio > 1.0 + clip_high)).float(), mask),
            "clipfrac_dual": token_mean(dual.float(), mask),
            "ratio_mean": token_mean(ratio, mask),
            "approx_kl": token_mean(kl_estimate(old, logprobs.detach(), "k3"), mask),
        }
        if entry.select is not None:
            stats["selected"] = token_mean(selected.float(), mask)
    return total, stats


def checked_policy_loss(name: str, options: dict[str, Any] | None, dual_clip: float | None, key: str) -> PolicyLoss:
    """The :class:`PolicyLoss` ``name`` after checking its options, and that it takes a set ``dual_clip``.

    A loss that does not clip (KL-Cov's surrogate is unclipped) would silently ignore the dual
    clip, so the pair is refused.
    """
    entry = POLICY_LOSSES.get_checked(name, key, options or {}, f"{key}_options")
    if dual_clip is not None and not POLICY_LOSSES.declares(name, "dual_clip"):
        raise ValueError(
            f"{key}: policy loss {name!r} does not clip, so dual_clip={dual_clip} would have no effect; "
            "remove dual_clip (model.loss.dual_clip: null)"
        )
    return entry


def nonfinite_count(values: Tensor, mask: Tensor) -> Tensor:
    """Number of real (unmasked) entries of ``values`` that are not finite (``-inf``, ``inf``, NaN).

    Example:
        >>> nonfinite_count(torch.tensor([[-float("inf"), -1.0, float("nan")]]), torch.tensor([[1, 1, 0]]))
        tensor(1)
    """
    return (~torch.isfinite(values) & mask.bool()).sum()


def _check_policy_args(logprobs, old_logprobs, advantages, loss_tokens, clip_low, clip_high, dual_clip) -> None:
    """Raise ``ValueError`` for inconsistent shapes or clip settings, naming the values."""
    shapes = {
        "logprobs": tuple(logprobs.shape),
        "old_logprobs": tuple(old_logprobs.shape),
        "loss_tokens": tuple(loss_tokens.shape),
    }
    if logprobs.dim() != 2 or len(set(shapes.values())) != 1:
        raise ValueError(f"policy_loss needs (B, T) tensors of one shape; got {shapes}")
    B, T = logprobs.shape
    if tuple(advantages.shape) not in {(B,), (B, T)}:
        raise ValueError(f"advantages must be (B,) = ({B},) or (B, T) = ({B}, {T}); got {tuple(advantages.shape)}")
    if not 0.0 <= clip_low <= 1.0:
        raise ValueError(f"clip_low (ε_low) must be in [0, 1], got {clip_low}")
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
