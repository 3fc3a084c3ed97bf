"""Rollout engines: generate groups of completions for RL (vLLM, or transformers as fallback).

Importing this package never imports vLLM; :class:`VLLMEngine` imports it when constructed.
Engines are chosen by name from :data:`ENGINES` (``auto``, ``vllm``, ``vllm_server``, ``hf``),
which the engine modules fill as this package imports them.
"""

from lit_rlvr.rollout.engine import (
    ENGINES,
    EngineStats,
    RolloutEngine,
    WeightSyncError,
    build_engine,
    check_fingerprint,
    fingerprint_error,
    logprob_drift,
    probe_sequence,
    run_with_timeout,
    vllm_available,
)
from lit_rlvr.rollout.hf import HFEngine
from lit_rlvr.rollout.options import AsyncOptions, RolloutOptions
from lit_rlvr.rollout.server import VLLMServerEngine
from lit_rlvr.rollout.server_processes import ServerError, VLLMServer
from lit_rlvr.rollout.types import Rollouts, SamplingParams
from lit_rlvr.rollout.vllm import VLLMEngine

__all__ = [
    "AsyncOptions",
    "ENGINES",
    "EngineStats",
    "HFEngine",
    "RolloutEngine",
    "RolloutOptions",
    "ServerError",
    "VLLMServer",
    "VLLMServerEngine",
    "Rollouts",
    "SamplingParams",
    "VLLMEngine",
    "WeightSyncError",
    "build_engine",
    "check_fingerprint",
    "fingerprint_error",
    "logprob_drift",
    "probe_sequence",
    "run_with_timeout",
    "vllm_available",
]
