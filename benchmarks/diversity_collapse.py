"""Diversity collapse and its cure on the CPU demo task: same base, same compute, several seeds.

    python benchmarks/diversity_collapse.py            # 8 methods × 3 seeds (~1 hour on 2 cores)
    python benchmarks/diversity_collapse.py --quick    # GRPO, DPH-F, Pass@k × 1 seed, 60 steps

Every run goes through the ``lit-rlvr`` CLI and the files in ``configs/demo/``: the warm-started
base (reused), the reference cache (reused), then per seed: validate the base, and for each method
``fit`` (same steps, prompts per step and samples per prompt) and validate the exported policy.
Reports pass@1 … pass@32 in-domain (held-out countdown) and out-of-domain (addition, never trained
with RL), retention (share of base-solved prompts still solved at pass@32) and distinct correct
answers per prompt, with mean and 95% CI over seeds; writes ``benchmarks/results/diversity_collapse.md``
and a PNG, and states whether the papers' directions are reproduced.

The task and the hyper-parameters are those of ``configs/demo/`` (fixed before this benchmark was
first run; see ``shared/docs/DEMO_RECIPE.md``); nothing here is tuned to the outcome.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
METHODS = ["grpo", "dapo", "rkl", "dph_f", "dph_js", "passk", "passk_combined"]
QUICK_METHODS = ["grpo", "dph_f", "passk"]
SETS = {"countdown_val": "in-domain", "addition_val": "OOD"}
KS = [1, 4, 16, 32]
NOTES = """## How to read this

- Same base policy, same data order and sampling seeds per seed index, same RL budget (steps ×
  16 prompts × 16 samples) for every method; validation samples 32 completions per held-out
  prompt at temperature 1.0 with a seed distinct from training.
- "retention@32": pass@32 over the held-out prompts the base solved at least once in its own
  validation (a keep rate); "distinct correct": distinct valid expressions per prompt.
- CIs are t-intervals over 3 seeds: wide. A direction marked "(CIs overlap)" holds on the means
  but is not separated by the intervals.
- What was fixed before any benchmark run: the task, the warm start and every hyper-parameter in
  `configs/demo/` (from DEMO_RECIPE.md). One single-seed GRPO vs DPH-F demo run was looked at
  before this benchmark; after it, only DPH-JS's η was set (4.0, by matching its local gradient
  (u−1)/4 to forward KL's (u−1) at η = 1), before any JS run. Nothing was changed after this
  benchmark ran.
- Not reproduced as a clear effect here: Pass@k training raising pass@1 (the paper's Pass@k
  gains come with longer training and a Pass@1 phase after it); Pass@k keeps pass@k above GRPO
  but with overlapping intervals at 3 seeds.
