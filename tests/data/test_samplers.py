"""Samplers: per-epoch permutations, exact mid-epoch resume, rank sharding, anchor cycles."""

from __future__ import annotations

import numpy as np
import pytest

from lit_rlvr.data.samplers import PromptBatchSampler, anchor_batch_indices, epoch_order


def _epoch(sampler, epoch):
    sampler.set_epoch(epoch)
    return [list(k.indices) for k in sampler]


@pytest.mark.parametrize("seed", [0, 3])
def test_each_epoch_is_a_permutation_and_epochs_differ(seed):
    s = PromptBatchSampler(23, batch_size=4, seed=seed)
    epochs = [sum(_epoch(s, e), []) for e in range(3)]
    assert all(sorted(e) == list(range(23)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    assert epochs[1] == sum(_epoch(PromptBatchSampler(23, batch_size=4, seed=seed), 1), [])


@pytest.mark.parametrize(
    ("n", "bs", "drop_last"), [(10, 3, False), (10, 3, True), (9, 3, False), (1, 1, False), (7, 10, False)]
)
@pytest.mark.parametrize("epoch", [0, 2])
def test_resume_at_every_step_continues_with_the_next_batch(n, bs, drop_last, epoch):
    full = _epoch(PromptBatchSampler(n, bs, seed=1, drop_last=drop_last), epoch)
    assert len(full) == len(PromptBatchSampler(n, bs, drop_last=drop_last))
    for consumed in range(len(full)):
        s = PromptBatchSampler(n, bs, seed=1, drop_last=drop_last)
        s.resume(epoch, consumed + 1)
        assert full[: consumed + 1] + _epoch(s, epoch) == full
        assert _epoch(s, epoch) == full  # the resume point is used once


def test_resume_point_of_another_epoch_is_ignored():
    s = PromptBatchSampler(6, 2, seed=0)
    s.resume(epoch=0, next_step=3)
    assert _epoch(s, 1) == _epoch(PromptBatchSampler(6, 2, seed=0), 1)


@pytest.mark.parametrize(("n", "world"), [(10, 2), (11, 3), (4, 4)])
def test_ranks_partition_the_epoch(n, world):
    shards = [sum(_epoch(PromptBatchSampler(n, 2, seed=5, num_replicas=world, rank=r), 1), []) for r in range(world)]
    order = epoch_order(n, 1, seed=5)
    flat = sorted(sum(shards, []))
    assert flat == sorted(order[: n - n % world]) and len(set(flat)) == len(flat)
    assert len({len(s) for s in shards}) == 1


@pytest.mark.parametrize(("num", "bs"), [(5, 2), (7, 7), (3, 8), (1, 1)])
def test_anchor_stream_is_a_sequence_of_permutations(num, bs):
    stream = sum((anchor_batch_indices(b, bs, num, seed=2) for b in range(6)), [])
    ref = np.concatenate([np.random.default_rng([2, c]).permutation(num) for c in range(-(-6 * bs // num))])
    assert stream == ref[: 6 * bs].tolist()
    for c in range(len(stream) // num):
        assert sorted(stream[c * num : (c + 1) * num]) == list(range(num))


def test_invalid_arguments():
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        PromptBatchSampler(4, 0)
    with pytest.raises(ValueError, match="at least one anchor"):
        anchor_batch_indices(0, 2, 0)
