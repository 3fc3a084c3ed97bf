"""Token entropy in the loss: the forking-token mask, the entropy bonus and its adaptive coefficient.

- **Forking tokens** (:data:`TOKEN_MASKS` ``top_entropy``): Wang et al. 2025, "Beyond the 80/20
  Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM Reasoning"
  (arXiv 2506.01939): the policy gradient only on the top-ρ share of the batch's tokens by
  entropy (ρ = 0.2 in the paper). The threshold is TRL's (``GRPOTrainer.get_high_entropy_mask``,
  option ``top_entropy_quantile``): the (1 − ρ) quantile of the real tokens' entropies with linear
  interpolation, keeping every token at or above it; the mask multiplies the per-token loss, and
  the aggregation's normaliser still counts every token.
- **Entropy bonus** (:func:`entropy_bonus`): L ← L − c·agg(H_t), the maximum-entropy term of
  PPO (Schulman et al. 2017, Eq. 9), aggregated like the policy loss (verl's ``entropy_coeff``).
- **Adaptive coefficient** (:data:`ENTROPY_CONTROLS` ``adaptive``): Skywork-OR1 (He et al. 2025,
  "Skywork Open Reasoner 1 Technical Report", arXiv 2505.22312, "adaptive entropy control"): after each step with measured entropy
  H, c ← clip(c + δ, c_min, c_max) if H < H_target else clip(c − δ, c_min, c_max), and the next
  step applies c only if H < H_target. ``static`` applies a constant c. Options are TRL's names
  (``entropy_coef``, ``entropy_target``, ``entropy_coef_delta``, ``entropy_coef_min``,
  ``entropy_coef_max``) with TRL's defaults.

Compared with the released code (tests hold their outputs on fixed inputs), and where this departs:

- ``top_entropy``: equal to TRL's ``GRPOTrainer.get_high_entropy_mask`` (trl 1.16.0, the same
  function at huggingface/trl f2cd5771, ``trl/trainer/grpo_trainer.py``; one process). TRL takes
  the quantile over the micro-batch in the training forward (gathered over processes); the
  authors' release (zhouxiangxin1998/
  Beyond-the-80-20-Rule-RLVR e8619ca4, ``get_global_entropy_top_mask``) keeps the ⌈ρN⌉ highest
  tokens of each micro-batch and divides the loss by the kept tokens instead of all. Here the mask
  is chosen once per rollout batch (each process's rows) from the trainer's entropies of π_θ at
  the start of the step, so micro-batching does not change it (docs/methods.md §5); the quantile
  is computed by a sort, so it has no size limit (``torch.quantile`` refuses more than 2^24
  values). With the aggregation's normaliser counting every token, the loss is about ρ times the
  authors' (Adam is nearly invariant to that scale; gradient clipping is not).
- ``adaptive``: equal to Skywork-OR1's ``EntController.update`` (SkyworkAI/Skywork-OR1 64e96afa,
  ``verl/trainer/ppo/core_algos.py``), which TRL's ``use_adaptive_entropy`` follows with ≤ for <
  and no bonus before the first measurement. H is the step's mean token entropy of the training
  forward, over the processes and over every real token, also under a token mask (TRL: the kept
  tokens; the target describes the policy's entropy, which the highest-entropy share overstates by
  a factor that moves with ρ: docs/methods.md §8.3); Skywork-OR1 uses −mean log π_old of the
  sampled tokens, the same quantity in expectation, and TRL the entropy of each optimizer step's
  window. The update runs once per training step (rollout batch), as Skywork-OR1's.
- The bonus uses the token mask's tokens when a mask is set (as TRL's ``effective_mask``), with
  the policy loss's aggregation (verl's; TRL's is always a token mean over the kept tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_rlvr.functional.losses import aggregate
from lit_rlvr.registry import Registry

TOKEN_MASKS = Registry("token mask")
"""Name → ``fn(entropies (B, T), loss_tokens (B, T), *, options) -> (B, T) bool``: the tokens the
policy gradient acts on (``model.loss.token_mask``)."""

ENTROPY_CONTROLS = Registry("entropy control")
"""Name → ``fn(state: EntropyState, entropy: float, *, options) -> EntropyState``: the entropy
bonus's coefficient after a step that measured ``entropy`` (``model.entropy.control``). Every
entry takes the option ``entropy_coef``, the coefficient of the first step."""


def _check_quantile(top_entropy_quantile) -> None:
    q = top_entropy_quantile
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q <= 1.0:
        raise ValueError(f"top_entropy_quantile must be in [0, 1] (0.2 in the paper), got {q!r}")


@TOKEN_MASKS.register("top_entropy", check=_check_quantile)
def top_entropy(entropies: Tensor, loss_tokens: Tensor, *, top_entropy_quantile: float = 0.2) -> Tensor:
    """The forking tokens: real tokens whose entropy is at least the (1 − ρ) quantile of the batch's.

    Args:
        entropies: ``(B, T)`` token entropies (nats).
        loss_tokens: ``(B, T)`` the tokens the loss reads (``StepData.loss_tokens``).
        top_entropy_quantile: ρ ∈ [0, 1]; 1 keeps every token, 0 only the highest-entropy one(s).

    Returns:
        ``(B, T)`` bool; all False for a batch without tokens.

    Example:
        >>> h = torch.tensor([[0.1, 2.0, 0.3, 0.0], [1.5, 0.2, 0.05, 9.0]])
        >>> top_entropy(h, torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]), top_entropy_quantile=0.3)
        tensor([[False,  True, False, False],
                [ True, False, False, False]])
    """
    _check_quantile(top_entropy_quantile)
    mask = loss_tokens.bool()
    values = entropies[mask].float().sort().values  # (N,)
    if not len(values):
        return torch.zeros_like(mask)
    rank = torch.tensor(1.0 - top_entropy_quantile, dtype=values.dtype, device=values.device) * (len(values) - 1)
    below = rank.long()
    threshold = torch.lerp(values[below], values[rank.ceil().long()], rank - below)  # torch.quantile's "linear"
    return (entropies >= threshold) & mask


def entropy_bonus(
    entropies: Tensor,
    loss_tokens: Tensor,
    agg: str = "token_mean",
    max_len: int | None = None,
    token_weights: Tensor | None = None,
) -> Tensor:
    """agg(w_t·H_t): the entropy term the loss subtracts c times (L ← L − c·bonus).

    Args:
        entropies: ``(B, T)`` token entropies of π_θ (differentiable: the bonus's gradient); a
            bf16/fp16 tensor is summed in float32 (a bf16 sum over thousands of tokens keeps 3
            significant digits), a float32 one as it is.
        loss_tokens: ``(B, T)`` the tokens the loss reads (``StepData.loss_tokens``).
        agg: the policy loss's aggregation (its normaliser counts every real token).
        max_len: ``max_new_tokens`` for ``seq_mean_token_sum_norm``.
        token_weights: ``(B, T)`` detached weights (a token mask); None: all 1.

    Returns:
        A float32 (or float64, for float64 entropies) scalar.

    Example:
        >>> h = torch.tensor([[1.0, 3.0, 7.0]])
        >>> entropy_bonus(h, torch.tensor([[1, 1, 0]])), entropy_bonus(h, torch.ones(1, 3), token_weights=torch.tensor([[0.0, 1.0, 1.0]]))
        (tensor(2.), tensor(3.3333))
    """
    values = entropies.float() if entropies.dtype in (torch.bfloat16, torch.float16) else entropies  # (B, T)
    values = values if token_weights is None else values * token_weights.detach()
    return aggregate(values, loss_tokens, agg, max_len)


@dataclass(frozen=True)
class EntropyState:
    """The entropy bonus's controller state, saved in checkpoints.

    Attributes:
        coef: the coefficient c.
        active: whether the next step applies it (Skywork-OR1's ``entropy_loss_enabled``).
    """

    coef: float
    active: bool = True

    @property
    def applied(self) -> float:
        """The coefficient the next step's loss uses: c, or 0 while inactive."""
        return self.coef if self.active else 0.0


def _finite(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _check_static(entropy_coef) -> None:
    if not _finite("entropy_coef", entropy_coef) > 0:
        raise ValueError(
            f"entropy_coef must be > 0 for a static bonus (0 is no bonus: remove model.entropy), got {entropy_coef!r}"
        )


def _check_adaptive(entropy_coef, entropy_target, entropy_coef_delta, entropy_coef_min, entropy_coef_max) -> None:
    c, lo, hi = (
        _finite(n, v)
        for n, v in (
            ("entropy_coef", entropy_coef),
            ("entropy_coef_min", entropy_coef_min),
            ("entropy_coef_max", entropy_coef_max),
        )
    )
    if not 0 <= lo <= c <= hi:
        raise ValueError(
            f"adaptive entropy needs 0 <= entropy_coef_min ({lo}) <= entropy_coef ({c}) <= entropy_coef_max ({hi})"
        )
    if not _finite("entropy_coef_delta", entropy_coef_delta) > 0:
        raise ValueError(f"entropy_coef_delta must be > 0, got {entropy_coef_delta!r}")
    if not _finite("entropy_target", entropy_target) > 0:
        raise ValueError(f"entropy_target must be > 0 (nats), got {entropy_target!r}")


@ENTROPY_CONTROLS.register("static", check=_check_static)
def static(state: EntropyState, entropy: float, *, entropy_coef: float) -> EntropyState:
    """A constant coefficient c = ``entropy_coef`` at every step.

    Example:
        >>> static(EntropyState(0.01), 3.0, entropy_coef=0.01)
        EntropyState(coef=0.01, active=True)
    """
    return EntropyState(entropy_coef, True)


@ENTROPY_CONTROLS.register("adaptive", check=_check_adaptive)
def adaptive(
    state: EntropyState,
    entropy: float,
    *,
    entropy_coef: float = 0.0,
    entropy_target: float = 0.2,
    entropy_coef_delta: float = 0.005,
    entropy_coef_min: float = 0.0,
    entropy_coef_max: float = 1.0,
) -> EntropyState:
    """Skywork-OR1's adaptive entropy control: c tracks a target entropy, applied only below it.

    Args:
        state: the coefficient and gate after the previous step (the first step: ``entropy_coef``, on).
        entropy: H, the entropy measured at this step (nats).
        entropy_coef: the coefficient of the first step.
        entropy_target: H_target.
        entropy_coef_delta: δ, the change per step.
        entropy_coef_min, entropy_coef_max: the bounds of c.

    Returns:
        The next state: c ± δ clipped to the bounds, active iff H < H_target.

    Example:
        >>> s = EntropyState(0.0)
        >>> for h in (0.1, 0.1, 0.5):
        ...     s = adaptive(s, h, entropy_coef_delta=0.01, entropy_target=0.2)
        ...     print(round(s.coef, 4), s.active, round(s.applied, 4))
        0.01 True 0.01
        0.02 True 0.02
        0.01 False 0.0
    """
    below = entropy < entropy_target
    coef = state.coef + entropy_coef_delta if below else state.coef - entropy_coef_delta
    return EntropyState(min(max(coef, entropy_coef_min), entropy_coef_max), below)


def initial_state(control: str, options: dict) -> EntropyState:
    """The controller's state before the first step: ``entropy_coef`` (the entry's default if unset), on.

    Example:
        >>> initial_state("adaptive", {"entropy_target": 0.3})
        EntropyState(coef=0.0, active=True)
    """
    return EntropyState(float({**ENTROPY_CONTROLS.defaults(control), **options}["entropy_coef"]), True)
