"""Splitting a rollout batch into optimizer steps and micro-batches without changing the loss.

A PPO-style update splits B rollout rows into mini-batches (one optimizer step each) and each
mini-batch into micro-batches (gradient accumulation). For the accumulated gradient to equal the
full mini-batch gradient, each micro-batch's aggregated loss is scaled by its exact share of the
mini-batch's normaliser, which each registered aggregation carries
(:class:`~lit_rlvr.functional.losses.Aggregation`: tokens for ``token_mean``, non-empty rows for
``seq_mean_token_mean``, rows for ``seq_mean_token_sum_norm``; docs/methods.md §1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlvr.functional.losses import AGGREGATIONS, checked_aggregation


def aggregation_normaliser(mask: Tensor, mode: str) -> float:
    """What ``aggregate(…, mode)`` divides by on ``mask`` ``(B, T)``: tokens, non-empty rows or rows.

    Example:
        >>> aggregation_normaliser(torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]]), "token_mean")
        4.0
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid: {sorted(AGGREGATIONS)}")
    return float(checked_aggregation(mode, "mode").normaliser(mask))


def aggregation_weight(micro_mask: Tensor, full_mask: Tensor | float, mode: str) -> float:
    """Scale for a micro-batch's ``aggregate(…, mode)`` so the micro-batch sum equals the full one.

    Args:
        micro_mask: ``(b, T)`` response mask of the micro-batch.
        full_mask: ``(B, T')`` response mask of the whole mini-batch it belongs to, or that
            mini-batch's :func:`aggregation_normaliser` (under data parallelism: the mean over the
            ranks of theirs, so that the averaged gradient is the global batch's).
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
        >>> aggregation_weight(full[:1], 6.0, "token_mean")  # 2 ranks of 4 and 8 tokens: mean 6
        0.5
    """
    den = full_mask if isinstance(full_mask, float) else aggregation_normaliser(full_mask, mode)
    return aggregation_normaliser(micro_mask, mode) / den if den > 0 else 0.0


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


def token_budget_batches(lengths: Tensor, max_tokens: int | None = None, max_rows: int | None = None) -> list[Tensor]:
    """Group rows of similar length into micro-batches that pad to at most ``max_tokens`` tokens.

    A micro-batch is cropped to its own longest row, so its forward costs
    ``rows × Σ_s (longest segment s)`` tokens, padding included: with ``lengths (B, 2)`` =
    (prompt, completion) that is the padded layout of :meth:`~lit_rlvr.rollout.types.Rollouts.to_padded`
    (prompts left-padded, completions right-padded), with ``lengths (B,)`` a row packed end to end.
    Rows are taken longest first (ties by index) and a micro-batch is closed when the next row
    would take it past ``max_tokens`` or ``max_rows``, so rows of similar length pad together
    (verl's ``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``, which counts tokens the same way
    once padding is removed). A row longer than the budget gets a micro-batch of its own.

    Args:
        lengths: ``(B,)`` tokens per row, or ``(B, S)`` tokens of each of its S separately padded segments.
        max_tokens: token budget per micro-batch, padding included (None = no token limit).
        max_rows: rows per micro-batch (None = no row limit).

    Returns:
        Index tensors (long) that cover every row exactly once, longest rows first; deterministic.

    Example:
        >>> [b.tolist() for b in token_budget_batches(torch.tensor([3, 9, 4, 2, 8]), max_tokens=18)]
        [[1, 4], [2, 0, 3]]
        >>> [b.tolist() for b in token_budget_batches(torch.tensor([[5, 3], [2, 9], [5, 1]]), max_tokens=20)]
        [[1], [0, 2]]
        >>> [b.tolist() for b in token_budget_batches(torch.tensor([30, 2, 2]), max_tokens=8)]  # 30 > 8: alone
        [[0], [1, 2]]
    """
    for key, value in (("max_tokens", max_tokens), ("max_rows", max_rows)):
        if value is not None and value < 1:
            raise ValueError(f"{key} must be >= 1 or None (no limit), got {value}")
    if len(lengths) == 0:
        return []
    segments = lengths.reshape(len(lengths), -1)  # (B, S)
    rows = segments.tolist()
    order = torch.sort(segments.sum(-1), descending=True, stable=True).indices.tolist()
    batches: list[list[int]] = []
    widths: list[int] = []  # longest of each segment in the open micro-batch
    for i in order:
        grown = [max(w, x) for w, x in zip(widths, rows[i])] if widths else rows[i]
        open_rows = len(batches[-1]) if widths else 0
        fits = (max_rows is None or open_rows < max_rows) and (
            max_tokens is None or (open_rows + 1) * sum(grown) <= max_tokens
        )
        if widths and fits:
            batches[-1].append(i)
        else:  # the first row, or a new micro-batch (a lone row may exceed the budget)
            batches.append([i])
            grown = rows[i]
        widths = grown
    return [torch.tensor(b, dtype=torch.long) for b in batches]