"""
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # two-sided 95% t quantiles by dof


def lit(*args: str, log: Path) -> None:
    """Run ``lit-rlvr`` in a fresh process (2 torch threads); raise with the log tail on failure."""
    env = dict(os.environ, OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false")
    with log.open("a") as f:
        f.write(f"\n$ lit-rlvr {' '.join(args)}\n")
        f.flush()
        proc = subprocess.run([sys.executable, "-m", "lit_rlvr.cli", *args], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"lit-rlvr {args[0]} failed (exit {proc.returncode}); see {log}:\n" + log.read_text()[-3000:])


def prepare(work: Path, log: Path) -> None:
    lit("warmstart", "--config", "configs/demo/warmstart.yaml", "--out_dir", "artifacts/demo/base", "--progress_bar", "false", log=log)
    lit("demo-data", "--out_dir", "artifacts/demo/data", log=log)
    lit("cache", "--config", "configs/demo/cache.yaml", "--progress", "false", log=log)


def validate(label: str, seed: int, model: str, work: Path, log: Path, extra: list[str]) -> None:
    lit("validate", "--config", "configs/demo/base.yaml", "--config", "configs/demo/record.yaml",
        f"--trainer.callbacks.init_args.path={work / 'metrics.jsonl'}", f"--trainer.callbacks.init_args.label={label}",
        f"--model.model={model}", f"--rollout.init_args.seed={1000 + seed}", "--trainer.enable_progress_bar=false",
        *extra, log=log)


def run_all(methods: list[str], seeds: list[int], steps: int, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    log = work / "runs.log"
    prepare(work, log)
    for seed in seeds:
        counts = work / f"base_s{seed}_counts.json"
        validate(f"base/s{seed}", seed, "artifacts/demo/base", work, log, [f"--pass_counts.path={counts}"])
        for method in methods:  # same seed for every method: same prompts order and sampling seeds
            t0 = time.perf_counter()
            out = work / f"{method}_s{seed}"
            lit("fit", "--config", "configs/demo/base.yaml", "--config", f"configs/demo/{method}.yaml",
                f"--seed_everything={seed}", f"--data.seed={seed}", f"--rollout.init_args.seed={seed}",
                f"--trainer.max_steps={steps}", f"--export.dirpath={out / 'hf'}", "--trainer.enable_progress_bar=false",
                log=log)
            validate(f"{method}/s{seed}", seed, str(out / "hf"), work, log, [f"--model.retention_reference={counts}"])
            print(f"  seed {seed} {method}: {time.perf_counter() - t0:.0f} s", flush=True)


def summarise(work: Path) -> dict[str, dict[str, tuple[float, float]]]:
    """``{method: {metric: (mean, 95% CI half-width)}}`` over seeds."""
    per_method: dict[str, list[dict]] = {}
    for line in (work / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        per_method.setdefault(record["label"].split("/")[0], []).append(record)
    table = {}
    for method, records in per_method.items():
        keys = sorted({k for r in records for k in r if k.startswith("val/")})
        stats = {}
        for key in keys:
            values = [r[key] for r in records if key in r]
            mean = statistics.fmean(values)
            half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
            stats[key] = (mean, half)
        stats["seeds"] = (len(records), 0.0)
        table[method] = stats
    return table


def fmt(stat: tuple[float, float] | None) -> str:
    if stat is None:
        return "–"
    mean, half = stat
    return f"{mean:.3f}" if math.isnan(half) else f"{mean:.3f} ± {half:.3f}"


def markdown(table: dict, order: list[str]) -> str:
    lines = []
    for s, kind in SETS.items():
        lines += [f"\n**{s}** ({kind}; mean ± 95% CI over seeds)\n",
                  "| method | seeds | " + " | ".join(f"pass@{k}" for k in KS) + " | retention@32 | distinct correct |",
                  "|---|---|" + "---|" * (len(KS) + 2)]
        for m in order:
            if m not in table:
                continue
            st = table[m]
            cells = [fmt(st.get(f"val/{s}/pass@{k}")) for k in KS]
            cells += [fmt(st.get(f"val/{s}/retention/pass@32")), fmt(st.get(f"val/{s}/distinct_correct_answers"))]
            lines.append(f"| {m} | {int(st['seeds'][0])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def directions(table: dict) -> list[str]:
    """The papers' claims, checked on means (a CI that overlaps is said to be inconclusive)."""

    def get(m, s, k):
        return table.get(m, {}).get(f"val/{s}/pass@{k}")

    def cmp(a, b, higher: bool) -> str:
        if a is None or b is None:
            return "not run"
        (ma, ha), (mb, hb) = a, b
        holds = ma > mb if higher else ma < mb
        overlap = not (math.isnan(ha) or math.isnan(hb)) and abs(ma - mb) < ha + hb
        return ("yes" if holds else "NO") + (" (CIs overlap)" if overlap else "") + f" ({ma:.3f} vs {mb:.3f})"

    out = [f"- GRPO raises in-domain pass@1 over the base: {cmp(get('grpo', 'countdown_val', 1), get('base', 'countdown_val', 1), True)}",
           f"- GRPO lowers in-domain pass@32 below the base: {cmp(get('grpo', 'countdown_val', 32), get('base', 'countdown_val', 32), False)}"]
    for m in ("dph_f", "dph_js", "passk", "passk_combined"):
        if m in table:
            out.append(f"- {m} keeps in-domain pass@32 above GRPO's: {cmp(get(m, 'countdown_val', 32), get('grpo', 'countdown_val', 32), True)}")
    for m in ("dph_f", "dph_js"):
        if m in table:
            out.append(f"- {m} forgets less OOD (addition pass@1) than GRPO: {cmp(get(m, 'addition_val', 1), get('grpo', 'addition_val', 1), True)}")
    return out


def plot(table: dict, order: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SETS), figsize=(11, 4))
    for ax, (s, kind) in zip(axes, SETS.items()):
        for m in order:
            if m not in table:
                continue
            ks = [k for k in KS if f"val/{s}/pass@{k}" in table[m]]
            means = [table[m][f"val/{s}/pass@{k}"][0] for k in ks]
            errs = [0 if math.isnan(table[m][f"val/{s}/pass@{k}"][1]) else table[m][f"val/{s}/pass@{k}"][1] for k in ks]
            ax.errorbar(ks, means, yerr=errs, marker="o", capsize=3, label=m)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k")
        ax.set_ylabel("pass@k")
        ax.set_title(f"{s} ({kind})")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="GRPO, DPH-F and Pass@k, one seed, 60 steps")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--work", type=Path, default=ROOT / "artifacts" / "bench" / "diversity")
    parser.add_argument("--report-only", action="store_true", help="summarise an existing --work folder")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.methods, args.steps = [0], QUICK_METHODS, 60
        args.work = args.work.with_name(args.work.name + "_quick")
    t0 = time.perf_counter()
    if not args.report_only:
        if (args.work / "metrics.jsonl").exists():
            (args.work / "metrics.jsonl").unlink()
        run_all(args.methods, args.seeds, args.steps, args.work)
        (args.work / "seconds.txt").write_text(f"{time.perf_counter() - t0:.0f}")
    seconds = (args.work / "seconds.txt").read_text() if (args.work / "seconds.txt").exists() else "?"
    table = summarise(args.work)
    order = ["base", *args.methods]
    name = "diversity_collapse_quick" if args.quick else "diversity_collapse"
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(table, order, RESULTS / f"{name}.png")
    checks = directions(table)
    command = "python benchmarks/diversity_collapse.py" + (" --quick" if args.quick else "")
    body = (f"# Diversity collapse on the CPU demo task\n\nCommand: `{command}` — {len(args.seeds)} seed(s), "
            f"{args.steps} RL steps of 16 prompts × 16 samples per method, {seconds} s in all (2 CPU cores).\n"
            + markdown(table, order) + "\n\n## Directions of the papers\n\n" + "\n".join(checks)
            + f"\n\n![pass@k]({name}.png)\n\n" + (NOTES if not args.quick else ""))
    (RESULTS / f"{name}.md").write_text(body)
    print(body)
    grpo_gap = table.get("grpo", {}).get("val/countdown_val/pass@32", (math.nan,))[0] - table.get("base", {}).get("val/countdown_val/pass@32", (math.nan,))[0]
    print(f"grpo_minus_base_pass@32={grpo_gap:.3f}")


if __name__ == "__main__":
    main()
