"""Study 5: does tool use collapse under RL, and which method keeps it (benchmarks/results/study_tools_plan.md).

    python benchmarks/tool_use.py --slots 2                            # the study: 4 methods × 2 bases × 3 seeds
    python benchmarks/tool_use.py --smoke --work /tmp/tools_smoke      # its smoke check (minutes; numbers are not results)
    python benchmarks/tool_use.py --report-only                        # the report from the work folder alone

The multi-turn CPU demo (``configs/demo/agents/``, docs/agents.md): the countdown checker
environment, where the model may check expressions (``3+7*5?`` → ``=38``) before it answers
(``3*7+5;``). Per base seed: ``lit-rlvr warmstart --config configs/demo/agents/warmstart.yaml``
(a fixed number of steps, no time limit), the base's multi-turn reference cache
(``configs/demo/agents/cache.yaml``); per job ``lit-rlvr fit --config configs/demo/agents/base.yaml
--config configs/demo/agents/<method>.yaml`` (its CSV log holds the curves over training) and
``lit-rlvr validate`` of the export with ``configs/demo/agents/record.yaml`` (64 held-out prompts ×
8 trajectories). Every job runs through :class:`study_runner.Study` (two at a time, one torch
thread each; a rerun skips what is recorded), the hypotheses (:data:`HYPOTHESES`) are judged by study
3's rule (:func:`study_stats.sign_seen`) on the paired differences over base × seed.
Report: ``benchmarks/results/study_tools.md`` with ``study_tools_curves.png`` and
``study_tools_pareto.png`` (``--smoke``: in the work folder).
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import study3
import study4
import study_methods
import study_runner
import study_stats

ROOT, RESULTS = study_runner.ROOT, study_runner.RESULTS
AGENTS = "configs/demo/agents"
VAL = "countdown_val"  # 64 held-out (digits, target) pairs in record.yaml's validation
METHODS = ("grpo", "dph_f", "passk", "max_rl")  # the order inside a block
LADDER = (1, 2, 4, 8)  # pass@k of the final answers, 8 trajectories per prompt


@dataclass(frozen=True)
class ToolSetting:
    """What a work folder runs: the plan's (:data:`TOOLS`) or the smoke check's (:data:`SMOKE`: never a result)."""

    bases: tuple[int, ...]
    seeds: tuple[int, ...]
    steps: int  # RL steps of every job (8 prompts × 8 trajectories each)
    warm_steps: int  # the bases' warm-start steps (no time limit: the base is the same on a busy machine)
    val_every: int  # in-training validation (2 × 16 held-out prompts) every this many steps: the curves
    validate_flags: tuple[str, ...] = ()  # added to every final validation


TOOLS = ToolSetting(bases=(0, 1), seeds=(0, 1, 2), steps=120, warm_steps=150, val_every=20)
SMOKE = ToolSetting(
    bases=(0,), seeds=(0,), steps=2, warm_steps=5, val_every=1, validate_flags=("--trainer.limit_val_batches=1",)
)


# study_tools_plan.md's table, written before any run
HYPOTHESES = (
    study_stats.Hypothesis(
        "T1",
        "grpo",
        "base",
        {"tool_calls": "-", "single_turn": "+"},
        "VerlTool (arXiv 2509.01055) and verl's text2sql tutorial: tool calls decrease after dozens of RL steps",
    ),
    study_stats.Hypothesis(
        "T2",
        "dph_f",
        "grpo",
        {"tool_calls": "+", "distinct_tool_sequences": "+"},
        "DPH-RL (arXiv 2509.07430): a mass-covering divergence to the initial policy keeps its modes; here its tool use",
    ),
    study_stats.Hypothesis(
        "T3",
        "dph_f",
        "grpo",
        {"pass@1": "-=", "pass@8": "+"},
        "study 4 (single turn, this machine): DPH-F − GRPO −0.048 ± 0.018 pass@1, +0.104 ± 0.036 pass@16",
    ),
    study_stats.Hypothesis(
        "T4",
        "max_rl",
        "grpo",
        {"pass@1": "+=", "pass@8": "+"},
        "the MaxRL paper (arXiv 2602.02710): it Pareto-dominates GRPO",
    ),
    study_stats.Hypothesis(
        "T5",
        "passk",
        "grpo",
        {"pass@8": "+", "distinct_tool_sequences": "+"},
        "Pass@k Training (arXiv 2508.10751): the Pass@k reward keeps exploring, raising pass@k",
    ),
)
NOT_JUDGED = (("max_rl", "dph_f"), ("max_rl", "passk"), ("dph_f", "base"), ("passk", "base"), ("max_rl", "base"))
BEHAVIOUR = ("turns", "single_turn", "tool_calls", "tool_errors", "distinct_tool_sequences")
COLUMNS = [*(f"pass@{k}" for k in LADDER), *BEHAVIOUR]
TITLES = {
    "turns": "turns",
    "single_turn": "single-turn share",
    "tool_calls": "tool calls",
    "tool_errors": "tool errors",
    "distinct_tool_sequences": "distinct tool sequences",
    **{f"pass@{k}": f"pass@{k}" for k in LADDER},
}
CURVES = ("reward", "single_turn", "tool_calls", "distinct_tool_sequences")  # train/<name>, logged every 4 steps


def jobs(setting: ToolSetting = TOOLS) -> list[study_runner.Job]:
    """Every method on every base × seed, in study 3's block order, the methods in :data:`METHODS` order inside a block."""
    blocks = [(b, s) for b, s in study3.STUDY3_BLOCKS if b in setting.bases and s in setting.seeds]
    return [study_runner.Job(m, m, b, s, steps=setting.steps, domain="agents") for b, s in blocks for m in METHODS]


