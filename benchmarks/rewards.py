"""Reward throughput on real data: items/s, single process vs a BatchScorer worker pool.

Workloads (synthetic completions around the real gold answers):

- math / GSM8K: per problem a boxed correct answer, a boxed wrong one (gold + 1), a ``#### N``
  answer and a completion with no answer (the fast exact-number path).
- math / MATH-500: per problem the boxed gold LaTeX and ``gold + 1`` (both through math-verify).
- sql / Spider dev: per runnable question the gold query in a fence, the gold wrapped in
  ``SELECT * FROM (…) LIMIT 1`` and a query on a missing column (execution + comparison).

The single-process run scores in this process (fresh caches); the pool run uses warm (imported)
workers with cold caches. Writes ``benchmarks/results/rewards.md``; the last printed line is the
headline pool/single ratio.

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

ROOT = Path(__file__).resolve().parents[1]


def gsm8k_items(data: Path, limit: int | None) -> tuple[list[str], list[dict]]:
    rows = [json.loads(line) for line in (data / "gsm8k" / "test.jsonl").open()][:limit]
    completions, out = [], []
    for i, r in enumerate(rows):
        gold = r["answer"].rsplit("####", 1)[1].strip()
        wrong = int(gold.replace(",", "")) + 1
        row = {"id": f"gsm8k-{i}", "prompt": r["question"], "answer": r["answer"], "reward": "math"}
        for text in (f"... so she makes \\boxed{{{gold}}}.", f"Total: \\boxed{{{wrong}}}", f"9 * 2 = 18\n#### {gold}", "I am not sure."):
            completions.append(text)
            out.append(row)
    return completions, out


def math500_items(data: Path, limit: int | None) -> tuple[list[str], list[dict]]:
    rows = [json.loads(line) for line in (data / "math500" / "test.jsonl").open()][:limit]
    completions, out = [], []
    for i, r in enumerate(rows):
        row = {"id": r["unique_id"], "prompt": r["problem"], "answer": r["answer"], "reward": "math"}
        for text in (f"Hence \\boxed{{{r['answer']}}}.", f"Hence \\boxed{{{r['answer']} + 1}}."):
            completions.append(text)
            out.append(row)
    return completions, out


def spider_items(data: Path, limit: int | None) -> tuple[list[str], list[dict]]:
    base = data / "spider_dev"
    rows = [r for r in json.load((base / "dev.json").open()) if (base / "database" / r["db_id"] / f"{r['db_id']}.sqlite").exists()]
    completions, out = [], []
    for i, r in enumerate(rows[:limit]):
        db = str(base / "database" / r["db_id"] / f"{r['db_id']}.sqlite")
        row = {"id": f"spider-{i}", "prompt": r["question"], "answer": r["query"], "reward": "sql", "db_path": db}
        gold = r["query"].strip().rstrip(";")
        for text in (f"```sql\n{gold}\n```", f"```sql\nSELECT * FROM ({gold}) LIMIT 1\n```", "SELECT no_such_column FROM sqlite_master"):
            completions.append(text)
            out.append(row)
    return completions, out


def throughput(scorer, completions: list[str], rows: list[dict]) -> tuple[float, dict[str, int]]:
    start = time.perf_counter()
    results = scorer.score(completions, rows)
    elapsed = time.perf_counter() - start
    statuses: dict[str, int] = {}
    for r in results:
        key = r.status if not r.status.startswith("error") else "error"
        statuses[key] = statuses.get(key, 0) + 1
    return len(completions) / elapsed, statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="subsets; finishes in < 1 min")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rewards.md")
    args = parser.parse_args()
    if not args.data.is_dir():
        sys.exit(f"real data not found at {args.data} (pass --data)")
    sys.path.insert(0, str(ROOT))
    from lit_rlvr.rewards import BatchScorer

    n_gsm, n_math, n_sql = (300, 100, 300) if args.quick else (None, None, None)
    workloads = {
        "math / GSM8K": gsm8k_items(args.data, n_gsm),
        "math / MATH-500": math500_items(args.data, n_math),
        "sql / Spider dev": spider_items(args.data, n_sql),
    }
    single = BatchScorer(num_workers=0, timeout_s=5.0)
    pool = BatchScorer(num_workers=args.workers, timeout_s=5.0)
    warm_c, warm_r = math500_items(args.data, 2)
    pool.score(warm_c * args.workers, warm_r * args.workers)  # workers imported and ready

    lines = [
        f"# Reward throughput ({'quick' if args.quick else 'full'}; {time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"{os.cpu_count()} CPUs (shared), Python {platform.python_version()}; pool = BatchScorer with "
        f"{args.workers} worker processes, chunk 16; single = in-process. items/s, higher is better.",
        "",
        f"| workload | items | single (items/s) | pool x{args.workers} (items/s) | pool/single | statuses |",
        "|---|---:|---:|---:|---:|---|",
    ]
    print("\n".join(lines[-2:]))
    ratios = {}
    for name, (completions, rows) in workloads.items():
        s_rate, statuses = throughput(single, completions, rows)
        p_rate, _ = throughput(pool, completions, rows)
        ratios[name] = p_rate / s_rate
        line = f"| {name} | {len(completions)} | {s_rate:,.0f} | {p_rate:,.0f} | {ratios[name]:.2f}x | {statuses} |"
        print(line)
        lines.append(line)
    pool.close()
    headline = (
        f"headline: pool(x{args.workers})/single items/s = {ratios['math / GSM8K']:.2f}x math (GSM8K), "
        f"{ratios['math / MATH-500']:.2f}x math (MATH-500), {ratios['sql / Spider dev']:.2f}x SQL (Spider dev)"
    )
    lines += ["", headline, ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    print(headline)


if __name__ == "__main__":
    main()
