"""``lit-rlvr report``: a Pass@k table (markdown) and a PNG of pass@k curves from MetricsWriter files.

    lit-rlvr report artifacts/demo/metrics.jsonl --out artifacts/demo/passk.png

Each label's last record is one run (e.g. ``base`` and ``dph_f``); each validation set is one
panel (in-domain and out-of-domain).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_PASS = re.compile(r"^val/(?P<set>[^/]+)/pass@(?P<k>\d+)$")


def load_runs(path: str | Path) -> dict[str, dict[str, float]]:
    """``{label: metrics}`` keeping each label's last record (in file order)."""
    runs: dict[str, dict[str, float]] = {}
    for line_no, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{line_no}: not a JSON record ({err})") from err
        runs[record.get("label", "run")] = record
    return runs


def pass_curves(metrics: dict[str, float]) -> dict[str, dict[int, float]]:
    """``{set: {k: pass@k}}`` from one record.

    Example:
        >>> pass_curves({"val/a/pass@1": 0.2, "val/a/pass@4": 0.5, "val/a/maj@4": 0.3, "step": 3})
        {'a': {1: 0.2, 4: 0.5}}
    """
    curves: dict[str, dict[int, float]] = {}
    for key, value in metrics.items():
        m = _PASS.match(key)
        if m:
            curves.setdefault(m["set"], {})[int(m["k"])] = float(value)
    return {s: dict(sorted(c.items())) for s, c in sorted(curves.items())}


def markdown_table(runs: dict[str, dict[str, float]]) -> str:
    """One row per (validation set, run), one column per k, plus distinct correct answers and retention.

    Example:
        >>> print(markdown_table({"base": {"val/a/pass@1": 0.25, "val/a/pass@2": 0.5}}))
        | set | run | pass@1 | pass@2 | distinct correct | retention@max k |
        |---|---|---|---|---|---|
        | a | base | 0.250 | 0.500 | – | – |
    """
    curves = {label: pass_curves(m) for label, m in runs.items()}
    ks = sorted({k for c in curves.values() for s in c.values() for k in s})
    head = "| set | run | " + " | ".join(f"pass@{k}" for k in ks) + " | distinct correct | retention@max k |"
    lines = [head, "|" + "---|" * (len(ks) + 4)]
    sets = sorted({s for c in curves.values() for s in c})
    for s in sets:
        for label, c in curves.items():
            if s not in c:
                continue
            cells = [f"{c[s][k]:.3f}" if k in c[s] else "–" for k in ks]
            m = runs[label]
            distinct = m.get(f"val/{s}/distinct_correct_answers")
            retention = [v for key, v in m.items() if key.startswith(f"val/{s}/retention/pass@")]
            extra = [f"{distinct:.2f}" if distinct is not None else "–", f"{retention[-1]:.3f}" if retention else "–"]
            lines.append(f"| {s} | {label} | " + " | ".join(cells + extra) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[str, float]], out: str | Path) -> Path:
    """pass@k against k (log scale), one panel per validation set, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {label: pass_curves(m) for label, m in runs.items()}
    sets = sorted({s for c in curves.values() for s in c})
    fig, axes = plt.subplots(1, max(len(sets), 1), figsize=(5 * max(len(sets), 1), 4), squeeze=False)
    for ax, s in zip(axes[0], sets):
        for label, c in curves.items():
            if s in c:
                ax.plot(list(c[s]), list(c[s].values()), marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k")
        ax.set_ylabel("pass@k")
        ax.set_title(s)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> str:
    """Print the table and write the PNG (``--out``)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="lit-rlvr report", description=__doc__)
    parser.add_argument("metrics", type=str, help="a JSON-lines file written by MetricsWriter")
    parser.add_argument("--out", type=str | None, default=None, help="PNG of the pass@k curves")
    args = parser.parse_args(argv)
    runs = load_runs(args.metrics)
    if not runs:
        raise SystemExit(f"{args.metrics}: no records")
    table = markdown_table(runs)
    print(table)
    if args.out:
        print(f"plot: {plot(runs, args.out)}")
    return table