class ToolStudy(study_runner.Study):
    """:class:`study_runner.Study` on the multi-turn demo's configs."""

    def __init__(self, work: Path, setting: ToolSetting, slots: int = 2, deadline: datetime | None = None):
        super().__init__(work, slots, deadline=deadline, validate_flags=setting.validate_flags)
        self.setting = setting

    def base_dir(self, seed: int, domain: str = "agents", warm: str = "") -> Path:
        return self.work / "base" / f"s{seed}"

    def base_label(self, base_seed: int, seed: int, domain: str, warm: str = "") -> str:
        return f"base/b{base_seed}/s{seed}"

    def prepare(self) -> None:  # type: ignore[override]
        """The demo's data, then per base seed (two at a time) its warm start and its multi-turn reference cache."""
        self.lit("demo-data", "--out_dir", str(study_runner.DATA), log="prepare")
        self.parallel([lambda b=b: self.prepare_base(*b) for b in self.bases()])

    def bases(self) -> list[tuple[Path, str, int, int, str]]:
        """What :meth:`prepare` makes: ``(folder, configs, seed, warm-start steps, log name)`` per base."""
        return [(self.base_dir(s), AGENTS, s, self.setting.warm_steps, f"s{s}") for s in self.setting.bases]

    def prepare_base(self, out: Path, configs: str, seed: int, steps: int, name: str) -> None:
        """One base in ``out``: the warm start of ``configs``/warmstart.yaml (``steps`` steps, ``seed``), then the
        base's multi-turn reference cache; each skipped when already written (logs ``warmstart_<name>``,
        ``cache_<name>``)."""
        if not (out / "model.safetensors").exists():
            self.lit(
                "warmstart",
                "--config",
                f"{configs}/warmstart.yaml",
                "--out_dir",
                str(out),
                "--seed",
                str(seed),
                "--steps",
                str(steps),
                "--max_seconds",
                "null",
                "--threads",
                "1",
                "--progress_bar",
                "false",
                log=f"warmstart_{name}",
            )
        if not (out / "ref_cache" / "manifest.json").exists():
            self.lit(
                "cache",
                "--config",
                f"{configs}/cache.yaml",
                f"--policy.path={out}",
                f"--data.cache.path={out / 'ref_cache'}",
                "--progress=false",
                log=f"cache_{name}",
            )

    def validate(self, label: str, model: Path, seed: int, domain: str, counts, out_counts) -> None:
        """The final validation: record.yaml's 64 held-out prompts × 8 trajectories, rollout seed 1000 + RL seed."""
        configs = self.configs_of(domain)
        self.lit(
            "validate",
            "--config",
            f"{configs}/base.yaml",
            "--config",
            f"{configs}/record.yaml",
            f"--trainer.callbacks.init_args.path={self.metrics}",
            f"--trainer.callbacks.init_args.label={label}",
            f"--model.policy.path={model}",
            f"--model.sampling.seed={1000 + seed}",
            "--trainer.enable_progress_bar=false",
            *self.validate_flags,
            log=label.replace("/", "_"),
        )

    def configs_of(self, domain: str) -> str:
        """The configs folder of a job's ``domain`` (study 7, benchmarks/study7.py, has two)."""
        return AGENTS

    def fit_args(self, job: study_runner.Job) -> list[str]:
        out, base, configs = self.run_dir(job), self.base_dir(job.base_seed, job.domain), self.configs_of(job.domain)
        cache = [f"--data.cache.path={base / 'ref_cache'}"] if job.method.startswith("dph") else []
        return [
            "fit",
            "--config",
            f"{configs}/base.yaml",
            "--config",
            f"{configs}/{job.method}.yaml",
            f"--model.policy.path={base}",
            *cache,
            f"--seed_everything={job.seed}",
            f"--data.seed={job.seed}",
            f"--model.sampling.seed={job.seed}",
            f"--trainer.max_steps={job.steps}",
            f"--trainer.val_check_interval={self.setting.val_every}",
            f"--export.dirpath={out / 'hf'}",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={out}",
            f"--trainer.logger.init_args.save_dir={out}",
            "--trainer.logger.init_args.name=logs",
            "--trainer.logger.init_args.version=curves",
            *job.overrides,
            "--trainer.callbacks+=diversity_collapse.FitTimer",
            f"--trainer.callbacks.init_args.path={out / 'timer.json'}",
        ]

    def curves(self, label: str) -> list[dict]:
        """A run's CSV log rows (``train/*`` every 4 steps, ``val/*`` every ``val_every``), floats."""
        path = self.work / "runs" / label.replace("/", "_") / "logs" / "curves" / "metrics.csv"
        if not path.exists():
            return []
        with path.open() as f:
            return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def run(study: ToolStudy) -> None:
    """The plan: bases and caches, the bases' validations, then every job (a rerun skips what is recorded)."""
    study4.claim_work(study.work, study.setting, study4.machine_record(study.slots))
    study.prepare()
    study.run(jobs(study.setting))


