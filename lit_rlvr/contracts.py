"""What flows between the pieces: the batches, the step's tensors, and what callbacks require of the LightningModule.

The DataModule makes :class:`TrainBatch` and :class:`ValBatch` objects; the rollout callback
fills their ``rollouts`` before Lightning hands the same object to ``training_step`` /
``validation_step``, which turns them into one :class:`StepData` (and the cache's
:class:`AnchorBatch`): typed, row-aligned tensors with one ``select`` and one splitter into
micro-batches, so a misspelled field is an error rather than a silently missing term (verl's
``DataProto`` is the model). A callback states what it needs from the module as a Protocol
(:class:`RolloutHost`, :class:`PolicyHost`, :class:`AdvantageHost`) and checks it at set-up with
:func:`require`, so a module that lacks a piece fails with the missing names, not with an
``AttributeError`` in the middle of a run. :class:`~lit_rlvr.module.RLVRModule` satisfies all of
them; so must a user's module that replaces it. The module's own checks of what reaches it are
here too: :func:`require_rollouts` of each batch, :func:`check_prompt_data` of the DataModule
and :func:`check_trainer` of the Trainer once at set-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor, nn

from lit_rlvr.functional.advantages import ADVANTAGES
from lit_rlvr.functional.batching import crop_padding
from lit_rlvr.policy.logprobs import MicroBatching
from lit_rlvr.rollout.turns import EnvironmentOptions, rows_scored_by_rewards
from lit_rlvr.rollout.types import Rollouts, SamplingParams

R = TypeVar("R", bound="RowTensors")


class StartupError(ValueError):
    """A run refused at set-up, before any generation: the data, a reference cache or a setting does not
    fit the run, and the message names what to change. ``lit-rlvr`` ends with the message and exit status
    2, as a configuration it refuses (``lit_rlvr.cli``); from Python it is raised, its cause chained."""


class RowTensors:
    """Row-aligned tensors in the padded layout of :meth:`~lit_rlvr.rollout.types.Rollouts.to_padded`.

    A dataclass of tensors whose first dimension is the row (B): ``input_ids`` and
    ``attention_mask`` ``(B, Lp+T)`` (prompts left-padded), per-token fields ``(B, T)``
    (completions right-padded), per-row fields ``(B,)``; an optional field is None when absent.
    Subclasses are ``slots`` dataclasses, so assigning a misspelled field raises too.
    """

    __slots__ = ()

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor

    def present(self) -> dict[str, Tensor]:
        """The fields that are set, by name."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def need(self, name: str) -> Tensor:
        """Field ``name``, or a ``ValueError`` saying that this step has none (an option that needs it is off)."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{type(self).__name__}.{name} is not set for this step, but a term of the loss needs it")
        return value

    def select(self: R, idx: Tensor | slice) -> R:
        """The rows ``idx`` (an index or bool tensor, or a slice) of every field."""
        return replace(self, **{k: v[idx] for k, v in self.present().items()})

    def to(self: R, device: torch.device | str) -> R:
        return replace(self, **{k: v.to(device) for k, v in self.present().items()})

    def crop(self: R) -> R:
        """Without the columns that are padding in every row (:func:`~lit_rlvr.functional.batching.crop_padding`)."""
        return replace(self, **crop_padding(self.present()))

    def micro_batches(self: R, batching: MicroBatching, packed: bool) -> list[R]:
        """This batch split once into forward passes: length-sorted rows under ``batching``'s row cap and
        token budget (:meth:`~lit_rlvr.policy.MicroBatching.split`; ``packed``: the budget of the
        padding-free forward), each micro-batch cropped to its own longest prompt and completion.
        Each is exactly one forward."""
        rows = batching.split(self.attention_mask, self.response_mask, packed)
        return [self.select(idx).crop() for idx in rows]

    @property
    def forward_args(self) -> tuple[Tensor, Tensor, int]:
        """``(input_ids, attention_mask, T)``: what a forward over these rows takes, T the completion
        columns it returns log-probs of (:func:`~lit_rlvr.policy.completion_logprobs`)."""
        return self.input_ids, self.attention_mask, self.response_mask.shape[1]

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(slots=True)
class StepData(RowTensors):
    """One training step's tensors on this rank: B rollouts of P prompts × G samples, prompt-major.

    Made once per step by :class:`~lit_rlvr.module.RLVRModule` from the batch's rollouts, the
    rewards and π_θ at the start of the step; mini-batches are :meth:`select` of it and
    micro-batches its :meth:`micro_batches`, so every field travels with its rows.

    Attributes:
        input_ids: ``(B, Lp+T)`` prompt + completion tokens.
        attention_mask: ``(B, Lp+T)``.
        response_mask: ``(B, T)`` real completion tokens (what the forward scores).
        old_logprobs: ``(B, T)`` log π_old: the sampler's, or the trainer's at the start of the step.
        group_ids: ``(B,)`` the prompt of each row.
        rewards: ``(B,)`` Σ_k w_k r_k.
        advantages: ``(B,)`` or ``(B, T)``; None until the estimator has run (the loss needs it).
        ref_logprobs: ``(B, T)`` log π_ref for the online KL term (None without it).
        is_weights: ``(B, T)`` the rollout correction's importance weights (None without it).
        token_mask: ``(B, T)`` float, the token mask's kept tokens (forking tokens; None = all).
        selected: ``(B, T)`` bool, the policy loss's covariance selection (Clip-Cov, KL-Cov).
        entropies: ``(B,)`` each row's mean token entropy under π_θ at the start of the step.
        token_logprobs: ``(B, T)`` π_θ's log-probs at the start of the step (for the selections).
        token_entropy: ``(B, T)`` π_θ's token entropies at the start of the step.
        loss_mask: ``(B, T)`` the completion tokens the losses act on (multi-turn: the model's
            tokens 1, the environment's 0); None = every completion token (:attr:`loss_tokens`).
        valid: ``(B,)`` bool, multi-turn: the rows whose environment did not fail, the only ones the
            advantage's group statistics see (:func:`~lit_rlvr.functional.advantages.valid_row_advantages`);
            None = every row (single-turn).
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    old_logprobs: Tensor
    group_ids: Tensor
    rewards: Tensor
    advantages: Tensor | None = None
    ref_logprobs: Tensor | None = None
    is_weights: Tensor | None = None
    token_mask: Tensor | None = None
    selected: Tensor | None = None
    entropies: Tensor | None = None
    token_logprobs: Tensor | None = None
    token_entropy: Tensor | None = None
    loss_mask: Tensor | None = None
    valid: Tensor | None = None

    @classmethod
    def from_rollouts(cls, rollouts: Rollouts, pad_id: int, rewards: Tensor) -> StepData:
        """The padded rollouts (:meth:`~lit_rlvr.rollout.types.Rollouts.to_padded`) with their ``(B,)`` rewards
        and, multi-turn, which rows' environments did not fail."""
        behaviour = rollouts.behaviour()
        valid = None if behaviour is None else ~behaviour[3]
        return cls(**rollouts.to_padded(pad_id), rewards=rewards, valid=valid)

    @property
    def loss_tokens(self) -> Tensor:
        """``(B, T)`` the tokens every loss, divergence, entropy term and token statistic acts on."""
        return self.response_mask if self.loss_mask is None else self.response_mask * self.loss_mask

    @property
    def token_weights(self) -> Tensor | None:
        """``(B, T)`` detached weights of each token's policy loss: the importance weights times the token mask (None: all 1)."""
        weights = [w for w in (self.is_weights, self.token_mask) if w is not None]
        return torch.stack(weights).prod(0) if weights else None


@dataclass(slots=True)
class AnchorBatch(RowTensors):
    """DPH-RL anchor samples from the reference cache: A cached π_ref completions of D_pef prompts.

    Attributes:
        input_ids: ``(A, L)`` prompt + completion tokens (the ``Rollouts.to_padded`` layout).
        attention_mask: ``(A, L)``.
        response_mask: ``(A, T)`` real completion tokens.
        ref_logprobs: ``(A, T)`` the stored log π_ref of each completion token (temperature 1).
        rewards: ``(A,)`` the cached rewards.
        loss_mask: ``(A, T)`` a multi-turn cache's model tokens (1; the environment's 0); None = every
            completion token.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    ref_logprobs: Tensor
    rewards: Tensor
    loss_mask: Tensor | None = None

    @property
    def loss_tokens(self) -> Tensor:
        """``(A, T)`` the tokens the divergence acts on: every cached completion token the model sampled."""
        return self.response_mask if self.loss_mask is None else self.response_mask * self.loss_mask

    def tensors(self) -> dict[str, Tensor]:
        """The fields by name."""
        return self.present()


@dataclass
class TrainBatch:
    """One training step's prompts (per rank), as the DataModule serves them.

    Attributes:
        rows: P prompt rows (``id``, ``prompt``, ``answer``, ``reward``, extras).
        prompt_ids: P lists of prompt token ids.
        anchor: the step's DPH-RL anchor samples (None without a cache or anchors).
        rollouts: P·G completions, set by :class:`~lit_rlvr.callbacks.RolloutCallback` before
            ``training_step`` (None until then).
        position: ``(epoch, step)`` of the batch in the prompt order (the DataModule records it
            to resume mid-epoch; asynchronous rollouts match it to what they generated ahead).
    """

    rows: list[dict]
    prompt_ids: list[list[int]]
    anchor: AnchorBatch | None = None
    rollouts: Rollouts | None = None
    position: tuple[int, int] | None = None


@dataclass
class ValBatch:
    """A batch of one validation set's prompts (this rank's share).

    Attributes:
        rows: P prompt rows.
        prompt_ids: P lists of prompt token ids.
        padding: P booleans: repeats that only keep the ranks in step (generated, never counted).
        set_name: the validation set's name (its metrics are ``val/<set_name>/…``).
        n_samples: completions per prompt for this set.
        rollouts: P·n completions, set by the rollout callback (None until then).
    """

    rows: list[dict]
    prompt_ids: list[list[int]]
    padding: list[bool]
    set_name: str
    n_samples: int
    rollouts: Rollouts | None = None

    def counted(self, rollouts: Rollouts) -> tuple[list[dict], Rollouts]:
        """The prompt rows that count and their share of ``rollouts`` (this batch's): the padding prompts
        only keep the ranks in step (:class:`~lit_rlvr.data.EvalShardSampler`), generated, never counted."""
        real = [p for p, pad in enumerate(self.padding) if not pad]
        return [self.rows[p] for p in real], rollouts.of_prompts(real)


@runtime_checkable
class PolicyHost(Protocol):
    """A module with a transformers policy and its tokenizer (:class:`~lit_rlvr.callbacks.HFExport`)."""

    policy: nn.Module
    tokenizer: Any


class Ranks(Protocol):
    """The data-parallel ranks in lock step (:class:`~lit_rlvr.lockstep.Lockstep`)."""

    def most(self, passes: int) -> int:
        """The number of forward passes every rank runs when this rank has ``passes``: the most any rank has."""
        ...


@runtime_checkable
class RolloutHost(Protocol):
    """What :class:`~lit_rlvr.callbacks.RolloutCallback` needs from the module.

    ``sampling`` is the training rollouts' (its ``n`` is the group size G), ``val_sampling`` the
    validation rollouts' (``n`` comes from each set), ``environment`` the multi-turn environment
    (:class:`~lit_rlvr.rollout.turns.EnvironmentOptions`; None: single-turn rollouts); ``micro_batching`` bounds the drift pass,
    and ``lockstep.most(passes)`` is the number of forward passes every data-parallel rank runs
    when this one has ``passes`` (FSDP's forwards are collectives).
    """

    policy: nn.Module
    tokenizer: Any
    sampling: SamplingParams
    val_sampling: SamplingParams
    environment: EnvironmentOptions | None
    micro_batching: Any
    lockstep: Ranks


@runtime_checkable
class PromptData(Protocol):
    """What :class:`~lit_rlvr.module.RLVRModule` and :class:`~lit_rlvr.callbacks.RolloutCallback` read
    from the DataModule given to ``Trainer.fit`` / ``validate``, checked at set-up with :func:`require`.

    :class:`~lit_rlvr.data.PromptDataModule` provides it. A user's DataModule must too, so that no
    start-up check is skipped for want of an attribute; training on plain dataloaders (no
    DataModule) skips these checks.

    Attributes:
        tokenizer: the tokenizer whose ids the prompts are (compared with the policy's at set-up;
            None: not loaded, not compared).
        reference_cache: DPH-RL's reference cache (None without one): its log π_ref must be the policy's.
        base_pass_counts: π_ref's pass count per prompt id (retention@k; None without a cache).
        val_samples_per_prompt: ``{validation set name: samples per prompt}``.
    """

    tokenizer: Any
    reference_cache: Any
    base_pass_counts: Mapping[str, int] | None
    val_samples_per_prompt: Mapping[str, int]

    def all_rows(self) -> list[dict]:
        """Every row, so that the rewards can check each one can be scored before any generation."""
        ...

    def fit_context(self, context: int, train_new_tokens: int, val_new_tokens: int, where: str) -> None:
        """Set aside (as bad rows) the prompts too long for the engine's ``context`` with these completion budgets."""
        ...


@runtime_checkable
class PromptSource(Protocol):
    """What asynchronous rollouts need from the DataModule: the batches ahead of the train loader
    (their prompt ids, and their rows, which multi-turn rollouts reset the environments with).

    :class:`~lit_rlvr.data.PromptDataModule` provides it; its batches carry their ``position``
    ``(epoch, step)``, the same as the arguments here.
    """

    def train_prompt_ids_at(self, epoch: int, step: int) -> list[list[int]]: ...

    def train_rows_at(self, epoch: int, step: int) -> list[dict]: ...


@runtime_checkable
class AdvantageHost(Protocol):
    """What :class:`~lit_rlvr.callbacks.AdvantageSchedule` needs: the current estimator and a checked switch."""

    advantage_name: str
    advantage_options: dict

    def set_advantage(self, name: str, options: dict | None = None) -> None: ...


def require(module: object, protocol: type, who: str, role: str = "LightningModule") -> None:
    """Raise ``TypeError`` naming what ``module`` lacks of ``protocol`` (needed by ``who`` of the ``role``).

    Example:
        >>> require(object(), PolicyHost, "HFExport")
        Traceback (most recent call last):
        ...
        TypeError: HFExport needs the LightningModule to provide PolicyHost: object has no policy, tokenizer
    """
    if isinstance(module, protocol):
        return
    wanted = [name for name in _members(protocol) if not hasattr(module, name)]
    raise TypeError(
        f"{who} needs the {role} to provide {protocol.__name__}: {type(module).__name__} has no {', '.join(wanted)}"
    )


def _members(protocol: type) -> list[str]:
    names = list(getattr(protocol, "__annotations__", {}))
    names += [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]
    return list(dict.fromkeys(names))


def checked_batch(batch: Any, kinds: type | tuple[type, ...], who: str) -> Any:
    """``batch`` if it is one of ``kinds`` (the DataModule's batches), else a ``TypeError`` naming ``who`` and them.

    Example:
        >>> checked_batch({"rows": []}, TrainBatch, "RolloutCallback")
        Traceback (most recent call last):
        ...
        TypeError: RolloutCallback takes lit_rlvr.contracts.TrainBatch batches (PromptDataModule makes them), got dict
    """
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(batch, kinds):
        raise TypeError(
            f"{who} takes lit_rlvr.contracts.{' / '.join(k.__name__ for k in kinds)} batches (PromptDataModule makes "
            f"them), got {type(batch).__name__}"
        )
    return batch


def require_rollouts(batch: TrainBatch | ValBatch) -> Rollouts:
    """The rollouts the rollout callback attached to ``batch`` (P·n completions), what
    :class:`~lit_rlvr.module.RLVRModule` trains and validates on; an error saying what is missing otherwise."""
    if checked_batch(batch, (TrainBatch, ValBatch), "RLVRModule").rollouts is None:
        raise RuntimeError(
            "batch has no rollouts: add a lit_rlvr.callbacks.RolloutCallback to the Trainer's callbacks "
            "(the CLI adds one by default)"
        )
    return batch.rollouts


def check_prompt_data(
    datamodule: PromptData,
    tokenizer: Any,
    rewards: Any,
    advantage: str,
    environment: EnvironmentOptions | None = None,
    reference: Any = None,
    anchor: Any = None,
) -> None:
    """The start-up check of a DataModule against the module, before any generation; what it refuses is a
    :class:`StartupError` (``lit-rlvr`` ends with its message and exit status 2).

    Args:
        datamodule: must provide :class:`PromptData`; its prompts must be ``tokenizer``'s ids
            (:func:`check_tokenizer`).
        tokenizer: the policy's.
        rewards: the module's :class:`~lit_rlvr.rewards.combine.RewardMix`: every row can be
            scored, and, for an ``advantage`` that needs binary rewards, each row's own reward is binary.
        advantage: the configured advantage estimator's name.
        environment: multi-turn rollouts: every row has an environment (None: single-turn).
        reference: training only: the :class:`~lit_rlvr.policy.ReferencePolicy` that the
            DataModule's reference cache must have been computed by (None: not training).
        anchor: DPH-RL's anchor term (:class:`~lit_rlvr.options.AnchorOptions`; None: off): training
            with it needs the reference cache.
    """
    require(datamodule, PromptData, "RLVRModule", "DataModule")
    try:
        _check_prompt_data(datamodule, tokenizer, rewards, advantage, environment, reference, anchor)
    except StartupError:
        raise
    except ValueError as err:  # a row, a reward or the cache the run cannot use: a refusal, not a crash
        raise StartupError(str(err)) from err


def _check_prompt_data(
    datamodule: PromptData,
    tokenizer: Any,
    rewards: Any,
    advantage: str,
    environment: EnvironmentOptions | None,
    reference: Any,
    anchor: Any,
) -> None:
    check_tokenizer(datamodule.tokenizer, tokenizer)
    rows = datamodule.all_rows()
    # every row has an environment, and every row its environment does not score can be scored, before any generation
    rewards.check_rows(rows_scored_by_rewards(rows, environment), "data")
    if environment is not None:  # an environment that cannot work with this tokenizer would fail every trajectory
        environment.check_tokenizer(rows, tokenizer)
    if ADVANTAGES.trait(advantage, "binary_rewards", default=False):  # each row's own reward, now known
        rewards.require_binary(f"model.loss.advantage={advantage!r}", rows)
    if reference is None:
        return
    cache = datamodule.reference_cache
    if cache is not None:
        reference.check_cache(cache)  # the anchors' log π_ref must be this policy's
        cache.check(environment=environment and environment.identity(datamodule.train_rows))
    elif anchor is not None:
        raise ValueError("model.anchor (DPH-RL) needs data.cache: build it with `lit-rlvr cache` first")


def check_trainer(trainer: Any) -> None:
    """Refuse Lightning's gradient clipping (``trainer.gradient_clip_val``): the module optimises
    manually and clips its gradients itself, and Lightning's own message would not say where clipping is set."""
    clip = trainer.gradient_clip_val
    if clip:
        raise ValueError(
            f"Trainer(gradient_clip_val={clip}): RLVRModule optimises manually and clips its gradients "
            f"itself: set model.max_grad_norm={clip} (RLVRModule(max_grad_norm=...)) and leave "
            "trainer.gradient_clip_val unset"
        )


def check_tokenizer(theirs: Any, tokenizer: Any) -> None:
    """The prompts must be token ids of the policy's own tokenizer: refuse a DataModule whose tokenizer differs."""
    if theirs is None or theirs is tokenizer:
        return
    probe = "Solve 12 + 7 = ? Answer: \\boxed{19}"
    if len(theirs) != len(tokenizer) or theirs(probe).input_ids != tokenizer(probe).input_ids:
        raise ValueError(
            f"data.tokenizer ({getattr(theirs, 'name_or_path', '?')!r}) does not tokenize like the policy's "
            f"({getattr(tokenizer, 'name_or_path', '?')!r}); give the DataModule the policy's path "
            "(the CLI links data.tokenizer to model.policy.path)"
        )
