"""The policy: loading it (:mod:`~lit_rlvr.policy.loading`), scoring completions with it
(:mod:`~lit_rlvr.policy.logprobs`; the trainer's forwards: :mod:`~lit_rlvr.policy.forwards`), sharding it
(:mod:`~lit_rlvr.policy.sharding`) and its frozen initial self π_ref (:mod:`~lit_rlvr.policy.reference`)."""

from lit_rlvr.policy.forwards import PolicyForwards
from lit_rlvr.policy.loading import LoraOptions, PolicyOptions, base_model, is_peft_model, load_policy
from lit_rlvr.policy.logprobs import (
    MicroBatching,
    batched_completion_logprobs,
    check_padding_free,
    completion_logprobs,
    packs_sequences,
    sequence_logprob,
    shares_prompts,
)
from lit_rlvr.policy.reference import ReferencePolicy
from lit_rlvr.policy.sharding import gathered_parameters, shard_fsdp2

__all__ = [
    "LoraOptions",
    "MicroBatching",
    "PolicyForwards",
    "PolicyOptions",
    "ReferencePolicy",
    "base_model",
    "batched_completion_logprobs",
    "check_padding_free",
    "completion_logprobs",
    "gathered_parameters",
    "is_peft_model",
    "load_policy",
    "packs_sequences",
    "sequence_logprob",
    "shard_fsdp2",
    "shares_prompts",
]