# ---------------------------------------------------------------------------- reading


def key(metric: str) -> str:
    return f"val/{VAL}/{metric}"


def judge(by: dict, variant: str, against: str, metric: str, want: str | None) -> str:
    """One part of a hypothesis: the paired difference, the sign study 3's rule gives and, with ``want``, MET or MISS."""
    diffs = study_stats.paired(by, variant, key(metric), against)
    name = lambda v: "its base" if v == "base" else study_methods.NAMES[v]  # noqa: E731
    if not diffs:
        return f"- {study_methods.NAMES[variant]} − {name(against)}, {TITLES[metric]}: not run"
    return study_stats.sign_line(
        diffs, f"{study_methods.NAMES[variant]} − {name(against)}, {TITLES[metric]}", want, pairs="pairs"
    )


def verdicts(by: dict) -> list[str]:
    lines = []
    for h in HYPOTHESES:
        parts = [judge(by, h.variant, h.against, m, want) for m, want in h.allowed.items()]
        held = study_stats.verdict(parts, [TITLES[m] for m in h.allowed])
        against = "its base" if h.against == "base" else study_methods.NAMES[h.against]
        lines += [
            f"\n**{h.name}: {held}** — {study_methods.NAMES[h.variant]} − {against}; source: {h.source}.\n",
            *parts,
        ]
    lines += ["\nNot judged (reported with the sign the rule gives):\n"]
    lines += [
        judge(by, v, a, m, None) for v, a in NOT_JUDGED for m in ("pass@1", "pass@8", "tool_calls", "single_turn")
    ]
    return lines


