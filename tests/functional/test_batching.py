"""Micro-batch weights make accumulated aggregates equal the full-batch aggregate."""

import pytest
import torch

from lit_rlvr.functional.batching import aggregation_weight, split_indices

MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def reference_aggregate(values, mask, mode, max_len):
    """Naive per-row loops of METHODS.md §1's three aggregation modes."""
    rows = [(v[m.bool()]) for v, m in zip(values, mask)]
    if mode == "token_mean":
        tokens = torch.cat(rows)
        return tokens.sum() / max(len(tokens), 1)
    if mode == "seq_mean_token_mean":
        means = [r.mean() for r in rows if len(r)]
        return torch.stack(means).mean() if means else torch.zeros(())
    return sum(r.sum() for r in rows) / (len(rows) * max_len)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("micro", [1, 2, 3, 7])
def test_weighted_micro_aggregates_sum_to_full(mode, seed, micro):
    gen = torch.Generator().manual_seed(seed)
    B, T = 7, 6
    values = torch.randn(B, T, generator=gen)
    mask = (torch.rand(B, T, generator=gen) > 0.4).long()
    mask[2] = 0  # a fully masked row
    full = reference_aggregate(values, mask, mode, T)
    total = 0.0
    for idx in split_indices(B, micro):
        w = aggregation_weight(mask[idx], mask, mode)
        total += w * reference_aggregate(values[idx], mask[idx], mode, T)
    assert float(total) == pytest.approx(float(full), abs=1e-6)


def test_split_indices_covers_every_row_once_when_shuffled():
    chunks = split_indices(10, 3, torch.Generator().manual_seed(0))
    assert [len(c) for c in chunks] == [3, 3, 3, 1]
    assert sorted(torch.cat(chunks).tolist()) == list(range(10))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown aggregation mode 'sum'"):
        aggregation_weight(torch.ones(1, 1), torch.ones(1, 1), "sum")
    with pytest.raises(ValueError, match="chunk size must be >= 1"):
        split_indices(3, 0)
