"""The seed of every rollout call: disjoint across steps, ranks, asynchronous lanes and validation.

An engine seeds sample j of a call from the call's seed (vLLM: seed + j). The training rollout of
step s on rank r starts at ``seed + r·2**48 + s·2**20``, so calls of up to 2**20 rows never share a
seed across steps or ranks, and rank 0 samples as a single process does; asynchronous rollouts
add ``lane·2**17`` for a batch started ``lane`` weight versions ahead (< 8 lanes, lane 0 = the
synchronous loop's seed); validation batches live in their own half, from ``seed + r·2**48 + 2**47``.
Unseeded sampling stays unseeded.
"""

from __future__ import annotations

from dataclasses import replace

from lit_rlvr.rollout.types import SamplingParams

STEP_SEED_STRIDE = 2**20
LANE_SEED_STRIDE = 2**17
VAL_SEED_BASE = 2**47
RANK_SEED_STRIDE = 2**48


def with_seed(params: SamplingParams, offset: int, rank: int = 0) -> SamplingParams:
    """``params`` with its seed moved by ``rank · 2**48 + offset`` (unseeded stays unseeded).

    Example:
        >>> with_seed(SamplingParams(seed=1), 5, rank=1).seed == 1 + 2**48 + 5, with_seed(SamplingParams(), 5).seed
        (True, None)
    """
    if params.seed is None:
        return params
    return replace(params, seed=params.seed + rank * RANK_SEED_STRIDE + offset)


def step_sampling(sampling: SamplingParams, global_step: int, rank: int = 0, lane: int = 0) -> SamplingParams:
    """The training rollout's sampling at ``global_step`` on ``rank``: ``sampling`` with its seed
    offset by ``rank · 2**48 + global_step · 2**20``; asynchronous rollouts add ``lane · 2**17``
    for a batch started ``lane`` versions ahead.

    Example:
        >>> step_sampling(SamplingParams(n=4, seed=7), global_step=2, rank=1).seed == 7 + 2**48 + 2 * 2**20
        True
    """
    return with_seed(sampling, global_step * STEP_SEED_STRIDE + lane * LANE_SEED_STRIDE, rank)


def validation_sampling(
    sampling: SamplingParams, n: int, batch_idx: int, dataloader_idx: int = 0, rank: int = 0
) -> SamplingParams:
    """A validation batch's sampling: ``n`` samples per prompt, the seed offset by ``rank · 2**48 +
    2**47 + (dataloader_idx · 2**12 + batch_idx) · 2**20``.

    Example:
        >>> validation_sampling(SamplingParams(seed=0), n=3, batch_idx=1).seed == 2**47 + 2**20
        True
    """
    return with_seed(
        replace(sampling, n=n), VAL_SEED_BASE + (dataloader_idx * 2**12 + batch_idx) * STEP_SEED_STRIDE, rank
    )