def table(by: dict, variants: list[str]) -> list[str]:
    """Mean ± 95% CI (worst = lowest run) of the final validation's numbers, one row per method."""
    lines = ["| method | runs | " + " | ".join(TITLES[c] for c in COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for v in variants:
        if rs := by.get(v, []):
            cells = [
                study_stats.cell(
                    [r[key(c)] for r in rs if key(c) in r], 2 if c in ("turns", "distinct_tool_sequences") else 3
                )
                for c in COLUMNS
            ]
            lines.append(f"| {study_methods.NAMES.get(v, v)} | {len(rs)} | " + " | ".join(cells) + " |")
    return lines


def paired_rows(by: dict, variants: list[str], against: str) -> list[str]:
    head = "its base" if against == "base" else study_methods.NAMES[against]
    lines = [
        f"| method − {head} | pairs | " + " | ".join(f"Δ {TITLES[c]}" for c in COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    for v in variants:
        ds = [study_stats.paired(by, v, key(c), against) for c in COLUMNS]
        if ds[0]:
            lines.append(
                f"| {study_methods.NAMES[v]} | {len(ds[0])} | "
                + " | ".join(study_stats.cell(d, 3, signed=True) for d in ds)
                + " |"
            )
    return lines


def runs_table(by: dict, blocks: list[tuple[str, str]]) -> list[str]:
    lines = [
        "| base × seed | base | " + " | ".join(study_methods.NAMES[m] for m in METHODS) + " |",
        "|---|---|" + "---|" * len(METHODS),
    ]
    for b, s in blocks:
        cells = []
        for v in ("base", *METHODS):
            r = next((r for r in by.get(v, []) if study_stats.block_of(r) == (b, s)), None)
            cells.append(
                f"{r[key('pass@1')]:.3f} / {r[key('pass@8')]:.3f} / {r[key('tool_calls')]:.2f} / {r[key('single_turn')]:.2f}"
                if r
                else "–"
            )
        lines.append(f"| {b}, {s} | " + " | ".join(cells) + " |")
    return lines


def mean_curve(study: ToolStudy, labels: list[str], column: str) -> tuple[list[float], list[float], list[float]]:
    """Steps, mean and 95% CI half-width over ``labels`` of a logged column (steps where every run logged it)."""
    per_step: dict[float, list[float]] = defaultdict(list)
    for label in labels:
        for row in study.curves(label):
            if column in row:
                per_step[row["step"]].append(row[column])
    steps = sorted(s for s, vs in per_step.items() if len(vs) == len(labels))
    return (
        steps,
        [study_stats.mean(per_step[s]) for s in steps],
        [0 if math.isnan(h := study_stats.ci(per_step[s])) else h for s in steps],
    )


def curves_plot(study: ToolStudy, by: dict, out: Path, title: str) -> None:
    """Top: the training rollouts' reward, single-turn share, tool calls, distinct tool sequences; bottom: the
    in-training held-out validation's. Each method's mean over its runs ± 95% CI; the bases' final values dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    colours = {m: plt.cm.tab10(i) for i, m in enumerate(METHODS)}
    for m in METHODS:
        labels = [r["label"] for r in by.get(m, [])]
        if not labels:
            continue
        for row, prefix in ((0, "train/"), (1, f"val/{VAL}/")):
            for ax, name in zip(
                axes[row], CURVES if row == 0 else ("pass@1", "single_turn", "tool_calls", "distinct_tool_sequences")
            ):
                steps, mu, h = mean_curve(study, labels, prefix + name)
                if steps:
                    ax.plot(steps, mu, color=colours[m], label=study_methods.NAMES[m])
                    ax.fill_between(
                        steps,
                        [a - b for a, b in zip(mu, h)],
                        [a + b for a, b in zip(mu, h)],
                        color=colours[m],
                        alpha=0.15,
                    )
                ax.set_title(
                    f"{'training rollouts' if row == 0 else 'held-out (in training)'}: {TITLES.get(name, name)}",
                    fontsize=9,
                )
    for ax, name in zip(axes[1], ("pass@1", "single_turn", "tool_calls", "distinct_tool_sequences")):
        if base := [r[key(name)] for r in by.get("base", []) if key(name) in r]:
            ax.axhline(study_stats.mean(base), color="black", ls="--", lw=0.8, label="base (final validation)")
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    axes[1][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def pareto_plot(by: dict, out: Path, title: str) -> None:
    """Held-out pass@1 against pass@8 (left) and tool calls against pass@8 (right): each method's mean ± 95% CI, its runs as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    colours = {"base": "black", **{m: plt.cm.tab10(i) for i, m in enumerate(METHODS)}}
    for ax, (x, y) in zip(axes, (("pass@1", "pass@8"), ("tool_calls", "pass@8"))):
        for v in ("base", *METHODS):
            rs = [r for r in by.get(v, []) if key(x) in r and key(y) in r]
            if not rs:
                continue
            xs, ys = [r[key(x)] for r in rs], [r[key(y)] for r in rs]
            ax.scatter(xs, ys, s=12, alpha=0.35, color=colours[v])
            err = [0 if math.isnan(study_stats.ci(vs)) else study_stats.ci(vs) for vs in (xs, ys)]
            ax.errorbar(
                study_stats.mean(xs),
                study_stats.mean(ys),
                xerr=err[0],
                yerr=err[1],
                capsize=3,
                color=colours[v],
                label=study_methods.NAMES.get(v, v),
                marker="*" if v == "base" else "o",
                markersize=11 if v == "base" else 7,
            )
        ax.set(xlabel=f"held-out {TITLES[x]}", ylabel=f"held-out {TITLES[y]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def write_report(study: ToolStudy, out: Path, curves: Path, pareto: Path) -> None:
    """The report study_tools_plan.md declares, from the work folder alone; complete base × seed blocks only."""
    setting, smoke = study.setting, study.setting != TOOLS
    by = study_stats.group(study.records())
    blocks = study3.complete_blocks(by, METHODS)
    planned = jobs(setting)
    missing = [j.label for j in planned if j.label not in study.done_labels()]
    cut = sorted(r["label"] for v in (*METHODS, "base") for r in by.get(v, []) if study_stats.block_of(r) not in blocks)
    by = study_stats.in_blocks(by, blocks, (*METHODS, "base"))
    shown = ", ".join(f"({b}, {s})" for b, s in blocks) or "none"
    sections = [
        "# Study 5: does tool use collapse under RL, and which method keeps it\n",
        *(
            [
                "**SMOKE CHECK (`--smoke`): a 5-step base, 2 RL steps, 16 validation prompts. It shows the pipeline runs; "
                "its numbers are not results.**\n"
            ]
            if smoke
            else []
        ),
        "Plan, hypotheses and rule committed before these runs: [`study_tools_plan.md`](study_tools_plan.md). Command: "
        f"`python benchmarks/tool_use.py{' --smoke' if smoke else ''} --slots 2`; every record in `{study_runner._shown(study.metrics)}`, "
        f"each run's `lit-rlvr` commands in `{study_runner._shown(study.work / 'logs')}`"
        + study_runner.seconds_note(study.work)
        + f". The countdown checker environment (`configs/demo/agents/`): bases warm-started {setting.warm_steps} steps with seeds "
        f"{', '.join(map(str, setting.bases))}; RL seeds {', '.join(map(str, setting.seeds))}; every run {setting.steps} steps of "
        "8 prompts × 8 trajectories (up to 3 turns) at lr 1e-4; the final validation 64 held-out prompts × 8 trajectories, "
        "rollout seed 1000 + RL seed, the base validated with the same seed. Mean ± 95% t-interval over runs, the worst "
        "(lowest) run in brackets.\n",
        "## Machine and bases\n",
        *study4.study4_machine_lines(study, study4.Study4Setting("", setting.bases, setting.seeds, setting.steps)),
        f"\nComplete base × seed blocks (all {len(METHODS)} methods recorded): {shown} ({len(blocks)} of "
        f"{len(planned) // len(METHODS)}); runs of incomplete blocks, left out of every table: "
        f"{', '.join(f'`{c}`' for c in cut) or 'none'}; planned runs not recorded: {', '.join(f'`{m}`' for m in missing) or 'none'}.\n",
    ]
    if blocks:
        title = f"study 5: countdown checker, held-out, {setting.steps} steps, blocks {shown}"
        curves_plot(study, by, curves, title)
        pareto_plot(by, pareto, title)
        power = (
            f"With {len(blocks)} pairs the interval's t is {study_stats.T95[len(blocks) - 1]}: a `=` can be a lack of power, not evidence "
            "of no difference."
            if 2 <= len(blocks) <= 10
            else "With fewer than 2 pairs there is no interval: every sign reads `=`."
        )
        sections += [
            "## At the end: answers and tool use\n",
            *table(by, ["base", *METHODS]),
            "\n### Paired differences (same base × seed)\n",
            *paired_rows(by, list(METHODS), "base"),
            "",
            *paired_rows(by, list(METHODS[1:]), "grpo"),
            f"\n## Over training\n\n![curves]({curves.name})\n",
            f"## pass@1 against pass@8, and tool calls against pass@8\n\n![pareto]({pareto.name})\n",
            "## The hypotheses (pre-registered: study_tools_plan.md, `HYPOTHESES`) and what was seen\n",
            "`+`/`−`: the 95% CI of the paired difference lies above/below 0; `=`: it contains 0. A part is MET when the "
            "sign seen is one the hypothesis allows, else a MISS; a hypothesis HELD when every part is MET. " + power,
            *verdicts(by),
            "\n## Every run (held-out pass@1 / pass@8 / tool calls / single-turn share)\n",
            *runs_table(by, blocks),
            "\n### Training seconds per step (two jobs at a time on 2 cores; not a criterion)\n",
            *study4.study4_seconds_table(study, METHODS),
        ]
    sections += study_runner.commands_section(study, "method", lambda v: v in METHODS)
    study_runner.publish(sections, out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return study_runner.study_parser(
        __doc__, "study_tools", "base 0 from a 5-step warm start, RL seed 0, 2 steps"
    ).parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setting = SMOKE if args.smoke else TOOLS
    study = ToolStudy(
        args.work or ROOT / "artifacts" / ("study_tools_smoke" if args.smoke else "study_tools"),
        setting,
        args.slots,
        args.deadline,
    )
    if args.report_only:
        study4.claim_work(study.work, setting, None)
    else:
        t0 = time.perf_counter()
        run(study)
        study_runner.record_seconds(study.work, "tool_use --smoke" if args.smoke else "tool_use", t0)
    where = study.work if args.smoke else RESULTS
    write_report(study, where / "study_tools.md", where / "study_tools_curves.png", where / "study_tools_pareto.png")


if __name__ == "__main__":
    main()
