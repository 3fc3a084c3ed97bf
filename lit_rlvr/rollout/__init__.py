"""Rollout engines: generate groups of completions for RL (vLLM, or transformers as fallback)."""

from lit_rlvr.rollout.types import Rollouts, SamplingParams

__all__ = ["Rollouts", "SamplingParams"]
