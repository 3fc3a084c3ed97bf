"""Rollout correction: importance weights between the trainer's π_old and the sampler that generated the rollout.

The policy loss's ratio uses π_old; when π_old is the trainer's own log-probs (recomputed at
rollout time) but the tokens were sampled by another engine — vLLM in bf16, kernels that differ
from the trainer's, or a policy several updates old (asynchronous rollouts) — the samples are
off-policy for π_old, and the gradient is biased unless each token is re-weighted by

    w_t = π_old(y_t) / π_sampler(y_t)                              (token level)
    w   = Π_t π_old(y_t) / π_sampler(y_t)                           (sequence level, one per row)

The weights are detached (a correction of the sampling distribution, not a gradient path) and
bounded, as TRL's ``vllm_importance_sampling_*`` and verl's ``algorithm.rollout_correction`` do:

- ``*_truncate``: w clipped to [clip_min, clip_max] (truncated IS, Ionides 2008);
- ``*_mask``: w set to 0 outside [clip_min, clip_max] (masked IS; with a lower bound this is
  IcePop's band, arXiv 2510.18855), the tokens or rows inside keep their w.

Modes are the entries of :data:`CORRECTIONS` (token/sequence × truncate/mask), named as TRL names
them. With identical numerics (sampler log-probs equal to the trainer's) every weight is exactly
1.0 and the loss is unchanged bit for bit (docs/methods.md §1.8).

A token whose sampler (or trainer) log-prob is not finite (NaN, ±inf: a broken sampler) has no
ratio: it gets weight 0, as a masked token (its whole row at sequence level), is counted in the
``is_nonfinite`` statistic and warned about. TRL turns the NaN into a weight of 1 (its
``nan_to_num``), which trains on the token as if sampler and trainer agreed.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_rlvr.registry import Registry

LOG_RATIO_CLAMP = 20.0  # as the policy loss: exp(20) cannot overflow float32


@dataclass(frozen=True)
class CorrectionMode:
    """A rollout-correction mode: the level of its ratio and how a bound applies.

    Attributes:
        level: ``token`` (one weight per token) or ``sequence`` (one per row, its tokens' product).
        bound: ``truncate`` (clip into the band) or ``mask`` (0 outside the band).
    """

    level: str
    bound: str


CORRECTIONS = Registry("rollout correction mode")
for _level in ("token", "sequence"):
    for _bound in ("truncate", "mask"):
        CORRECTIONS.register(f"{_level}_{_bound}")(CorrectionMode(_level, _bound))


def correction_weights(
    trainer_logprobs: Tensor,
    sampler_logprobs: Tensor,
    loss_tokens: Tensor,
    mode: str = "token_truncate",
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Bounded importance weights ``(B, T)`` of the sampler's tokens under the trainer's π_old.

    Args:
        trainer_logprobs: ``(B, T)`` log π_old from the trainer's forward at rollout time.
        sampler_logprobs: ``(B, T)`` the sampler's log-probs of the same tokens.
        loss_tokens: ``(B, T)`` the tokens the loss reads (``StepData.loss_tokens``); the others get weight 1, unused.
        mode: a key of :data:`CORRECTIONS`.
        clip_max: upper bound C_max (None: none).
        clip_min: lower bound C_min (None: none).

    Returns:
        ``(weights, stats)``: detached weights ``(B, T)`` (1 off ``loss_tokens``, 0 where a log-prob is not
        finite) and, over real tokens, ``mismatch_kl`` (k3 estimate of KL(π_sampler‖π_old) on the
        sampler's tokens), ``is_weight_mean``, ``is_weight_max`` (of the raw ratios, before
        bounding; these three over the tokens with finite log-probs), ``is_bounded`` (share of
        tokens truncated or masked) and ``is_nonfinite`` (share whose log-probs are not finite).

    Example:
        >>> old = torch.log(torch.tensor([[0.5, 0.5, 0.4]]))
        >>> sampler = torch.log(torch.tensor([[0.5, 0.1, 0.8]]))
        >>> w, stats = correction_weights(old, sampler, torch.ones(1, 3), "token_truncate", clip_max=3.0)
        >>> w  # 1, 5 truncated to 3, 0.5
        tensor([[1.0000, 3.0000, 0.5000]])
        >>> correction_weights(old, sampler, torch.ones(1, 3), "token_mask", clip_max=3.0)[0]
        tensor([[1.0000, 0.0000, 0.5000]])
        >>> correction_weights(old, old, torch.ones(1, 3), "sequence_mask")[0]  # identical numerics: exactly 1
        tensor([[1., 1., 1.]])
    """
    spec = CORRECTIONS.get_checked(mode, "model.rollout_correction.mode")
    _check_bounds(clip_min, clip_max)
    if not trainer_logprobs.shape == sampler_logprobs.shape == loss_tokens.shape:
        raise ValueError(
            "correction_weights needs (B, T) trainer_logprobs, sampler_logprobs and loss_tokens of one shape; got "
            f"{tuple(trainer_logprobs.shape)}, {tuple(sampler_logprobs.shape)}, {tuple(loss_tokens.shape)}"
        )
    with torch.no_grad():
        mask = loss_tokens.bool()
        nonfinite = mask & ~(torch.isfinite(trainer_logprobs) & torch.isfinite(sampler_logprobs))  # (B, T)
        finite = mask & ~nonfinite
        diff = torch.where(finite, trainer_logprobs.float() - sampler_logprobs.float(), torch.zeros(()))  # (B, T)
        diff = diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        if spec.level == "sequence":
            log_w = diff.sum(-1, keepdim=True).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).expand_as(diff)  # (B, T)
            no_ratio = nonfinite.any(-1, keepdim=True).expand_as(diff) & mask  # the row's product is unknown
        else:
            log_w, no_ratio = diff, nonfinite
        raw = torch.exp(log_w)
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        outside = (raw < low) | (raw > high)
        weights = raw.clamp(min=low, max=high) if spec.bound == "truncate" else raw.masked_fill(outside, 0.0)
        weights = torch.where(mask, weights.masked_fill(no_ratio, 0.0), torch.ones(()))
        n, known = mask.sum().clamp(min=1), finite & ~no_ratio
        real = raw[known]
        stats = {
            "mismatch_kl": (torch.expm1(diff) - diff)[finite].sum()
            / finite.sum().clamp(min=1),  # x = log π_old − log π_s, k3
            "is_weight_mean": real.mean() if real.numel() else torch.ones(()),
            "is_weight_max": real.max() if real.numel() else torch.ones(()),
            "is_bounded": (outside & known).sum() / n,
            "is_nonfinite": nonfinite.sum() / n,
        }
    if nonfinite.any():
        warnings.warn(
            f"rollout correction: {int(nonfinite.sum())} of {int(mask.sum())} tokens have a log-prob that is not finite "
            "(NaN or ±inf; the sampler's, or the trainer's); they get weight 0 (their rows, at sequence level) and are "
            "counted in train/is_nonfinite. Check the sampler.",
            RuntimeWarning,
            stacklevel=2,
        )
    return weights, stats


def _check_bounds(clip_min: float | None, clip_max: float | None) -> None:
    for name, value in (("clip_min", clip_min), ("clip_max", clip_max)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"model.rollout_correction.{name} must be a number > 0 or null, got {value!r}")
    if clip_min is not None and clip_max is not None and not clip_min < clip_max:
        raise ValueError(f"model.rollout_correction.clip_min ({clip_min}) must be below clip_max ({clip_max})")
