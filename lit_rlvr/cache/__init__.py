"""The offline reference cache of DPH-RL: π_ref samples, rewards and log-probs, built once, streamed."""

from lit_rlvr.cache.builder import build_reference_cache, reference_logprobs
from lit_rlvr.cache.format import (
    CacheCorruptError,
    CacheError,
    CacheMismatchError,
    dataset_fingerprint,
    model_fingerprint,
    tokenizer_fingerprint,
)
from lit_rlvr.cache.reader import CachedSample, ReferenceCache
from lit_rlvr.cache.split import CacheSplit, pass_count_histogram, split_by_pass_count, summary

__all__ = [
    "CacheCorruptError",
    "CacheError",
    "CacheMismatchError",
    "CacheSplit",
    "CachedSample",
    "ReferenceCache",
    "build_reference_cache",
    "dataset_fingerprint",
    "model_fingerprint",
    "pass_count_histogram",
    "reference_logprobs",
    "split_by_pass_count",
    "summary",
    "tokenizer_fingerprint",
]
