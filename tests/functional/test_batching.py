"""Micro-batch weights make accumulated aggregates equal the full-batch aggregate."""

import pytest
import torch

from lit_rlvr.functional.batching import (
    aggregation_weight,
    crop_padding,
    pack_bins,
    segment_lengths,
    split_indices,
    token_budget_batches,
)

MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def reference_aggregate(values, mask, mode, max_len):
    """Naive per-row loops of docs/methods.md §1's three aggregation modes."""
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


# ----------------------------------------------------------------------------- token budgets (issue 14)


def reference_budget_batches(lengths, max_tokens, max_rows):
    """The greedy rule written out: longest first (ties by index), close a batch when the next row breaks a limit."""
    rows = [[int(x) for x in (r if r.dim() else r[None])] for r in lengths]
    order = sorted(range(len(rows)), key=lambda i: (-sum(rows[i]), i))
    batches = []
    for i in order:
        if batches:
            members = batches[-1] + [i]
            cost = len(members) * sum(max(rows[m][s] for m in members) for s in range(len(rows[i])))
            if (max_rows is None or len(members) <= max_rows) and (max_tokens is None or cost <= max_tokens):
                batches[-1] = members
                continue
        batches.append([i])
    return batches


def padded_cost(lengths, rows):
    seg = lengths.reshape(len(lengths), -1)[rows]
    return len(rows) * int(seg.max(0).values.sum())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("segments", [1, 2])
@pytest.mark.parametrize("max_tokens,max_rows", [(None, None), (64, None), (200, None), (None, 3), (90, 4), (1, None)])
def test_token_budget_batches_against_the_greedy_reference(seed, segments, max_tokens, max_rows):
    gen = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, 40, (1,), generator=gen))
    lengths = torch.randint(0, 60, (B, segments), generator=gen).squeeze(-1)
    lengths[0] = lengths.reshape(B, -1)[0] + 100  # one row over most budgets
    batches = token_budget_batches(lengths, max_tokens, max_rows)
    assert [b.tolist() for b in batches] == reference_budget_batches(lengths, max_tokens, max_rows)
    assert sorted(torch.cat(batches).tolist()) == list(range(B))  # every row exactly once
    for b in batches:
        assert max_rows is None or len(b) <= max_rows
        assert max_tokens is None or padded_cost(lengths, b) <= max_tokens or len(b) == 1  # over-long rows alone
    totals = lengths.reshape(B, -1).sum(-1)
    firsts = [int(totals[b[0]]) for b in batches]
    assert firsts == sorted(firsts, reverse=True)  # longest rows first: similar lengths share a micro-batch
    assert [b.tolist() for b in token_budget_batches(lengths, max_tokens, max_rows)] == [b.tolist() for b in batches]


def test_token_budget_edge_cases():
    assert token_budget_batches(torch.zeros(0, dtype=torch.long), 10) == []
    assert [b.tolist() for b in token_budget_batches(torch.tensor([5, 5, 5]), 10)] == [[0, 1], [2]]  # ties by index
    assert [b.tolist() for b in token_budget_batches(torch.tensor([50, 40]), 10)] == [
        [0],
        [1],
    ]  # each over-long row alone
    assert [b.tolist() for b in token_budget_batches(torch.tensor([3, 1, 2]), None)] == [[0, 2, 1]]
    with pytest.raises(ValueError, match="max_tokens must be >= 1 or None"):
        token_budget_batches(torch.tensor([3]), 0)
    with pytest.raises(ValueError, match="max_rows must be >= 1 or None"):
        token_budget_batches(torch.tensor([3]), None, 0)


def random_padded(gen, B, Lp, T):
    """A ``to_padded``-layout batch: prompts of 1..Lp tokens left-padded, completions of 0..T right-padded."""
    p = torch.randint(1, Lp + 1, (B,), generator=gen)
    c = torch.randint(0, T + 1, (B,), generator=gen)
    cols = torch.arange(Lp + T)
    mask = ((cols >= Lp - p[:, None]) & (cols < Lp + c[:, None])).long()
    ids = torch.randint(4, 90, (B, Lp + T), generator=gen) * mask
    return (
        {
            "input_ids": ids,
            "attention_mask": mask,
            "response_mask": mask[:, Lp:].clone(),
            "old_logprobs": -torch.rand(B, T, generator=gen) * mask[:, Lp:],
            "rewards": torch.rand(B, generator=gen),
        },
        p,
        c,
    )


@pytest.mark.parametrize("seed", range(8))
def test_crop_padding_drops_only_all_padding_columns(seed):
    gen = torch.Generator().manual_seed(seed)
    batch, p, c = random_padded(gen, 5, 6, 9)
    rows = torch.tensor([1, 3]) if seed % 2 else torch.arange(5)
    part = {k: v[rows] for k, v in batch.items()}
    out = crop_padding(part)
    Lp, t = int(p[rows].max()), max(1, int(c[rows].max()))
    assert out["input_ids"].shape == (len(rows), Lp + t) and out["response_mask"].shape == out[
        "old_logprobs"
    ].shape == (len(rows), t)
    assert torch.equal(out["input_ids"][out["attention_mask"].bool()], part["input_ids"][part["attention_mask"].bool()])
    assert torch.equal(out["old_logprobs"], part["old_logprobs"][:, :t]) and torch.equal(
        out["rewards"], part["rewards"]
    )
    assert torch.equal(
        segment_lengths(out["attention_mask"], out["response_mask"]), torch.stack([p[rows], c[rows]], -1)
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [1, 30, 60, 10**6])
def test_weighted_token_budget_micro_aggregates_sum_to_full(mode, seed, budget):
    """Length-sorted, cropped micro-batches under a token budget keep the aggregate (Dr. GRPO's max_len stays T)."""
    gen = torch.Generator().manual_seed(seed)
    batch, _, _ = random_padded(gen, 9, 4, 8)
    mask, T = batch["response_mask"], batch["response_mask"].shape[1]
    values = torch.randn(9, T, generator=gen)
    full = reference_aggregate(values, mask, mode, T)
    total = 0.0
    for rows in token_budget_batches(segment_lengths(batch["attention_mask"], mask), budget):
        part = crop_padding({**{k: v[rows] for k, v in batch.items()}, "values": values[rows]})
        w = aggregation_weight(part["response_mask"], mask, mode)
        total += w * reference_aggregate(
            part["values"], part["response_mask"], mode, T
        )  # max_len = max_new_tokens, not the crop
    assert float(total) == pytest.approx(float(full), abs=1e-6)


def reference_ffd(lengths, capacity):
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    bins, loads = [], []
    for i in order:
        for k in range(len(bins)):
            if capacity is None or loads[k] + int(lengths[i]) <= capacity:
                bins[k].append(i)
                loads[k] += int(lengths[i])
                break
        else:
            bins.append([i])
            loads.append(int(lengths[i]))
    return bins


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("capacity", [None, 1, 40, 75])
def test_pack_bins_is_first_fit_decreasing(seed, capacity):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 70, (int(torch.randint(1, 30, (1,), generator=gen)),), generator=gen)
    bins = pack_bins(lengths, capacity)
    assert [b.tolist() for b in bins] == reference_ffd(lengths, capacity)
    assert sorted(torch.cat(bins).tolist()) == list(range(len(lengths)))
    for b in bins:
        assert capacity is None or int(lengths[b].sum()) <= capacity or len(b) == 1
