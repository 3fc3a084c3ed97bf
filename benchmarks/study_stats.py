"""The studies' statistics: means and 95% t-intervals over runs, paired differences on the same base × seed,
the sign rule that judges a pre-registered direction (:func:`sign_seen`, study 3's rule) and the hypotheses it
judges, and the pass@1–pass@16 points the figures draw.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def sign_seen(diffs: list[float]) -> str:
    """Study 3's rule: ``+`` when the 95% t-interval of the mean lies above 0, ``-`` below, ``=`` when it contains 0
    (or when one value gives no interval).

    Example:
        >>> sign_seen([0.05, 0.06, 0.07]), sign_seen([-0.05, 0.06, 0.07]), sign_seen([-0.05, -0.06, -0.07]), sign_seen([0.1])
        ('+', '=', '-', '=')
    """
    m, h = mean(diffs), ci(diffs)
    return "=" if math.isnan(h) or m - h <= 0 <= m + h else ("+" if m > 0 else "-")


def sign_line(diffs: list[float], subject: str, want: str | None, pairs: str = "paired runs") -> str:
    """``- subject: mean ± CI over n pairs (worst …); `` then the sign :func:`sign_seen` gives and, when
    ``want`` (the allowed signs) is given, MET or MISS.

    Example:
        >>> sign_line([0.05, 0.06, 0.07], "DPH-F pass@16 − GRPO", "+")
        '- DPH-F pass@16 − GRPO: 0.060 ± 0.025 over 3 paired runs (worst +0.050); expected +, seen +: MET'
    """
    seen = sign_seen(diffs)
    line = f"- {subject}: {fmt(diffs)} over {len(diffs)} {pairs} (worst {min(diffs):+.3f}); "
    if want is None:
        return line + f"seen {seen} (no direction pre-registered)"
    return line + f"expected {' or '.join(want)}, seen {seen}: {'MET' if seen in want else 'MISS'}"


def verdict(parts: list[str], names: list[str]) -> str:
    """A hypothesis from its parts' lines (:func:`sign_line`; ``names``: each part's name): HELD, MISSED
    naming the parts that missed, or not run.

    Example:
        >>> verdict(["- a: … expected +, seen +: MET", "- b: … expected +, seen =: MISS"], ["pass@1", "pass@16"])
        'MISSED (pass@16 missed)'
    """
    missed = [n for n, p in zip(names, parts) if p.endswith("MISS")]
    return (
        "not run"
        if any(p.endswith("not run") for p in parts)
        else f"MISSED ({', '.join(missed)} missed)"
        if missed
        else "HELD"
    )


def pareto_point(rs: list[dict], s: str) -> tuple[float, float, float, float] | None:
    """(mean pass@1, mean pass@16, their 95% CI half-widths, 0 for a single run) of the records ``rs`` on set ``s``."""
    rs = [r for r in rs if f"val/{s}/pass@16" in r]
    if not rs:
        return None
    a, b = [r[f"val/{s}/pass@1"] for r in rs], [r[f"val/{s}/pass@16"] for r in rs]
    return mean(a), mean(b), 0 if math.isnan(ci(a)) else ci(a), 0 if math.isnan(ci(b)) else ci(b)


def pareto_curves(
    ax, by: dict, curves: list[tuple[str, list[str]]], s: str, bases=("b0",), stars=(), styles: dict | None = None
) -> None:
    """One line per ``(label, variants)`` through the variants' points (runs on ``bases``), CIs as error bars.

    ``styles``: label → matplotlib keywords (colour, marker) so that a method looks the same in every panel.
    """
    for label, variants in curves:
        points = [
            p
            for v in variants
            if (p := pareto_point([r for r in by.get(v, []) if r["label"].split("/")[1] in bases], s))
        ]
        if points:
            xs, ys, xe, ye = zip(*points)
            style = {
                "marker": "*" if label in stars else "o",
                "markersize": 10 if label in stars else 5,
                **(styles or {}).get(label, {}),
            }
            ax.errorbar(xs, ys, xerr=xe, yerr=ye, capsize=3, label=label, **style)
    ax.set_xlabel("pass@1")
    ax.set_ylabel("pass@16")
    ax.grid(alpha=0.3)


def step_seconds(times: dict[str, dict], variant: str, bases=("b0",)) -> list[float]:
    """Training seconds per optimizer step of ``variant``'s runs on ``bases``."""
    return [
        t["train_seconds"] / t["steps"]
        for label, t in times.items()
        if label.split("/")[0] == variant and label.split("/")[1] in bases and t["steps"]
    ]


def block_of(record: dict) -> tuple[str, str]:
    """(base, seed) of a record's label ``variant/b<base>/s<seed>``."""
    _, b, s = record["label"].split("/")
    return b, s


def in_blocks(by: dict, blocks, variants=None) -> dict:
    """``by`` with the records of ``variants`` (every variant when None) kept only on the (base, seed) ``blocks``."""
    return {
        v: [r for r in rs if variants is not None and v not in variants or block_of(r) in blocks]
        for v, rs in by.items()
    }


def cell(values: list[float], digits: int = 3, signed: bool = False) -> str:
    """``mean ± 95% CI (worst)``, the worst being the lowest value; ``signed``: differences, shown with their sign."""
    if not values:
        return "–"
    sign = "+" if signed else ""
    m, h = mean(values), ci(values)
    if len(values) < 2:
        return f"{m:{sign}.{digits}f}"
    return f"{m:{sign}.{digits}f} ± {h:.{digits}f} ({min(values):{sign}.{digits}f})"


def paired(by: dict, variant: str, key: str, against: str = "grpo") -> list[float]:
    """``variant`` − ``against`` on the same base × seed, for every pair that has ``key``."""
    other = {tuple(r["label"].split("/")[1:]): r for r in by.get(against, [])}
    return [
        r[key] - o[key]
        for r in by.get(variant, [])
        if (o := other.get(tuple(r["label"].split("/")[1:]))) and key in r and key in o
    ]


@dataclass(frozen=True)
class Hypothesis:
    """A direction written before the runs: ``variant`` − ``against`` paired on base × seed, judged by
    :func:`sign_seen`; ``allowed`` maps what is compared (study 4: k of held-out pass@k; study 5,
    benchmarks/tool_use.py: a metric's name) to the signs that count as MET."""

    name: str
    variant: str
    against: str
    allowed: dict[int, str] | dict[str, str]
    source: str


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def ci(values: list[float]) -> float:
    """Half-width of the two-sided 95% t-interval of the mean (nan below 2 values)."""
    if len(values) < 2:
        return math.nan
    return T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def group(records: list[dict]) -> dict[str, list[dict]]:
    """Records by variant (the label's first part); the base's validations under ``base``/``sql_base``."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        out[r["label"].split("/")[0]].append(r)
    return out


def deltas(records: list[dict], bases: dict[tuple[str, str], dict], key: str) -> list[float]:
    """Per run, ``key`` minus the same base (and validation seed)'s value."""
    out = []
    for r in records:
        _, b, s = r["label"].split("/")
        base = bases.get((b, s))
        if base is not None and key in r and key in base:
            out.append(r[key] - base[key])
    return out


def fmt(values: list[float], digits: int = 3) -> str:
    if not values:
        return "–"
    m, h = mean(values), ci(values)
    return f"{m:.{digits}f}" if math.isnan(h) else f"{m:.{digits}f} ± {h:.{digits}f}"
