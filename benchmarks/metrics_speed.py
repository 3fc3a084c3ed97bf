"""PassAtK speed: n = 1024 samples for 10k prompts, the full ladder k = 1, 2, 4, …, 1024.

Three ways in, each timed as ``update`` + ``compute`` on a fresh :class:`lit_rlvr.metrics.PassAtK`:

- ``correct (P, n)`` bool — what validation passes (10.24M booleans);
- ``num_correct (P,)`` with ``n`` — counts only;
- ``num_correct (P,)`` with per-prompt ``n (P,)`` of mixed sizes (512 or 1024; ladder up to 512) —
  the grouped path.

Reported: the median of ``--repeats`` runs after one warm-up, and a check of the result against
a float64 reference computed independently (``math.comb``) on 200 random prompts.

    python benchmarks/metrics_speed.py          # P = 10,000, 11 repeats
    python benchmarks/metrics_speed.py --quick  # same size, 5 repeats (< 10 s)

Last line: ``passk_ms_n1024_p10k=<median ms of the bool-matrix path>`` (target < 100).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import common  # benchmarks/common.py (run as a script from any directory)


def reference_pass_at_k(n: int, c: int, k: int) -> float:
    """1 − C(n−c, k)/C(n, k) with exact integers (Chen et al. 2021, Eq. 1)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k) if n - c >= k else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="file name under benchmarks/results/ or an absolute path")
    cfg = parser.parse_args()
    if cfg.quick:
        cfg.repeats = 5
    cfg.out = cfg.out or ("metrics_speed_quick.md" if cfg.quick else "metrics_speed.md")
    common.set_threads(cfg.threads)
    import torch

    from lit_rlvr.metrics import PassAtK

    load_before = common.load_average()
    gen = torch.Generator().manual_seed(0)
    P, n = cfg.prompts, cfg.n
    ladder = [2**i for i in range(n.bit_length()) if 2**i <= n]
    p_correct = torch.rand(P, 1, generator=gen)  # per-prompt difficulty
    correct = torch.rand(P, n, generator=gen) < p_correct  # (P, n) bool
    counts = correct.sum(1)  # (P,)
    mixed_n = torch.where(torch.arange(P) % 2 == 0, n, n // 2)
    mixed_c = torch.minimum(counts, mixed_n)
    half_ladder = [k for k in ladder if k <= n // 2]

    def bool_path():
        m = PassAtK(k=ladder)
        m.update(correct)
        return m.compute()

    def counts_path():
        m = PassAtK(k=ladder)
        m.update(num_correct=counts, n=n)
        return m.compute()

    def mixed_path():
        m = PassAtK(k=half_ladder)
        m.update(num_correct=mixed_c, n=mixed_n)
        return m.compute()

    paths = {
        f"update(correct ({P}, {n}) bool) + compute": bool_path,
        f"update(num_correct ({P},), n={n}) + compute": counts_path,
        f"update(num_correct, n ({P},) ∈ {{{n // 2}, {n}}}) + compute": mixed_path,
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    for fn in paths.values():
        fn()  # warm-up (allocator, lazy imports)
    for _ in range(cfg.repeats):  # alternate the paths
        for name, fn in paths.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)

    result = bool_path()
    idx = torch.randperm(P, generator=gen)[:200]
    m = PassAtK(k=ladder)
    m.update(num_correct=counts[idx], n=n)
    got = m.compute()
    worst = max(
        abs(float(got[f"pass@{k}"]) - statistics.fmean(reference_pass_at_k(n, int(counts[i]), k) for i in idx.tolist()))
        for k in ladder
    )

    lines = [
        f"# PassAtK speed ({'quick' if cfg.quick else 'full'}; {time.strftime('%Y-%m-%d %H:%M')}; commit {common.git_rev()})",
        "",
        f"P={P} prompts, n={n} samples, ladder k ∈ {ladder} ({len(ladder)} budgets); median of {cfg.repeats} alternated "
        f"runs after a warm-up, fresh metric each run. {common.machine_line(cfg.threads)}. Load average before: "
        f"{load_before}; after: {common.load_average()}.",
        "",
        "| path | median (ms) | min (ms) |",
        "|---|---:|---:|",
    ]
    for name, values in times.items():
        lines.append(f"| {name} | {common.median_ms(values):.1f} | {min(values) * 1e3:.1f} |")
    lines += [
        "",
        f"pass@1 = {float(result['pass@1']):.4f}, pass@{n} = {float(result[f'pass@{n}']):.4f}; max |PassAtK − exact "
        f"math.comb reference| over the ladder on 200 random prompts: {worst:.2e}.",
    ]
    print("\n".join(lines[4:]))
    path = common.write_result(cfg.out, lines)
    print(f"wrote {path}")
    print(f"passk_ms_n1024_p10k={common.median_ms(times[next(iter(paths))]):.1f}")


if __name__ == "__main__":
    main()
