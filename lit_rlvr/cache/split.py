"""DPH-RL's split of the training prompts by the reference policy's pass count (docs/methods.md §2).

A prompt whose pass count c (of n cached π_ref samples) reaches ``perfect_threshold`` is
"near-perfect" (D_pef): it is not trained on with RL, and its cached correct samples anchor the
f-divergence term instead. The others (D_exp) are explored with the RL loss. The paper's default
threshold is n (all correct); it also used 6/8 and 7/8.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CacheSplit:
    """The two halves of the training set.

    Attributes:
        pef: ids of the near-perfect prompts (pass count >= threshold), in cache order.
        exp: ids of the other prompts, in cache order.
        threshold: the pass count used.
    """

    pef: tuple[str, ...]
    exp: tuple[str, ...]
    threshold: int


def split_by_pass_count(
    ids: Sequence[str], pass_counts: Sequence[int], n: int, perfect_threshold: int | None = None
) -> CacheSplit:
    """Split prompt ids into D_pef (pass count >= ``perfect_threshold``) and D_exp.

    Args:
        ids: prompt ids.
        pass_counts: their pass counts, each in [0, n].
        n: samples per prompt.
        perfect_threshold: in [1, n]; None means n (only all-correct prompts are near-perfect).

    Example:
        >>> split_by_pass_count(["a", "b", "c"], [8, 7, 0], n=8)
        CacheSplit(pef=('a',), exp=('b', 'c'), threshold=8)
        >>> split_by_pass_count(["a", "b", "c"], [8, 7, 0], n=8, perfect_threshold=7).pef
        ('a', 'b')
    """
    threshold = n if perfect_threshold is None else perfect_threshold
    if not 1 <= threshold <= n:
        raise ValueError(f"perfect_threshold must be in [1, n={n}], got {perfect_threshold}")
    pef = tuple(i for i, c in zip(ids, pass_counts, strict=True) if c >= threshold)
    exp = tuple(i for i, c in zip(ids, pass_counts) if c < threshold)
    return CacheSplit(pef=pef, exp=exp, threshold=threshold)


def pass_count_histogram(pass_counts: Sequence[int], n: int) -> list[int]:
    """Number of prompts with each pass count 0..n.

    Example:
        >>> pass_count_histogram([0, 2, 2, 4], n=4)
        [1, 0, 2, 0, 1]
    """
    return np.bincount(np.asarray(pass_counts, dtype=np.int64), minlength=n + 1).tolist()


def summary(cache, perfect_threshold: int | None = None, anchor_samples: str = "correct") -> str:
    """A printable summary of a :class:`~lit_rlvr.cache.reader.ReferenceCache`: histogram, |D_pef|, |D_exp|."""
    split = split_by_pass_count(cache.ids, cache.pass_counts, cache.n, perfect_threshold)
    hist = pass_count_histogram(cache.pass_counts, cache.n)
    width = max(hist) or 1
    lines = [
        f"reference cache {cache.path}: {cache.num_prompts} prompts × n={cache.n} samples",
        f"mean reward {float(np.mean(cache.rewards)):.4f}; scorer statuses {cache.status_counts()}",
        "pass count histogram:",
    ]
    lines += [f"  {c:>3}/{cache.n}: {h:>7}  {'#' * round(40 * h / width)}" for c, h in enumerate(hist)]
    anchors = len(cache.sample_indices(split.pef, anchor_samples)) if split.pef else 0
    lines.append(
        f"|D_pef| = {len(split.pef)} (pass count >= {split.threshold}), |D_exp| = {len(split.exp)}, "
        f"anchor samples ({anchor_samples}) = {anchors}"
    )
    return "\n".join(lines)
