"""The recipe's typed option groups: what a user sets, each setting with one owner and one name.

:class:`~lit_rlvr.module.RLVRModule` takes one group per concept, and YAML reads by group
(``model.loss.advantage: passk``, ``model.sampling.n: 16``). Each group is a frozen dataclass
that jsonargparse (LightningCLI) reads and that checks itself in ``__post_init__``, naming the
key, the value and what is accepted, so a bad setting stops the run before any generation.
Names chosen from registries go through :meth:`lit_rlvr.registry.Registry.get_checked`.

======================  =================  ============================================================
group                   key                what it sets
======================  =================  ============================================================
:class:`PolicyOptions`  ``model.policy``   what to load: path, dtype, attention, checkpointing, LoRA
:class:`SamplingParams` ``model.sampling`` the rollouts: group size ``n``, temperature, top-p/k, length, seed
:class:`LossOptions`    ``model.loss``     the policy loss: advantage, loss, token mask (+ options), aggregation, clips
:class:`EntropyOptions` ``model.entropy``  the entropy bonus and its (adaptive) coefficient (None = off)
:class:`AnchorOptions`  ``model.anchor``   DPH-RL's f-divergence to π_ref on cached samples (None = off)
:class:`KLOptions`      ``model.kl``       the online KL(π_θ‖π_ref) penalty, the RKL baseline (None = off)
:class:`BatchingOptions` ``model.batching`` PPO epochs, mini-/micro-batches, token budget, packing
:class:`ScoringOptions` ``model.scoring``  the reward workers: processes, per-item deadline, reward options
:class:`EvalOptions`    ``model.evaluation`` pass@k budgets, retention reference, validation sampling
:class:`RolloutCorrection` ``model.rollout_correction`` importance weights sampler → trainer π_old (None = off)
:class:`DynamicSampling` ``model.dynamic_sampling`` DAPO's filter of groups with equal rewards (``true`` = defaults)
:class:`EnvironmentOptions` ``model.environment`` multi-turn rollouts: the environment, turn limits (None = single-turn)
======================  =================  ============================================================

The sampling group is shared: the rollout callback reads the module's (a Python user who builds
both gets one value, never two that disagree), and ``lit-rlvr cache`` takes the same class for
the reference samples. The default of ``model.optimizer``, :func:`default_optimizer`, is here too.
``docs/configuration.md`` lists every key.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor

from lit_rlvr.functional.advantages import ADVANTAGES
from lit_rlvr.functional.correction import CORRECTIONS, _check_bounds, correction_weights
from lit_rlvr.functional.divergences import DIVERGENCE_LEVELS, DIVERGENCES, f_divergence
from lit_rlvr.functional.entropy import ENTROPY_CONTROLS, TOKEN_MASKS, EntropyState, initial_state
from lit_rlvr.functional.losses import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    PolicyLoss,
    aggregate,
    checked_aggregation,
    checked_policy_loss,
    kl_estimate,
    policy_loss,
)
from lit_rlvr.functional.metrics import mixed_reward_rows
from lit_rlvr.policy.loading import LoraOptions, PolicyOptions
from lit_rlvr.policy.logprobs import MicroBatching, check_padding_free
from lit_rlvr.rewards.combine import RewardMix
from lit_rlvr.rewards.conventions import reward_reference
from lit_rlvr.rewards.report import RewardReport
from lit_rlvr.rewards.scorer import BatchScorer
from lit_rlvr.rollout.turns import EnvironmentOptions, TurnOptions
from lit_rlvr.rollout.types import DEFAULT_SAMPLING, SamplingParams  # noqa: F401  (DEFAULT_SAMPLING: re-exported)

__all__ = [
    "AnchorOptions",
    "BatchingOptions",
    "DynamicSampling",
    "EntropyOptions",
    "EnvironmentOptions",
    "EvalOptions",
    "KLOptions",
    "LoraOptions",
    "LossOptions",
    "PolicyOptions",
    "RolloutCorrection",
    "SamplingParams",
    "ScoringOptions",
    "TurnOptions",
    "default_optimizer",
]


def _positive(key: str, value, *, allow_none: bool = False, integer: bool = False, strict: bool = True) -> None:
    """Raise ``ValueError`` naming ``key`` unless ``value`` is a (finite) positive number (or None)."""
    if value is None and allow_none:
        return
    kind = int if integer else (int, float)
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (value > 0 if strict else value >= 0):
        what = ("an integer" if integer else "a number") + (" > 0" if strict else " >= 0")
        raise ValueError(f"{key} must be {what}{' or null' if allow_none else ''}, got {value!r}")


@dataclass(frozen=True)
class LossOptions:
    """The policy loss of the GRPO/DAPO family and its variants (docs/methods.md §1, §8).

    Args:
        advantage: an advantage estimator in :data:`~lit_rlvr.functional.ADVANTAGES`
            (``grpo``, ``rloo``, ``passk``, ``nsr``, ``unlikeliness``, …).
        advantage_options: its keyword options (``{k: 4}`` for ``passk``; ``{std: none}`` for
            Dr. GRPO's ``grpo``).
        aggregation: ``token_mean`` (DAPO) | ``seq_mean_token_mean`` (GRPO) |
            ``seq_mean_token_sum_norm`` (Dr. GRPO), or one registered with its normaliser.
        clip_low: ε_low of the clipped surrogate, in [0, 1] (1: no lower bound).
        clip_high: ε_high (clip-higher, DAPO).
        dual_clip: c of dual clip for negative advantages (None = off; > 1).
        policy_loss: the per-token loss in :data:`~lit_rlvr.functional.POLICY_LOSSES` (verl's
            ``loss_mode``): ``vanilla`` (the clipped surrogate), ``clip_cov``, ``kl_cov``.
        policy_loss_options: its options (``{clip_cov_ratio: 0.0002}``, verl's names).
        token_mask: the tokens the policy gradient acts on, in
            :data:`~lit_rlvr.functional.TOKEN_MASKS` (``top_entropy``: the forking tokens); None = all.
        token_mask_options: its options (``{top_entropy_quantile: 0.2}``, TRL's name).
    """

    advantage: str = "grpo"
    advantage_options: dict[str, Any] = field(default_factory=dict)
    aggregation: str = "token_mean"
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    policy_loss: str = "vanilla"
    policy_loss_options: dict[str, Any] = field(default_factory=dict)
    token_mask: str | None = None
    token_mask_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        ADVANTAGES.get_checked(
            self.advantage, "model.loss.advantage", self.advantage_options, "model.loss.advantage_options"
        )
        checked_aggregation(self.aggregation, "model.loss.aggregation")
        if not 0.0 <= self.clip_low <= 1.0:
            raise ValueError(f"model.loss.clip_low must be in [0, 1], got {self.clip_low!r}")
        _positive("model.loss.clip_high", self.clip_high, strict=False)
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(f"model.loss.dual_clip must be > 1 or null (off), got {self.dual_clip!r}")
        checked_policy_loss(self.policy_loss, self.policy_loss_options, self.dual_clip, "model.loss.policy_loss")
        if self.token_mask is not None:
            TOKEN_MASKS.get_checked(
                self.token_mask, "model.loss.token_mask", self.token_mask_options, "model.loss.token_mask_options"
            )
        elif self.token_mask_options:
            raise ValueError(
                f"model.loss.token_mask_options={self.token_mask_options} without a model.loss.token_mask; "
                f"set one of {sorted(TOKEN_MASKS)} or remove the options"
            )

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (a checkpoint's hyper-parameters): fields newer than the checkpoint get their defaults."""
        for f in fields(self):
            if f.name not in state:
                state[f.name] = f.default_factory() if f.default_factory is not MISSING else f.default
        self.__dict__.update(state)

    def with_advantage(
        self, advantage: str, options: dict[str, Any] | None = None, group_size: int | None = None
    ) -> LossOptions:
        """The same loss with another estimator (checked), e.g. a phase of :class:`~lit_rlvr.callbacks.AdvantageSchedule`.

        With ``group_size`` (``model.sampling.n``) also checks that the estimator can work with it:
        ``k`` of Pass@k at most n, and n at least the estimator's ``min_group_size``.
        """
        loss = replace(self, advantage=advantage, advantage_options=dict(options or {}))
        if group_size is None:
            return loss
        k = loss.advantage_options.get("k")
        if k is not None and not 1 <= k <= group_size:
            raise ValueError(f"model.loss.advantage_options.k={k} must be between 1 and model.sampling.n={group_size}")
        need = ADVANTAGES.trait(advantage, "min_group_size", loss.advantage_options, default=1)
        if group_size < need:
            raise ValueError(
                f"model.sampling.n={group_size}: advantage {advantage!r} compares the samples of a prompt with each "
                f"other and needs model.sampling.n >= {need} (with fewer, every advantage is 0 and the policy never learns)"
            )
        return loss

    @property
    def entry(self) -> PolicyLoss:
        """The policy loss's registry entry, checked with its options in ``__post_init__`` (not again per micro-batch)."""
        return POLICY_LOSSES[self.policy_loss]

    @property
    def selects_tokens(self) -> bool:
        """Whether the loss chooses tokens from π_θ's token statistics (a token mask, a covariance selection)."""
        return self.token_mask is not None or self.entry.select is not None

    def objective(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        max_len: int,
        token_weights: Tensor | None = None,
        selected: Tensor | None = None,
    ) -> tuple[Tensor, dict]:
        """L_exp of one micro-batch and its statistics: :attr:`entry` with these clips, options and
        aggregation on ``(b, T)`` log-probs (:func:`~lit_rlvr.functional.losses.policy_loss`, §1, §8)."""
        return policy_loss(
            logprobs,
            old_logprobs,
            advantages,
            mask,
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            dual_clip=self.dual_clip,
            agg=self.aggregation,
            max_len=max_len,
            token_weights=token_weights,
            loss=self.entry,
            options=self.policy_loss_options,
            selected=selected,
        )

    def kept_tokens(self, entropy: Tensor, mask: Tensor) -> Tensor:
        """``(B, T)`` float: the tokens :attr:`token_mask` keeps, from π_θ's token entropies ``(B, T)`` (§8.2)."""
        return TOKEN_MASKS[self.token_mask](entropy, mask, **self.token_mask_options).float()

    def covariance_selection(
        self, token_logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, generator: torch.Generator
    ) -> Tensor:
        """``(B, T)`` bool: the tokens :attr:`entry`'s selection picks (Clip-Cov, KL-Cov, §8.1) from π_θ's
        and π_old's log-probs and the per-token advantages, each ``(B, T)``."""
        return self.entry.choose(
            token_logprobs,
            old_logprobs,
            advantages,
            mask,
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            dual_clip=self.dual_clip,
            generator=generator,
            **self.policy_loss_options,
        )


@dataclass(frozen=True)
class EntropyOptions:
    """The entropy bonus L ← L − c·agg(H_t) and how its coefficient c moves (docs/methods.md §8.3).

    Args:
        control: an entry of :data:`~lit_rlvr.functional.ENTROPY_CONTROLS`: ``static`` (c =
            ``entropy_coef`` every step) or ``adaptive`` (Skywork-OR1's controller: c tracks a
            target entropy and applies only below it).
        options: its options, TRL's names: ``entropy_coef`` (c, or c at the first step),
            ``entropy_target``, ``entropy_coef_delta``, ``entropy_coef_min``, ``entropy_coef_max``.
    """

    control: str = "static"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        ENTROPY_CONTROLS.get_checked(self.control, "model.entropy.control", self.options, "model.entropy.options")

    def initial_state(self) -> EntropyState:
        """The coefficient's state before the first step (:func:`~lit_rlvr.functional.entropy.initial_state`)."""
        return initial_state(self.control, self.options)

    def next_state(self, state: EntropyState, entropy: float) -> EntropyState:
        """The coefficient's state after a step whose mean token entropy was ``entropy`` (:attr:`control`)."""
        return ENTROPY_CONTROLS[self.control](state, entropy, **self.options)

    def state_after(self, state: EntropyState, losses: list[dict[str, Tensor]], ranks: Any) -> EntropyState:
        """The coefficient's state after a training step of optimizer steps ``losses`` (each one's loss
        components), the same on every data-parallel rank (``ranks``: :class:`~lit_rlvr.lockstep.Lockstep`).

        The step's entropy is the mean over its optimizer steps of the micro-batches' token-mean
        entropies weighted as the loss weights them (their shares of the ranks' mean normaliser:
        with ``token_mean``, the token mean over every process's tokens), summed over the ranks.
        """
        entropy = (
            ranks.reduce(sum(float(parts.get("entropy", 0.0)) for parts in losses) / len(losses), "sum") / ranks.world
        )
        return self.next_state(state, entropy)


@dataclass(frozen=True)
class AnchorOptions:
    """DPH-RL's preservation term η·D_f(π_θ‖π_ref), estimated on cached π_ref samples only (docs/methods.md §2).

    Needs ``data.cache`` (the anchor samples come with the training batches).

    Args:
        coef: η, multiplies the mean over the anchor batch's units (> 0).
        divergence: a generator in :data:`~lit_rlvr.functional.DIVERGENCES` (``forward_kl`` =
            DPH-F, ``js`` = DPH-JS, ``alpha``, …).
        options: the generator's options (``{alpha: 0.5}``).
        level: ``token`` (per-token ratios, as released) or ``sequence`` (whole-sequence ratio).
        value_cap: cap on each per-unit f value with zero gradient beyond (None = uncapped, the
            exact divergence; 10.0 reproduces the DPH-RL release).
    """

    coef: float
    divergence: str = "forward_kl"
    options: dict[str, Any] = field(default_factory=dict)
    level: str = "token"
    value_cap: float | None = None

    def __post_init__(self):
        _positive("model.anchor.coef", self.coef)
        DIVERGENCES.get_checked(self.divergence, "model.anchor.divergence", self.options, "model.anchor.options")
        DIVERGENCE_LEVELS.get_checked(self.level, "model.anchor.level")
        _positive("model.anchor.value_cap", self.value_cap, allow_none=True)

    def divergence_loss(self, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
        """L_pef of one anchor micro-batch, before η: the f-divergence estimated on ``(b, T)`` log-probs of
        the cached π_ref samples (:func:`~lit_rlvr.functional.divergences.f_divergence`)."""
        return f_divergence(
            logprobs, ref_logprobs, mask, self.divergence, level=self.level, value_cap=self.value_cap, **self.options
        )


@dataclass(frozen=True)
class KLOptions:
    """The online penalty β·KL(π_θ‖π_ref) on the rollouts: the RKL baseline (docs/methods.md §1).

    π_ref runs online: the adapter-free base under LoRA, else a frozen copy of the initial policy
    (:class:`~lit_rlvr.policy.ReferencePolicy`).

    Args:
        coef: β (> 0).
        estimator: ``k1`` | ``k2`` | ``k3`` (Schulman's estimators), or a registered one.
        value_cap: cap on each per-token estimate (None = uncapped; 10.0 is verl's ``low_var_kl``).
    """

    coef: float
    estimator: str = "k3"
    value_cap: float | None = None

    def __post_init__(self):
        _positive("model.kl.coef", self.coef)
        KL_ESTIMATORS.get_checked(self.estimator, "model.kl.estimator")
        _positive("model.kl.value_cap", self.value_cap, allow_none=True)

    def penalty(self, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, aggregation: str, max_len: int) -> Tensor:
        """KL(π_θ‖π_ref) of one micro-batch, before β: the per-token estimate on ``(b, T)`` log-probs
        (:func:`~lit_rlvr.functional.losses.kl_estimate`), aggregated as the policy loss is."""
        kl = kl_estimate(logprobs, ref_logprobs, self.estimator, value_cap=self.value_cap)
        return aggregate(kl, mask, aggregation, max_len=max_len)


@dataclass(frozen=True)
class RolloutCorrection:
    """Correct the policy loss for a sampler that is not the trainer's π_old (docs/methods.md §1.8).

    When set, π_old is the trainer's own log-probs of the rollouts (one no-grad forward at rollout
    time) and each token's loss is weighted by the bounded importance ratio π_old / π_sampler
    (:func:`~lit_rlvr.functional.correction.correction_weights`): the sampler may run other kernels
    or precision (vLLM in bf16) or older weights (asynchronous rollouts). Names as TRL's
    ``vllm_importance_sampling_mode`` / ``_clip_max`` / ``_clip_min``.

    Args:
        mode: ``token_truncate`` | ``token_mask`` | ``sequence_truncate`` | ``sequence_mask``.
        clip_max: upper bound C_max of the ratio (truncated to it, or masked beyond it).
        clip_min: lower bound C_min (None: none; with ``*_mask``, IcePop's band).
    """

    mode: str = "token_truncate"
    clip_max: float | None = 3.0
    clip_min: float | None = None

    def __post_init__(self):
        CORRECTIONS.get_checked(self.mode, "model.rollout_correction.mode")
        _check_bounds(self.clip_min, self.clip_max)

    def weights(self, trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, dict]:
        """``(B, T)`` importance weights of the sampler's tokens and their statistics
        (:func:`~lit_rlvr.functional.correction.correction_weights`)."""
        return correction_weights(trainer_logprobs, sampler_logprobs, mask, self.mode, self.clip_max, self.clip_min)


@dataclass(frozen=True)
class DynamicSampling:
    """DAPO's dynamic sampling (``true``: on, with these defaults; None/``false``: off): train only on groups with mixed rewards (docs/methods.md §1.5).

    A group whose samples all got the same reward has zero advantage everywhere; DAPO filters
    them. A batch in which no group (on any rank) has mixed rewards takes no optimizer step, so
    a task that is too hard or too easy for the policy, or a reward that always fails, would
    draw batches for ever without reaching ``trainer.max_steps``: after
    ``max_batches_per_step`` such batches in a row the run stops with an error that says what the
    rewards were (verl's ``filter_groups.max_num_gen_batches``). ``model.dynamic_sampling: true``
    is this group with its defaults.

    Args:
        max_batches_per_step: batches drawn in a row without an optimizer step before the run
            stops (>= 1).
    """

    max_batches_per_step: int = 10

    def __post_init__(self):
        _positive("model.dynamic_sampling.max_batches_per_step", self.max_batches_per_step, integer=True)

    @staticmethod
    def rows_to_train(rewards: Tensor, group_ids: Tensor) -> Tensor:
        """``(B,)`` bool: the rows of groups with mixed rewards."""
        return mixed_reward_rows(rewards, group_ids)

    def check_progress(self, unstepped: Sequence[Counter]) -> None:
        """Raise once ``max_batches_per_step`` batches in a row took no optimizer step.

        Args:
            unstepped: :func:`group_outcomes` of each batch since the last optimizer step (the
                same number on every rank, so every rank raises at the same batch; the message
                counts this rank's groups).
        """
        if len(unstepped) < self.max_batches_per_step:
            return
        seen: Counter = Counter()
        for outcome in unstepped:
            seen.update(outcome)
        constant = ", ".join(f"{n} with every reward {key}" for key, n in sorted(seen.items()) if key != "groups")
        raise RuntimeError(
            f"dynamic sampling: 0 of {seen['groups']} groups had mixed rewards in the last {self.max_batches_per_step} "
            f"batches on this rank ({constant}), so no optimizer step was taken and trainer.max_steps cannot be reached. "
            "The task is too hard or too easy for the policy, or the reward fails (see train/reward_status/*); raise "
            "model.dynamic_sampling.max_batches_per_step to draw more batches per step"
        )


def group_outcomes(rewards: Tensor, group_ids: Tensor) -> Counter:
    """How many groups there are, and how many have each constant reward.

    Example:
        >>> group_outcomes(torch.tensor([1., 1., 0., 1., 0., 0.]), torch.tensor([0, 0, 1, 1, 2, 2]))
        Counter({'groups': 3, '1': 1, '0': 1})
    """
    out = Counter(groups=len(torch.unique(group_ids)))
    for g in torch.unique(group_ids):
        values = rewards[group_ids == g]
        if bool((values == values[0]).all()):
            out[f"{float(values[0]):g}"] += 1
    return out


@dataclass(frozen=True)
class BatchingOptions:
    """How one rollout batch becomes optimizer steps and forward passes (docs/methods.md §5).

    Args:
        ppo_epochs: passes over each rollout batch.
        mini_batch_size: rows per optimizer step (None = the whole rollout batch).
        micro_batch_size: rows per forward/backward (None = the whole mini-batch).
        micro_batch_tokens: tokens per forward/backward, padding included (verl's
            ``ppo_max_token_len_per_gpu`` with ``use_dynamic_bsz``; None = no budget). Rows are
            grouped longest first so rows of similar length share a micro-batch, each cropped to
            its longest row; a row longer than the budget is a micro-batch of its own. Also
            bounds every no-grad log-prob pass.
        padding_free: pack each micro-batch's rows end to end instead of padding them: ``auto``
            (where measured faster: flash-attention's varlen kernel anywhere, sdpa on CPU),
            ``true`` (wherever the attention keeps packed sequences apart), ``false``. Same
            log-probs (:func:`~lit_rlvr.policy.packs_sequences`).
        shared_prompts: forward each distinct prompt of a micro-batch once and run its rows'
            completions on its keys and values (shared-prefix forward, Liu et al. 2025): the G samples
            of a group share their prompt, so the prompt's forward and backward are done once, not G
            times. Same log-probs to float rounding (:func:`~lit_rlvr.policy.shares_prompts`); takes the
            place of packing; not with gradient checkpointing.
    """

    ppo_epochs: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int | None = None
    micro_batch_tokens: int | None = None
    padding_free: bool | Literal["auto"] = "auto"
    shared_prompts: bool = False

    def __post_init__(self):
        _positive("model.batching.ppo_epochs", self.ppo_epochs, integer=True)
        for key in ("mini_batch_size", "micro_batch_size", "micro_batch_tokens"):
            _positive(f"model.batching.{key}", getattr(self, key), allow_none=True, integer=True)
        check_padding_free(self.padding_free)
        if not isinstance(self.shared_prompts, bool):
            raise ValueError(f"model.batching.shared_prompts must be true or false, got {self.shared_prompts!r}")
        if self.shared_prompts and self.padding_free is True:
            raise ValueError(
                "model.batching: shared_prompts: true runs the padded forward in two parts, padding_free: true packs "
                "it: choose one (padding_free: auto gives way to shared_prompts)"
            )

    @property
    def micro_batching(self) -> MicroBatching:
        """The row cap, token budget and packing of every forward pass."""
        return MicroBatching(self.micro_batch_size, self.micro_batch_tokens, self.padding_free, self.shared_prompts)


@dataclass(frozen=True)
class ScoringOptions:
    """The rewards and their scorer: killable worker processes, a per-item deadline, options per reward.

    Shared by training (``model.scoring``) and ``lit-rlvr cache`` (``scoring``). Names as TRL's
    ``reward_funcs`` / ``reward_weights`` (:mod:`lit_rlvr.rewards.combine`).

    Args:
        workers: reward worker processes (0 = score in the training process: the deadline then
            interrupts the reward between Python bytecodes, so a single long C call finishes first).
        timeout_s: per-item deadline in seconds (soft in the reward, hard by killing its worker).
        options: ``{reward name: {option: value}}``, e.g. ``{sql: {mode: bird}}``; names, options
            and values are checked here. For an imported function (``reward_funcs``), keyword
            arguments of every call (verl's ``custom_reward_function.reward_kwargs``); for a
            factory (a function annotated ``-> Callable``, as TRL's ``get_soft_overlong_punishment``),
            its arguments, under the factory's name.
        reward_funcs: the rewards every completion is scored with (null = each row's own
            ``reward`` field; the entry ``row`` is that field among others): registered names
            (``math``, ``sql``) or import paths of functions
            written for TRL (``f(prompts, completions, completion_ids, trainer_state, **columns)``),
            verl (``compute_score(data_source, solution_str, ground_truth, extra_info)``, or any
            of those arguments: each function gets the ones its signature takes) or lit_rlvr, as
            ``pkg.module.fn``, ``pkg.module:fn`` or ``path/to/file.py:fn``
            (:mod:`lit_rlvr.rewards.conventions`); in Python also the functions themselves (a
            picklable one runs in the workers; a lambda or closure in the training process, with a
            warning). Each is logged as ``train/reward/<name>`` (a function's name is TRL's: its
            ``__name__``). Whether every row can be scored, and a function called on the first
            row, is checked at start-up.
        reward_weights: one weight per ``reward_funcs`` entry (null = all 1; not all 0); the
            training reward is the weighted sum over the rewards that apply (a None is left out,
            as in TRL).
        correctness: the name of the ``reward_funcs`` entry that decides correctness: Pass@k,
            maj@k, pass counts and the reference cache count a completion as correct when this
            reward is > 0.5 (1 of a 0/1 reward, +1 of verl's -1/+1). Needed with several; a reward
            that declares its values (``math``, ``sql``) and never exceeds 0.5 is refused at start-up.
        whole_batch: names of TRL functions in ``reward_funcs`` called once per batch with every
            completion, as TRL calls them, for rewards that compare the completions with each
            other (lists of one would silently make each completion its own batch). They run in
            the training process under the per-item deadline times the batch's completions (no
            worker to kill), and a failure scores the whole batch 0 (status ``error``).
        max_failed_steps: training batches in a row on which a reward may raise on every item (on
            every rank) before the run stops with an error naming it and showing its traceback
            (null: never stop). Timeouts do not count; every failure is logged, naming the reward.
            Multi-turn: also the training batches in a row on which every trajectory's environment may
            fail (raise or hang, on every rank) before the run stops naming the reasons.
    """

    workers: int = 2
    timeout_s: float = 10.0
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    reward_funcs: list[str | Callable] | None = None
    reward_weights: list[float] | None = None
    correctness: str | None = None
    whole_batch: list[str] | None = None
    max_failed_steps: int | None = 3

    def __post_init__(self):
        _positive("scoring.workers", self.workers, integer=True, strict=False)
        _positive("scoring.timeout_s", self.timeout_s)
        _positive("scoring.max_failed_steps", self.max_failed_steps, integer=True, allow_none=True)
        self.mix()  # every name, path, weight and option checked now

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (``torch.load(weights_only=True)`` refuses a pickled function): a reward given as a
        Python function is kept as its import path, as :func:`plain` keeps it."""
        return {
            f.name: _plain_value(getattr(self, f.name)) if f.name == "reward_funcs" else getattr(self, f.name)
            for f in fields(self)
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (a checkpoint of an earlier version): fields newer than it get their defaults."""
        for f in fields(self):
            if f.name not in state:
                state[f.name] = f.default_factory() if f.default_factory is not MISSING else f.default
        self.__dict__.update(state)

    def mix(self) -> RewardMix:
        """The rewards, weights and correctness term (:class:`~lit_rlvr.rewards.combine.RewardMix`), checked."""
        return RewardMix.from_config(
            self.reward_funcs, self.reward_weights, self.correctness, self.options, whole_batch=self.whole_batch
        )

    def scorer(self, **kwargs) -> BatchScorer:
        """A :class:`~lit_rlvr.rewards.BatchScorer` for these rewards (``kwargs`` override, e.g. ``workers``)."""
        mix = self.mix()
        settings = {
            "workers": self.workers,
            "timeout_s": self.timeout_s,
            "options": mix.scorer_options,
            "rewards": mix.records,
        }
        return BatchScorer(**{**settings, **kwargs})

    def report(self, mix: RewardMix) -> RewardReport:
        """What each scored batch of ``mix`` (:meth:`mix`) came to, for the logs: each reward's mean where
        there are several, and the run stopped after :attr:`max_failed_steps` failing training batches
        (:class:`~lit_rlvr.rewards.report.RewardReport`)."""
        return RewardReport(mix.names if mix.terms else [], self.max_failed_steps)


@dataclass(frozen=True)
class EvalOptions:
    """Validation: which pass@k budgets are reported, against which base, sampled how.

    The samples per prompt are each validation set's ``n_samples`` (``data.val``); the sampling
    settings below override the training ones (``model.sampling``) when given.

    Args:
        pass_k: k values reported (None = 1, 2, 4, … up to each set's n; those above a set's n
            are dropped).
        retention_reference: a JSON file of the base policy's per-prompt pass counts (written by
            :class:`~lit_rlvr.callbacks.PassCountsWriter`); retention@k is pass@k over the prompts
            it solved at least once. Without it, the reference cache's base pass counts
            (training prompts) are used when ``data.cache`` is set.
        temperature: validation temperature (None = the training one).
        top_p: validation nucleus mass (None = the training one; the Pass@k paper used 0.95).
        top_k: validation top-k (None = the training one).
        max_new_tokens: validation length cap (None = the training one).
    """

    pass_k: list[int] | None = None
    retention_reference: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None

    def __post_init__(self):
        for k in self.pass_k or []:
            _positive("model.evaluation.pass_k", k, integer=True)
        self.sampling(SamplingParams())  # the overrides are valid sampling values

    def sampling(self, train: SamplingParams) -> SamplingParams:
        """The validation sampling: ``train`` with this group's overrides (``n`` is set per set)."""
        overrides = {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")}
        return replace(train, n=1, **{k: v for k, v in overrides.items() if v is not None})

    def reference_pass_counts(self) -> dict[str, dict[str, int]] | None:
        """``retention_reference`` read: ``{set name: {prompt id: correct samples}}`` (None without one)."""
        if self.retention_reference is None:
            return None
        try:
            return json.loads(Path(self.retention_reference).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(
                f"model.evaluation.retention_reference: cannot read {self.retention_reference!r} as JSON ({err})"
            ) from err


_FUSED_ADAMW_DEVICES = ("cpu", "cuda", "xpu", "mps")  # where torch has a fused AdamW kernel


def default_optimizer(params) -> torch.optim.Optimizer:
    """AdamW at the papers' learning rate (1e-6; docs/methods.md §2–3), fused where torch has the kernel.

    The fused kernel is the same update (as Hugging Face ``Trainer``'s default
    ``adamw_torch_fused``) in one call over all parameters, where the default CPU implementation
    loops over them in Python (one CPU thread, measured: 0.67 vs 2.55 ms a step for 1.1M parameters,
    6.2 vs 33.5 ms for 9.9M).
    """
    params = list(params)
    devices = {p.device.type for p in params}
    fused = bool(params) and devices <= set(_FUSED_ADAMW_DEVICES) and all(p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0, fused=fused or None)


def optimizers(params, optimizer: Callable, lr_scheduler: Callable | None = None):
    """What ``configure_optimizers`` returns: ``optimizer(params)`` of the trainable parameters, with
    ``lr_scheduler(optimizer)`` stepped once per optimizer step when given (LightningCLI's factories)."""
    made = optimizer([p for p in params if p.requires_grad])
    if lr_scheduler is None:
        return made
    return {"optimizer": made, "lr_scheduler": {"scheduler": lr_scheduler(made)}}


def completion_budget(
    sampling: SamplingParams, environment: EnvironmentOptions | None, where: str = "model.sampling.max_new_tokens"
) -> int:
    """A completion's token budget, Dr. GRPO's normaliser: ``max_new_tokens``, or a multi-turn trajectory's total.

    Raises:
        ValueError: a multi-turn ``max_total_tokens`` smaller than one turn (``sampling.max_new_tokens``,
            set by ``where``, when ``max_turn_tokens`` is not set).
    """
    if environment is None:
        return sampling.max_new_tokens
    environment.check_budget(environment.turn_tokens(sampling), where)
    return environment.turns.total_tokens(sampling)


G = TypeVar("G")


def as_group(cls: type[G], value: G | Mapping[str, Any] | None) -> G | None:
    """``value`` as option group ``cls``: a group as it is, a mapping (a checkpoint's or a logger's
    plain hyper-parameters, :func:`plain`) read into one, None as None.

    Example:
        >>> as_group(KLOptions, {"coef": 0.1}), as_group(KLOptions, None)
        (KLOptions(coef=0.1, estimator='k3', value_cap=None), None)
    """
    if value is None or isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{cls.__name__}: expected {cls.__name__} or a mapping of its fields, got {type(value).__name__}"
        )
    values = dict(value)
    for f in fields(cls):  # the one nested group: model.policy.lora
        if f.name == "lora" and isinstance(values.get("lora"), Mapping):
            values["lora"] = LoraOptions(**values["lora"])
        if f.name == "stop" and isinstance(values.get("stop"), list):
            values["stop"] = tuple(values["stop"])
    return cls(**values)


MODULE_GROUPS: dict[str, type] = {
    "policy": PolicyOptions,
    "sampling": SamplingParams,
    "loss": LossOptions,
    "anchor": AnchorOptions,
    "kl": KLOptions,
    "entropy": EntropyOptions,
    "batching": BatchingOptions,
    "scoring": ScoringOptions,
    "evaluation": EvalOptions,
    "rollout_correction": RolloutCorrection,
    "dynamic_sampling": DynamicSampling,
    "environment": EnvironmentOptions,
}  # RLVRModule's arguments that are option groups (``model.<key>``), in the order of its hyper-parameters


def module_groups(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`~lit_rlvr.module.RLVRModule`'s option groups from its arguments (keyed as
    :data:`MODULE_GROUPS`), each read by :func:`as_group` (a checkpoint's plain hyper-parameters
    into the group); ``dynamic_sampling: true`` is that group's defaults, ``false`` off. The
    training rollouts must be sampled (``model.sampling.temperature`` > 0).

    Example:
        >>> groups = module_groups({"sampling": DEFAULT_SAMPLING, "kl": {"coef": 0.1}, "dynamic_sampling": True})
        >>> groups["kl"], groups["dynamic_sampling"], groups["anchor"]
        (KLOptions(coef=0.1, estimator='k3', value_cap=None), DynamicSampling(max_batches_per_step=10), None)
    """
    groups = {key: as_group(cls, arguments.get(key)) for key, cls in MODULE_GROUPS.items() if key != "dynamic_sampling"}
    dynamic = arguments.get("dynamic_sampling")
    groups["dynamic_sampling"] = DynamicSampling() if dynamic is True else as_group(DynamicSampling, dynamic or None)
    sampling = groups["sampling"]
    if sampling.temperature <= 0:
        raise ValueError(f"model.sampling.temperature must be > 0 (sampled rollouts), got {sampling.temperature}")
    return {key: groups[key] for key in MODULE_GROUPS}


def plain(value: Any) -> Any:
    """An option group as plain data (nested dicts, lists, numbers, strings), as loggers and checkpoints store it.

    A reward function given in Python (``model.scoring.reward_funcs``) becomes its import path
    (:func:`~lit_rlvr.rewards.conventions.reward_reference`).

    Example:
        >>> plain(AnchorOptions(coef=0.5))
        {'coef': 0.5, 'divergence': 'forward_kl', 'options': {}, 'level': 'token', 'value_cap': None}
    """
    if not is_dataclass(value) or isinstance(value, type):
        return value
    return asdict(value, dict_factory=lambda items: {k: _plain_value(v) for k, v in items})


def _plain_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain_value(v) for v in value]
    return reward_reference(value) if callable(value) else value


GROUPS = (
    PolicyOptions,
    LoraOptions,
    SamplingParams,
    LossOptions,
    EntropyOptions,
    AnchorOptions,
    KLOptions,
    BatchingOptions,
    ScoringOptions,
    EvalOptions,
    RolloutCorrection,
    DynamicSampling,
    EnvironmentOptions,
    TurnOptions,
)
# checkpoints hold the module's option groups as its hyper-parameters: plain data, safe to unpickle with
# torch.load(weights_only=True), which Lightning uses to resume
torch.serialization.add_safe_globals([*GROUPS, (LoraOptions, "lit_rlvr.policy.LoraOptions")])  # the latter: 0.1's path