def segment_lengths(attention_mask: Tensor, response_mask: Tensor) -> Tensor:
    """``(B, 2)`` real (prompt, completion) tokens of each row of the padded layout.

    Example:
        >>> mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])  # Lp = 2, T = 3
        >>> segment_lengths(mask, mask[:, 2:]).tolist()
        [[1, 2], [2, 3]]
    """
    T = response_mask.shape[1]
    prompt = attention_mask[:, : attention_mask.shape[1] - T].sum(-1)
    return torch.stack([prompt, response_mask.sum(-1)], dim=-1)


SEQUENCE_KEYS = ("input_ids", "attention_mask")


def crop_padding(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """Drop the columns that are padding in every row of a padded (micro-)batch.

    The layout is :meth:`~lit_rlvr.rollout.types.Rollouts.to_padded`'s: ``input_ids`` and
    ``attention_mask`` ``(b, Lp+T)`` (prompts left-padded), every other 2-D tensor whose width is
    T = ``response_mask.shape[1]`` (``old_logprobs``, ``ref_logprobs``, per-token advantages, …)
    right-padded. The prompt part loses its leading all-padding columns, the completion part its
    trailing ones (at least one completion column stays); other tensors are returned as they are.
    Normalisers do not change (tokens, rows), so cropped micro-batches keep their weights.

    Example:
        >>> mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 0, 0, 0]])  # Lp = 4, T = 3
        >>> out = crop_padding({"input_ids": mask * 7, "attention_mask": mask, "response_mask": mask[:, 4:]})
        >>> out["attention_mask"].tolist(), out["response_mask"].tolist()
        ([[0, 1, 1, 1], [1, 1, 1, 0]], [[1], [0]])
    """
    mask, response = batch["attention_mask"], batch["response_mask"]
    T = response.shape[1]
    Lp = mask.shape[1] - T
    start = int(mask[:, :Lp].any(0).int().argmax()) if Lp > 0 and mask[:, :Lp].any() else Lp
    used = response.any(0).nonzero()
    t = max(1, int(used[-1]) + 1 if len(used) else 1)
    out = {}
    for key, value in batch.items():
        if key in SEQUENCE_KEYS:
            out[key] = value[:, start : Lp + t]
        elif value.dim() >= 2 and value.shape[1] == T:
            out[key] = value[:, :t]
        else:
            out[key] = value
    return out


def pack_bins(lengths: Tensor, capacity: int | None = None) -> list[Tensor]:
    """First-fit decreasing: rows into bins of at most ``capacity`` tokens, for padding-free forwards.

    Args:
        lengths: ``(B,)`` tokens per row.
        capacity: tokens per bin (None = one bin holding every row); a row longer than it gets its own bin.

    Returns:
        Index tensors of the rows in each bin (longest first), covering every row once; deterministic.

    Example:
        >>> [b.tolist() for b in pack_bins(torch.tensor([5, 2, 7, 3]), capacity=8)]
        [[2], [0, 3], [1]]
    """
    order = torch.sort(lengths, descending=True, stable=True).indices.tolist()
    sizes = lengths.tolist()
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        k = next((k for k, room in enumerate(free) if capacity is None or sizes[i] <= room), None)
        if k is None:
            bins.append([i])
            free.append(0 if capacity is None else capacity - sizes[i])
        else:
            bins[k].append(i)
            free[k] -= sizes[i] if capacity is not None else 0
    return [torch.tensor(b, dtype=torch.long) for b in bins]
