"""Prefix reuse for the ``hf`` engine: each trajectory's keys and values kept between the turns of a rollout.

The multi-turn loop (:class:`~lit_rlvr.rollout.turns.TurnLoop`) calls the engine once per turn with
the whole trajectory so far as the prompt. Inside :meth:`~lit_rlvr.rollout.hf.HFEngine.prefix_reuse`
the engine keeps, for every row it generated, the keys and values of the row's prompt and
completion in a :class:`PrefixCache`, keyed by the token ids they cover. The next call looks up
each prompt's longest stored prefix and prefills only the tokens after it: the previous turn's last
token (sampled, never fed), the observation and the new turn's prompt. vLLM's automatic prefix
caching does the same in blocks of 16 tokens; here one entry holds a whole row.

Layout. An entry, :class:`RowKV`, holds per layer ``keys`` and ``values`` of shape ``(H, L, D)``
(KV heads, tokens, head size), compact: no padding. A batch built from entries
(:func:`batch_past`) is left-padded to ``(B, H, Lc, D)`` with a ``(B, Lc)`` attention mask, and the
rows' new tokens follow, left-padded too, so a row's padding may sit between its cached tokens and
its new ones: the attention mask hides it, and the position ids count the row's own tokens only
(:func:`~lit_rlvr.rollout.hf.decode_fast`), so the model sees what a full prefill would give it, up
to floating-point rounding.

Where it applies: caches made of plain attention layers (transformers' ``DynamicLayer``); sliding
window and recurrent layers keep no exact per-token prefix, so their rows are not kept. An entry is
matched only when all of its tokens are a prefix of the new prompt (a turn the loop cut to its
budget is prefilled in full again).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

_MOD, _BASE = (1 << 61) - 1, 1_000_003  # polynomial hash of token-id prefixes


@dataclass(frozen=True)
class RowKV:
    """One row's keys and values: per layer ``(H, L, D)`` tensors for its first L tokens."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @property
    def length(self) -> int:
        return self.keys[0].shape[-2]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass(frozen=True)
class _Entry:
    ids: tuple[int, ...]
    kv: RowKV


class PrefixCache:
    """Rows' keys and values keyed by the token ids they cover, least recently used first out.

    Args:
        max_bytes: the most bytes of keys and values held (an entry larger than that is not kept).

    Example:
        >>> kv = lambda n: RowKV((torch.zeros(1, n, 2),), (torch.zeros(1, n, 2),))  # 16 bytes a token
        >>> cache = PrefixCache(max_bytes=16 * 8)
        >>> cache.store([5, 6, 7], kv(3)), cache.store([5, 6, 7, 8, 9], kv(5))
        (True, True)
        >>> entry, usable = cache.lookup([5, 6, 7, 8, 9, 1])  # the longest stored prefix
        >>> entry.ids, usable
        ((5, 6, 7, 8, 9), 5)
        >>> cache.lookup([5, 6, 7, 8, 9])[1]  # a whole prompt: its last token is prefilled again
        4
        >>> cache.lookup([5, 6, 1]) is None
        True
        >>> cache.store([1, 2], kv(2)), len(cache), cache.nbytes  # over 128 bytes: [5, 6, 7] is evicted
        (True, 2, 112)
    """

    def __init__(self, max_bytes: int):
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"PrefixCache max_bytes must be an integer >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.version: object = None  # the weights the entries were computed with (:func:`weights_version`)
        self._entries: OrderedDict[tuple[int, int], _Entry] = OrderedDict()  # (length, hash) -> entry, LRU first
        self._lengths: Counter[int] = Counter()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int]) -> tuple[_Entry, int] | None:
        """The longest entry whose tokens are a prefix of ``ids``, and how many of its tokens to use
        (at most ``len(ids) - 1``: the last prompt token is fed to get the next token's logits); None
        when no entry gives at least one."""
        hashes = _prefix_hashes(ids)
        for length in sorted(self._lengths, reverse=True):
            if length > len(ids):
                continue
            key = (length, hashes[length])
            entry = self._entries.get(key)
            if entry is not None and entry.ids == tuple(ids[:length]):
                usable = min(length, len(ids) - 1)
                if usable < 1:
                    return None
                self._entries.move_to_end(key)
                return entry, usable
        return None

    def store(self, ids: Sequence[int], kv: RowKV) -> bool:
        """Keep ``kv`` for ``ids`` (one key/value column per id), evicting the least recently used
        entries to stay within ``max_bytes``; False when it alone exceeds that."""
        if kv.length != len(ids):
            raise ValueError(f"PrefixCache.store: {len(ids)} token ids but keys and values for {kv.length}")
        if kv.nbytes > self.max_bytes:
            return False
        key = (len(ids), _prefix_hashes(ids)[-1])
        if key in self._entries:
            self._remove(key)
        while self.nbytes + kv.nbytes > self.max_bytes:
            self._remove(next(iter(self._entries)))
        self._entries[key] = _Entry(tuple(ids), kv)
        self._lengths[len(ids)] += 1
        self.nbytes += kv.nbytes
        return True

    def discard(self, entry: _Entry) -> None:
        """Drop ``entry`` if it is still held (a row's next entry extends it)."""
        key = (len(entry.ids), _prefix_hashes(entry.ids)[-1])
        if self._entries.get(key) is entry:
            self._remove(key)

    def check(self, version: object) -> None:
        """Empty the cache if the weights changed since its entries were computed."""
        if version != self.version:
            self.clear()
            self.version = version

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self.nbytes = 0

    def _remove(self, key: tuple[int, int]) -> None:
        entry = self._entries.pop(key)
        self._lengths[key[0]] -= 1
        if not self._lengths[key[0]]:
            del self._lengths[key[0]]
        self.nbytes -= entry.kv.nbytes


