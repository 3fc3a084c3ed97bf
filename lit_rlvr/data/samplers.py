"""Deterministic, resumable samplers for prompt batches and for anchor batches.

Resuming mid-epoch needs the *consumed* position, not the sampler's: Lightning prefetches a
batch ahead, so a sampler's own cursor is one batch past what training saw when a checkpoint
is written. :class:`PromptBatchSampler` therefore yields :class:`BatchKey` objects that carry
their ``(epoch, step)``; the DataModule records the key of each batch as training consumes it
and restores the sampler to the next step. The per-epoch order is a pure function of
``(seed, epoch)``, so the batch after a restore is exactly the next unseen one.

Anchor batches (DPH-RL's cached π_ref samples) are a pure function of the global step, see
:func:`anchor_batch_indices`, so they need no saved state at all.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DistributedSampler


@dataclass(frozen=True)
class BatchKey:
    """One training batch: which epoch, which step within it, and the dataset indices."""

    epoch: int
    step: int
    indices: tuple[int, ...]


def epoch_order(num_items: int, epoch: int, seed: int, shuffle: bool = True) -> list[int]:
    """The order of ``range(num_items)`` in ``epoch``: a permutation seeded by ``(seed, epoch)``.

    Example:
        >>> epoch_order(5, 0, seed=0) == epoch_order(5, 0, seed=0), epoch_order(5, 0, 0, shuffle=False)
        (True, [0, 1, 2, 3, 4])
    """
    if not shuffle:
        return list(range(num_items))
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_items, generator=g).tolist()


class PromptBatchSampler(DistributedSampler):
    """Batches of prompt indices, reshuffled every epoch, sharded by rank, resumable mid-epoch.

    It subclasses ``DistributedSampler`` because it already shards by rank: Lightning then leaves
    it in place instead of injecting its own sampler under DDP/FSDP. Every rank computes the same
    epoch order, keeps the first ``len - len % num_replicas`` items and takes every
    ``num_replicas``-th one from ``rank``; then cuts batches of ``batch_size``.

    Args:
        num_items: dataset size.
        batch_size: prompts per batch (per rank).
        seed: seeds the per-epoch permutation.
        shuffle: permute each epoch (else file order).
        drop_last: drop a last, smaller batch.
        num_replicas: world size.
        rank: this process's rank.

    Example:
        >>> s = PromptBatchSampler(5, batch_size=2, shuffle=False)
        >>> [k.indices for k in s]
        [(0, 1), (2, 3), (4,)]
        >>> s.resume(epoch=0, next_step=2); [k.indices for k in s], [k.indices for k in s]
        ([(4,)], [(0, 1), (2, 3), (4,)])
    """

    def __init__(
        self,
        num_items: int,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_items < num_replicas:
            raise ValueError(f"{num_items} prompts cannot be split over {num_replicas} ranks")
        super().__init__(range(num_items), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.num_items, self.batch_size, self.batch_drop_last = num_items, batch_size, drop_last
        self._resume: tuple[int, int] | None = None

    def resume(self, epoch: int, next_step: int) -> None:
        """Make the next iteration over ``epoch`` start at ``next_step`` (used once, then cleared)."""
        self._resume = (epoch, next_step)

    def _rank_indices(self, epoch: int) -> list[int]:
        order = epoch_order(self.num_items, epoch, self.seed, self.shuffle)
        order = order[: len(order) - len(order) % self.num_replicas]
        return order[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        per_rank = self.num_items // self.num_replicas
        return per_rank // self.batch_size if self.batch_drop_last else -(-per_rank // self.batch_size)

    def key_at(self, epoch: int, step: int) -> BatchKey:
        """The key this sampler yields at ``step`` of ``epoch`` (a pure function of both).

        Example:
            >>> PromptBatchSampler(5, batch_size=2, shuffle=False).key_at(3, 1).indices
            (2, 3)
        """
        if not 0 <= step < len(self):
            raise IndexError(f"step {step} is outside the epoch's {len(self)} batches")
        indices = self._rank_indices(epoch)
        return BatchKey(epoch, step, tuple(indices[step * self.batch_size : (step + 1) * self.batch_size]))

    def __iter__(self) -> Iterator[BatchKey]:
        epoch, start = self.epoch, 0
        if self._resume is not None and self._resume[0] == epoch:
            start = self._resume[1]
        self._resume = None
        indices = self._rank_indices(epoch)
        for step in range(start, len(self)):
            yield BatchKey(epoch, step, tuple(indices[step * self.batch_size : (step + 1) * self.batch_size]))


class EvalShardSampler(DistributedSampler):
    """One rank's share of an evaluation set: items ``rank, rank + R, rank + 2R, …`` as ``(index, padding)``.

    Every rank yields ``ceil(num_items / R)`` keys, so all ranks run the same number of
    validation steps (generation and metric syncs are collectives under FSDP and with several
    engines); the missing tail of a rank is filled with ``padding=True`` repeats of its own items,
    which are generated but never counted. The union of the ranks' unpadded items is the whole set,
    each item once, so synced metrics equal one process's over the same prompts. (Lightning leaves
    a ``DistributedSampler`` subclass in place instead of injecting one that pads by duplication.)

    Example:
        >>> [list(EvalShardSampler(5, num_replicas=2, rank=r)) for r in range(2)]
        [[(0, False), (2, False), (4, False)], [(1, False), (3, False), (1, True)]]
    """

    def __init__(self, num_items: int, num_replicas: int = 1, rank: int = 0):
        if num_items < 1:
            raise ValueError(f"an evaluation set needs at least one item, got {num_items}")
        super().__init__(range(num_items), num_replicas=num_replicas, rank=rank, shuffle=False)
        self.num_items = num_items

    def __len__(self) -> int:
        return -(-self.num_items // self.num_replicas)

    def __iter__(self) -> Iterator[tuple[int, bool]]:
        own = list(range(self.rank, self.num_items, self.num_replicas))  # empty when rank >= num_items
        for j in range(len(self)):
            yield (own[j], False) if j < len(own) else (own[0] if own else 0, True)


@functools.lru_cache(maxsize=4)
def _anchor_permutation(num_anchors: int, seed: int, cycle: int) -> np.ndarray:
    return np.random.default_rng([seed, cycle]).permutation(num_anchors)


def anchor_batch_indices(batch_number: int, batch_size: int, num_anchors: int, seed: int = 0) -> list[int]:
    """Anchor samples for the ``batch_number``-th anchor batch (counting from 0 over the whole run).

    The anchors are read as an endless stream of permutations of ``range(num_anchors)`` (one
    per cycle, seeded by ``(seed, cycle)``); batch ``b`` is the slice ``[b·A, (b+1)·A)`` of that
    stream, so every anchor appears once per cycle and the batch depends on nothing but ``b``.

    Example:
        >>> first = [anchor_batch_indices(b, 2, 5) for b in range(5)]
        >>> sorted(sum(first, [])[:5]), sorted(sum(first, [])[5:10])
        ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    """
    if num_anchors < 1:
        raise ValueError("anchor_batch_indices needs at least one anchor sample")
    out: list[int] = []
    pos = batch_number * batch_size
    while len(out) < batch_size:
        cycle, offset = divmod(pos, num_anchors)
        take = min(batch_size - len(out), num_anchors - offset)
        out.extend(_anchor_permutation(num_anchors, seed, cycle)[offset : offset + take].tolist())
        pos += take
    return out
