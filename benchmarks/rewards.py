"""Reward throughput on real data: items/s, single process vs a BatchScorer worker pool.

Workloads (synthetic completions around the real gold answers; math uses the default
``extraction="math_verify"``, i.e. math-verify's parse of the whole completion):

- math / GSM8K: per problem a boxed correct answer, a boxed wrong one (gold + 1), a ``#### N``
  answer and a completion with no answer (integers: the fast exact paths).
- math / MATH-500: per problem the boxed gold LaTeX and ``gold + 1`` (2 completions per gold, so
  the gold parse is half the work).
- math / MATH-500 groups of 8: per problem a group as a GRPO step scores it — the gold boxed,
  as "The final answer is $…$", as "Answer: $…$", with ``\\dfrac``, after the problem statement
  as reasoning (long LaTeX text), ``gold + 1``, another problem's gold, and no answer.
- sql / Spider dev: per runnable question the gold query in a fence, the gold wrapped in
  ``SELECT * FROM (…) LIMIT 1`` and a query on a missing column (execution + comparison).

Each workload starts cold: the single-process run clears the math reward's caches first, the
pool run gets new worker processes (started and imported before timing). Gold answers are then
parsed once per process and shared by all their completions. Writes
``benchmarks/results/rewards.md`` with the load average before and after (timings on a shared
machine move with it), keeping the file's hand-written agreement section; the last printed
line is the headline.

Usage: ``python benchmarks/rewards.py [--quick] [--workers 2] [--data ../shared/data]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import common  # benchmarks/common.py (run as a script from any directory)

ROOT = common.ROOT
KEPT_SECTION = "## Agreement with math-verify"  # written by hand from the test; kept on rewrite


def gsm8k_items(data: Path, limit: int | None) -> tuple[list[str], list[dict]]:
    rows = [json.loads(line) for line in (data / "gsm8k" / "test.jsonl").open()][:limit]
    completions, out = [], []
    for i, r in enumerate(rows):
        gold = r["answer"].rsplit("####", 1)[1].strip()
        wrong = int(gold.replace(",", "")) + 1
        row = {"id": f"gsm8k-{i}", "prompt": r["question"], "answer": r["answer"], "reward": "math"}
        for text in (
            f"... so she makes \\boxed{{{gold}}}.",
            f"Total: \\boxed{{{wrong}}}",
            f"9 * 2 = 18\n#### {gold}",
            "I am not sure.",
        ):
            completions.append(text)
            out.append(row)
    return completions, out


def math500_items(data: Path, limit: int | None) -> tuple[list[str], list[dict]]:
    rows = [json.loads(line) for line in (data / "math500" / "test.jsonl").open()][:limit]
    completions, out = [], []
    for r in rows:
        row = {"id": r["unique_id"], "prompt": r["problem"], "answer": r["answer"], "reward": "math"}
        for text in (f"Hence \\boxed{{{r['answer']}}}.", f"Hence \\boxed{{{r['answer']} + 1}}."):
            completions.append(text)
            out.append(row)
    return completions, out


def math500_group_items(data: Path, limit: int | None) -> tuple[list[str], list[dict]]:
    rows = [json.loads(line) for line in (data / "math500" / "test.jsonl").open()][:limit]
    completions, out = [], []
    for i, r in enumerate(rows):
        a, other = r["answer"], rows[(i + len(rows) // 2) % len(rows)]["answer"]
        dfrac = a.replace("\\frac", "\\dfrac")
        row = {"id": r["unique_id"], "prompt": r["problem"], "answer": a, "reward": "math"}
        group = [
            f"Hence \\boxed{{{a}}}.",
            f"The final answer is ${a}$. I hope it is correct.",
            f"Answer: ${a}$",
            f"So it is $\\boxed{{{dfrac}}}$.",
            f"{r['problem']}\n\nWorking through it, the answer is $\\boxed{{{a}}}$.",
            f"Hence \\boxed{{{a} + 1}}.",
            f"Hence \\boxed{{{other}}}.",
            "I am not sure how to finish this.",
        ]
        completions += group
        out += [row] * len(group)
    return completions, out


def spider_items(data: Path, limit: int | None) -> tuple[list[str], list[dict]]:
    base = data / "spider_dev"
    rows = [
        r
        for r in json.load((base / "dev.json").open())
        if (base / "database" / r["db_id"] / f"{r['db_id']}.sqlite").exists()
    ]
    completions, out = [], []
    for i, r in enumerate(rows[:limit]):
        db = str(base / "database" / r["db_id"] / f"{r['db_id']}.sqlite")
        row = {"id": f"spider-{i}", "prompt": r["question"], "answer": r["query"], "reward": "sql", "db_path": db}
        gold = r["query"].strip().rstrip(";")
        for text in (
            f"```sql\n{gold}\n```",
            f"```sql\nSELECT * FROM ({gold}) LIMIT 1\n```",
            "SELECT no_such_column FROM sqlite_master",
        ):
            completions.append(text)
            out.append(row)
    return completions, out


def clear_math_caches() -> None:
    """Forget every memoised parse and verdict of the math reward in this process."""
    from lit_rlvr.rewards import math as math_reward

    for obj in vars(math_reward).values():
        if callable(getattr(obj, "cache_clear", None)):
            obj.cache_clear()


def throughput(scorer, completions: list[str], rows: list[dict]) -> tuple[float, dict[str, int]]:
    start = time.perf_counter()
    results = scorer.score(completions, rows)
    elapsed = time.perf_counter() - start
    statuses: dict[str, int] = {}
    for r in results:
        key = r.status
        statuses[key] = statuses.get(key, 0) + 1
    return len(completions) / elapsed, statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="subsets; finishes in < 1 min")
    parser.add_argument("--out", type=Path, help="default benchmarks/results/rewards.md (--quick: a temporary folder)")
    args = parser.parse_args()
    args.out = Path(
        common.result_name(args.out and str(args.out), args.quick, str(ROOT / "benchmarks" / "results" / "rewards.md"))
    )
    if not args.data.is_dir():
        sys.exit(f"real data not found at {args.data} (pass --data)")
    from lit_rlvr.rewards import BatchScorer

    n_gsm, n_math, n_sql = (300, 100, 300) if args.quick else (None, None, None)
    workloads = {
        "math / GSM8K": gsm8k_items(args.data, n_gsm),
        "math / MATH-500": math500_items(args.data, n_math),
        "math / MATH-500 groups of 8": math500_group_items(args.data, n_math),
        "sql / Spider dev": spider_items(args.data, n_sql),
    }
    single = BatchScorer(workers=0, timeout_s=5.0)
    load_before = common.load_average()
    lines = [
        f"# Reward throughput ({'quick' if args.quick else 'full'}; {time.strftime('%Y-%m-%d %H:%M')}; git {common.git_rev()})",
        "",
        f"{os.cpu_count()} CPUs (shared with other jobs; preliminary), Python {platform.python_version()}; pool = "
        f"BatchScorer with {args.workers} worker processes, chunk 16; single = in-process. items/s, higher is better. "
        f"Load average (1/5/15 min) before: {load_before}.",
        "",
        f"| workload | items | single (items/s) | pool x{args.workers} (items/s) | pool/single | statuses |",
        "|---|---:|---:|---:|---:|---|",
    ]
    print("\n".join(lines[-2:]))
    rates = {}
    for name, (completions, rows) in workloads.items():
        clear_math_caches()
        s_rate, statuses = throughput(single, completions, rows)
        with BatchScorer(workers=args.workers, timeout_s=5.0) as pool:
            pool.score(["0"] * args.workers, [{"id": "warm", "reward": "math", "answer": "1"}] * args.workers)
            p_rate, _ = throughput(pool, completions, rows)
        rates[name] = (s_rate, p_rate)
        line = f"| {name} | {len(completions)} | {s_rate:,.0f} | {p_rate:,.0f} | {p_rate / s_rate:.2f}x | {statuses} |"
        print(line)
        lines.append(line)
    headline = f"headline: pool(x{args.workers}) items/s = " + ", ".join(
        f"{p:,.0f} {name}" for name, (_, p) in rates.items()
    )
    lines += ["", f"Load average after: {common.load_average()}.", "", headline, ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    kept = args.out.read_text().partition(KEPT_SECTION)[1:] if args.out.exists() else ()
    args.out.write_text("\n".join(lines) + "\n" + "".join(kept))
    print(f"wrote {args.out}")
    print(headline)


if __name__ == "__main__":
    main()