class RowKeeper:
    """Collects the rows :func:`~lit_rlvr.rollout.hf.decode_fast` finishes with, within a byte budget.

    Args:
        max_bytes: the most bytes of keys and values kept in all (rows past it are not kept).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.kept: dict[int, RowKV] = {}  # batch row -> its keys and values

    def take(self, rows: Sequence[int], index: Sequence[int], lengths: Sequence[int], cache, mask: Tensor) -> None:
        """Copy out batch rows ``rows``, at ``index`` in ``cache`` (a ``DynamicCache`` of ``(b, H, S, D)``
        layers) and ``mask`` (``(b, S)``, 1 on real tokens): each row's first ``lengths`` attended columns."""
        per_token = sum(
            2 * layer.keys.shape[1] * layer.keys.shape[3] * layer.keys.element_size() for layer in cache.layers
        )
        for b, i, n in zip(rows, index, lengths):
            if n < 1 or self.nbytes + n * per_token > self.max_bytes:
                continue
            cols = mask[i].nonzero().squeeze(-1)[:n]
            kv = RowKV(
                tuple(layer.keys[i].index_select(1, cols) for layer in cache.layers),
                tuple(layer.values[i].index_select(1, cols) for layer in cache.layers),
            )
            self.kept[b] = kv
            self.nbytes += kv.nbytes


@torch.inference_mode()
def batch_past(hits: Sequence[tuple[RowKV, int] | None]):
    """The cache of a batch whose rows start with stored prefixes, left-padded.

    Args:
        hits: per row, ``(kv, n)``: its first n stored columns; None for a row without one.

    Returns:
        a transformers ``DynamicCache`` of ``(B, H, Lc, D)`` layers (Lc the longest n, rows
        right-aligned) and its ``(B, Lc)`` long attention mask (0 on padding).
    """
    from transformers.cache_utils import DynamicCache

    first = next(kv for kv, _ in filter(None, hits))
    B, Lc = len(hits), max(n for _, n in filter(None, hits))
    mask = torch.zeros((B, Lc), dtype=torch.long, device=first.keys[0].device)
    layers = []
    for layer in range(len(first.keys)):
        H, _, D = first.keys[layer].shape
        keys = first.keys[layer].new_zeros((B, H, Lc, D))
        values = first.values[layer].new_zeros((B, H, Lc, D))
        for b, hit in enumerate(hits):
            if hit is not None:
                kv, n = hit
                keys[b, :, Lc - n :] = kv.keys[layer][:, :n]
                values[b, :, Lc - n :] = kv.values[layer][:, :n]
                mask[b, Lc - n :] = 1
        layers.append((keys, values))
    return DynamicCache(ddp_cache_data=layers), mask


def weights_version(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """Where each parameter lives and how often it was written in place (``Tensor._version``): it
    changes with an optimizer step, a ``load_state_dict``, a LoRA merge, or a replaced tensor."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def _prefix_hashes(ids: Sequence[int]) -> list[int]:
    """``len(ids) + 1`` hashes: entry j is the hash of ``ids[:j]``.

    Example:
        >>> h = _prefix_hashes([3, 4, 5])
        >>> len(h), h[2] == _prefix_hashes([3, 4])[2], h[2] == _prefix_hashes([4, 3])[2]
        (4, True, False)
    """
    out, h = [0], 0
    for t in ids:
        h = (h * _BASE + t + 1) % _MOD
        out.append(h)
    return out
