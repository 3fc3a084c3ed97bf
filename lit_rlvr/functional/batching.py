"""Splitting a rollout batch into optimizer steps and micro-batches without changing the loss.

A PPO-style update splits B rollout rows into mini-batches (one optimizer step each) and each
mini-batch into micro-batches (gradient accumulation). For the accumulated gradient to equal the
full mini-batch gradient, each micro-batch's aggregated loss is scaled by its exact share of the
mini-batch's normaliser, which each registered aggregation carries
(:class:`~lit_rlvr.functional.losses.Aggregation`: tokens for ``token_mean``, non-empty rows for
``seq_mean_token_mean``, rows for ``seq_mean_token_sum_norm``; METHODS.md §1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlvr.functional.losses import AGGREGATIONS, checked_aggregation


def aggregation_weight(micro_mask: Tensor, full_mask: Tensor, mode: str) -> float:
    """Scale for a micro-batch's ``aggregate(…, mode)`` so the micro-batch sum equals the full one.

    Args:
        micro_mask: ``(b, T)`` response mask of the micro-batch.
        full_mask: ``(B, T')`` response mask of the whole mini-batch it belongs to.
        mode: an aggregation mode of :data:`lit_rlvr.functional.losses.AGGREGATIONS`.

    Returns:
        The weight (0.0 when the mini-batch has nothing to normalise by).

    Example:
        >>> full = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
        >>> aggregation_weight(full[:1], full, "token_mean")  # 3 of 4 tokens
        0.75
        >>> aggregation_weight(full[:1], full, "seq_mean_token_mean")  # 1 of 2 non-empty rows
        0.5
        >>> aggregation_weight(full[:1], full, "seq_mean_token_sum_norm")  # 1 of 3 rows
        0.3333333333333333
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid: {sorted(AGGREGATIONS)}")
    normaliser = checked_aggregation(mode, "mode").normaliser
    den = float(normaliser(full_mask))
    return float(normaliser(micro_mask)) / den if den > 0 else 0.0


def split_indices(n: int, size: int | None, generator: torch.Generator | None = None) -> list[Tensor]:
    """Split ``range(n)`` (shuffled when a generator is given) into chunks of ``size`` rows.

    Example:
        >>> [c.tolist() for c in split_indices(5, 2)]
        [[0, 1], [2, 3], [4]]
        >>> [c.tolist() for c in split_indices(3, None)]
        [[0, 1, 2]]
    """
    if size is not None and size < 1:
        raise ValueError(f"chunk size must be >= 1 or None (all rows), got {size}")
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    return list(order.split(size or max(n, 1)))
