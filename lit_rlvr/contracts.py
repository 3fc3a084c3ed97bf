"""What flows between the pieces: the batches, and what callbacks require of the LightningModule.

The DataModule makes :class:`TrainBatch` and :class:`ValBatch` objects; the rollout callback
fills their ``rollouts`` before Lightning hands the same object to ``training_step`` /
``validation_step``. A callback states what it needs from the module as a Protocol
(:class:`RolloutHost`, :class:`PolicyHost`, :class:`AdvantageHost`) and checks it at set-up with
:func:`require`, so a module that lacks a piece fails with the missing names, not with an
``AttributeError`` in the middle of a run. :class:`~lit_rlvr.module.RLVRModule` satisfies all of
them; so must a user's module that replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

from lit_rlvr.rollout.types import Rollouts, SamplingParams


@dataclass
class AnchorBatch:
    """DPH-RL anchor samples from the reference cache: A cached π_ref completions of D_pef prompts.

    Attributes:
        input_ids: ``(A, L)`` prompt + completion tokens (the ``Rollouts.to_padded`` layout).
        attention_mask: ``(A, L)``.
        response_mask: ``(A, T)`` real completion tokens.
        ref_logprobs: ``(A, T)`` the stored log π_ref of each completion token (temperature 1).
        rewards: ``(A,)`` the cached rewards.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    ref_logprobs: Tensor
    rewards: Tensor

    def tensors(self) -> dict[str, Tensor]:
        """The fields by name (the layout the log-prob passes take)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


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


@runtime_checkable
class PolicyHost(Protocol):
    """A module with a transformers policy and its tokenizer (:class:`~lit_rlvr.callbacks.HFExport`)."""

    policy: nn.Module
    tokenizer: Any


@runtime_checkable
class RolloutHost(Protocol):
    """What :class:`~lit_rlvr.callbacks.RolloutCallback` needs from the module.

    ``sampling`` is the training rollouts' (its ``n`` is the group size G), ``val_sampling`` the
    validation rollouts' (``n`` comes from each set); ``micro_batching`` bounds the drift pass,
    and ``lockstep(passes)`` is the number of forward passes every data-parallel rank runs when
    this one has ``passes`` (FSDP's forwards are collectives).
    """

    policy: nn.Module
    tokenizer: Any
    sampling: SamplingParams
    val_sampling: SamplingParams
    micro_batching: Any

    def lockstep(self, passes: int) -> int: ...


@runtime_checkable
class PromptSource(Protocol):
    """What asynchronous rollouts need from the DataModule: the batches ahead of the train loader.

    :class:`~lit_rlvr.data.PromptDataModule` provides it; its batches carry their ``position``
    ``(epoch, step)``, the same as the arguments here.
    """

    def train_prompt_ids_at(self, epoch: int, step: int) -> list[list[int]]: ...


@runtime_checkable
class AdvantageHost(Protocol):
    """What :class:`~lit_rlvr.callbacks.AdvantageSchedule` needs: the current estimator and a checked switch."""

    advantage_name: str
    advantage_options: dict

    def set_advantage(self, name: str, options: dict | None = None) -> None: ...


def require(module: object, protocol: type, who: str) -> None:
    """Raise ``TypeError`` naming what ``module`` lacks of ``protocol`` (needed by ``who``).

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
        f"{who} needs the LightningModule to provide {protocol.__name__}: {type(module).__name__} has no "
        f"{', '.join(wanted)}"
    )


def _members(protocol: type) -> list[str]:
    names = list(getattr(protocol, "__annotations__", {}))
    names += [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]
    return list(dict.fromkeys(names))
