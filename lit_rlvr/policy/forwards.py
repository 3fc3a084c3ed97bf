"""The trainer's forwards of the policy: the log-probs the recipe reads, in the module's micro-batches.

:class:`PolicyForwards` holds what every training forward shares (the policy, the micro-batching,
the sampling temperature and the data-parallel ranks that run in step), so that the recipe
(:class:`~lit_rlvr.module.RLVRModule`) asks only for the rows' log-probs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lit_rlvr.policy.logprobs import (
    MicroBatching,
    batched_completion_logprobs,
    completion_logprobs,
    packs_sequences,
    shares_prompts,
)


class PolicyForwards:
    """Log-probs of rows (``StepData``, ``AnchorBatch``: anything with ``forward_args``) under ``policy``.

    Args:
        policy: the trained transformers causal LM.
        micro_batching: the module's micro-batches (``model.batching``).
        temperature: the rollout temperature, the log-probs' by default (``model.sampling.temperature``).
        ranks: the data-parallel ranks in step (:class:`~lit_rlvr.contracts.Ranks`; the module's
            ``lockstep``, set again when the Trainer sets the module up).
    """

    def __init__(self, policy: nn.Module, micro_batching: MicroBatching, temperature: float, ranks: Any):
        self.policy, self.micro_batching, self.temperature, self.ranks = policy, micro_batching, temperature, ranks
        shares_prompts(policy, micro_batching.shared_prompts)  # a model that cannot share is refused at start-up

    @torch.no_grad()
    def logprobs(
        self, rows: Any, with_entropy: bool = False, model: nn.Module | None = None, temperature: float | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """No-grad per-token log-probs ``(B, T)`` (and entropies) of a whole batch at the rollout
        temperature by default, in the module's micro-batches, so that rows pad only with rows of
        similar length; every data-parallel rank runs as many forwards (:attr:`ranks`)."""
        temperature = self.temperature if temperature is None else temperature
        return batched_completion_logprobs(
            model or self.policy, *rows.forward_args, temperature, with_entropy, self.micro_batching, self.ranks.most
        )

    def forward_logprobs(
        self, part: Any, with_entropy: bool = False, temperature: float | None = None, entropy_grad: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Differentiable log-probs ``(b, T)`` (and entropies, differentiable with ``entropy_grad``) of
        one micro-batch (:meth:`~lit_rlvr.contracts.RowTensors.micro_batches`): one forward."""
        temperature = self.temperature if temperature is None else temperature
        shared = shares_prompts(self.policy, self.micro_batching.shared_prompts)
        return completion_logprobs(
            self.policy, *part.forward_args, temperature, with_entropy, self.packs, entropy_grad, shared
        )

    @property
    def packs(self) -> bool:
        """Whether forwards pack rows end to end (``model.batching.padding_free``, :func:`~lit_rlvr.policy.packs_sequences`)."""
        return packs_sequences(self.policy, self.micro_batching.padding_free)
