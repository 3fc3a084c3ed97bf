"""Study 4, MaxRL beside GRPO, DPH-F and Pass@k (``--preset study4`` of benchmarks/diversity_collapse.py;
benchmarks/results/study4_plan.md, written before its runs): its setting and smoke check, the hypotheses
(``STUDY4_HYPOTHESES``), the machine record a work folder is bound to, and the report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from study3 import (
    COVERAGE,
    STUDY3_BASE_LABELS,
    STUDY3_BASES,
    STUDY3_BLOCKS,
    STUDY3_SEEDS,
    STUDY3_STEPS,
    STUDY3_WARM,
    complete_blocks,
    equal_compute_table,
    paired_table,
)
from study_methods import NAMES, direction_check
from study_runner import (
    HELD_OUT,
    RESULTS,
    ROOT,
    Job,
    Study,
    _shown,
    commands_section,
    load_notes,
    publish,
    seconds_note,
)
from study_stats import (
    T95,
    Hypothesis,
    block_of,
    cell,
    ci,
    deltas,
    fmt,
    group,
    in_blocks,
    mean,
    paired,
    pareto_point,
    step_seconds,
    verdict,
)


@dataclass(frozen=True)
class Study4Setting:
    """What a study-4 work folder runs: the plan's (``STUDY4``, benchmarks/results/study4_plan.md) or the smoke
    check's (``STUDY4_SMOKE``: proves the pipeline runs end to end; its numbers are never results)."""

    warm: str  # a WARMSTARTS key: the bases' warm-start recipe
    bases: tuple[int, ...]
    seeds: tuple[int, ...]
    steps: int
    validate_flags: tuple[str, ...] = ()  # added to every validation
    base0_sha256: str = ""  # the start of base 0's expected weights hash ("" = not checked)


STUDY4 = Study4Setting(STUDY3_WARM, STUDY3_BASES, STUDY3_SEEDS, STUDY3_STEPS, base0_sha256="8c3e23c9")
STUDY4_SMOKE = Study4Setting("smoke", (0,), (0,), 2, ("--trainer.limit_val_batches=1", "--data.val_batch_size=8"))
STUDY4_METHODS = ("grpo", "dph_f", "passk", "max_rl")  # the order inside a block
STUDY4_DPH = COVERAGE["cov_thr4_exp_all"]  # study 3's chosen coverage, pinned (configs/demo/dph_f.yaml ships it too)


# study4_plan.md's table, written before any run
STUDY4_HYPOTHESES = (
    Hypothesis(
        "H1",
        "max_rl",
        "grpo",
        {1: "+=", 16: "+"},
        "the MaxRL paper (arXiv 2602.02710): it Pareto-dominates GRPO, similar or better pass@1 and higher pass@k",
    ),
    Hypothesis("H2", "max_rl", "grpo", {1: "=", 16: "="}, "the community audit issue 36 cites: MaxRL ≈ GRPO"),
    Hypothesis(
        "H3a",
        "dph_f",
        "grpo",
        {1: "-", 16: "+"},
        "study 3 replicated on this machine (study3.md, DPH-F at threshold 4: −0.052 ± 0.016, +0.081 ± 0.039)",
    ),
    Hypothesis(
        "H3b",
        "passk",
        "grpo",
        {1: "-", 16: "="},
        "study 3 replicated on this machine (study3.md: −0.022 ± 0.011, +0.027 ± 0.050)",
    ),
)
STUDY4_UNJUDGED = (("max_rl", "dph_f"), ("max_rl", "passk"))  # no source predicts a direction: reported, not judged


def study4_jobs(setting: Study4Setting = STUDY4) -> list[Job]:
    """Every arm on every base × seed, in study 3's block order (base, seed), the arms in ``STUDY4_METHODS`` order inside a block."""
    blocks = [(b, s) for b, s in STUDY3_BLOCKS if b in setting.bases and s in setting.seeds]
    return [
        Job(m, m, b, s, list(STUDY4_DPH) if m == "dph_f" else [], steps=setting.steps, warm=setting.warm)
        for b, s in blocks
        for m in STUDY4_METHODS
    ]


def machine_record(slots: int) -> dict:
    """This machine's kind (CPU model and flags, torch), the code's commit and the run's threads, for ``machine.jsonl``."""
    import platform

    import torch

    info = Path("/proc/cpuinfo")  # Linux; elsewhere only platform.processor() is known
    first = info.read_text().split("\n\n")[0] if info.exists() else ""  # the first processor's block
    cpu = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines())}
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "HEAD"),
        "changed": bool(git("status", "--porcelain", "--untracked-files=no")),
        "cpu": cpu.get("model name", platform.processor()),
        "flags": sorted(cpu.get("flags", "").split()),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "slots": slots,
        "threads_per_job": 1,
        "argv": " ".join(sys.argv[1:]),
    }


MACHINE_KIND = ("cpu", "flags", "torch")  # what must not change within a work folder: each changes every sample


def claim_work(work: Path, setting: Study4Setting, record: dict | None) -> None:
    """Refuse a work folder begun with another setting or on another machine kind; then note this invocation.

    ``record``: this invocation's :func:`machine_record` (None: only check the setting, for ``--report-only``).
    """
    path, wanted = work / "setting.json", json.loads(json.dumps(dataclasses.asdict(setting)))
    if path.exists() and json.loads(path.read_text()) != wanted:
        raise SystemExit(
            f"{work} holds a study run with the setting {path.read_text().strip()}, not {json.dumps(wanted)} "
            "(the smoke check and the study must not share a work folder): use another --work"
        )
    if record is None:
        return
    machines = work / "machine.jsonl"
    first = json.loads(machines.read_text().splitlines()[0]) if machines.exists() else record
    changed = [k for k in MACHINE_KIND if first[k] != record[k]]
    if changed:
        raise SystemExit(
            f"{work} was begun on another machine kind ({', '.join(changed)} differ: "
            f"{', '.join(f'{first[k]!s:.80} here {record[k]!s:.80}' for k in changed)}); its runs cannot be paired with "
            "this machine's. Resume it on the machine kind it was begun on, or start a new --work."
        )
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(wanted) + "\n")
    with machines.open("a") as f:
        f.write(json.dumps(record) + "\n")


def run_study4(study: Study, setting: Study4Setting = STUDY4) -> None:
    """study4_plan.md: the data, the bases and their caches, the bases' validations, then every job; a rerun
    skips what is recorded (bases, caches, runs)."""
    claim_work(study.work, setting, machine_record(study.slots))
    study.prepare(base_seeds=list(setting.bases), sql_seeds=[], warms=(setting.warm,))
    study.run(study4_jobs(setting))


def weights_sha256(base: Path) -> str | None:
    """sha256 of a base's ``model.safetensors`` (None when it is not there)."""
    path = base / "model.safetensors"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def study4_machine_lines(study: Study, setting: Study4Setting) -> list[str]:
    """Every invocation's machine line (machine.jsonl) and each base's weights hash."""
    path = study.work / "machine.jsonl"
    lines = [
        "| invoked (UTC) | commit | CPU | torch (CPU capability) | sha256 of the CPU flags | jobs at a time × threads | arguments |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in (json.loads(line) for line in (path.read_text().splitlines() if path.exists() else []) if line.strip()):
        flags = hashlib.sha256(" ".join(m["flags"]).encode()).hexdigest()[:12]
        lines.append(
            f"| {m['time']} | `{m['commit'][:10]}`{' + uncommitted changes' if m['changed'] else ''} | {m['cpu']} | "
            f"{m['torch']} ({m['capability']}) | `{flags}` ({len(m['flags'])} flags) | {m['slots']} × {m['threads_per_job']} | "
            f"`{m['argv'] or '(none)'}` |"
        )
    lines.append("")
    for b in setting.bases:
        sha = weights_sha256(study.base_dir(b, warm=setting.warm))
        note = ""
        if sha and b == 0 and setting.base0_sha256:
            note = (
                f" — as expected (`{setting.base0_sha256}…`, this machine's warm start before the plan)"
                if sha.startswith(setting.base0_sha256)
                else f" — **not** the `{setting.base0_sha256}…` the plan expected from this machine's warm start"
            )
        lines.append(f"- base {b}: weights sha256 `{sha[:16] + '…' if sha else 'not made'}`{note}")
    return lines


def study4_seconds_table(study: Study, methods: tuple[str, ...]) -> list[str]:
    """Training seconds per step of each arm over all its runs, and its fastest run against GRPO's fastest."""
    times = study.times()
    grpo = step_seconds(times, "grpo", STUDY3_BASE_LABELS)
    lines = [
        "| method | runs | s/step (mean ± 95% CI) | fastest run | fastest / GRPO's fastest |",
        "|---|---|---|---|---|",
    ]
    for m in methods:
        if every := step_seconds(times, m, STUDY3_BASE_LABELS):
            ratio = f"{min(every) / min(grpo):.2f}" if grpo else "–"
            lines.append(f"| {NAMES[m]} | {len(every)} | {fmt(every, 3)} | {min(every):.3f} | {ratio} |")
    return lines


def study4_runs_table(
    by: dict, base: str, blocks: list[tuple[str, str]], methods: tuple[str, ...] = STUDY4_METHODS
) -> list[str]:
    """One row per base × seed: held-out pass@1 / pass@16 of the base and of every arm (``methods``: study 6's too)."""
    lines = [
        "| base × seed | base | " + " | ".join(NAMES[m] for m in methods) + " |",
        "|---|---|" + "---|" * len(methods),
    ]
    for b, s in blocks:
        cells = []
        for v in (base, *methods):
            r = next((r for r in by.get(v, []) if block_of(r) == (b, s)), None)
            cells.append(f"{r[f'val/{HELD_OUT}/pass@1']:.3f} / {r[f'val/{HELD_OUT}/pass@16']:.3f}" if r else "–")
        lines.append(f"| {b}, {s} | " + " | ".join(cells) + " |")
    return lines


def study4_verdicts(by: dict) -> list[str]:
    """Each hypothesis HELD or MISSED (naming the parts that missed), its parts MET or MISS with their numbers."""
    lines = []
    for h in STUDY4_HYPOTHESES:
        parts = [direction_check(by, h.variant, k, want, NAMES[h.variant], h.against) for k, want in h.allowed.items()]
        held = verdict(parts, [f"pass@{k}" for k in h.allowed])
        lines += [f"\n**{h.name}: {held}** — {NAMES[h.variant]} − {NAMES[h.against]}; source: {h.source}.\n", *parts]
    compared = dict.fromkeys([(h.variant, h.against) for h in STUDY4_HYPOTHESES] + list(STUDY4_UNJUDGED))
    lines += ["\nNot judged (no direction from a source; pass@32 is reported beside pass@16 for every comparison):\n"]
    lines += [direction_check(by, v, 32, None, NAMES[v], a) for v, a in compared]
    lines += [direction_check(by, v, k, None, NAMES[v], a) for v, a in STUDY4_UNJUDGED for k in (1, 16)]
    return lines


def study4_pareto_plot(
    by: dict, out: Path, base: str, title: str, methods: tuple[str, ...] = STUDY4_METHODS, floor: float | None = None
) -> None:
    """Left: held-out pass@1 vs pass@16 per arm (mean ± 95% CI, its runs as dots); right: the paired differences
    against GRPO with their CIs, the quadrant where an arm Pareto-dominates GRPO shaded (``methods``: the arms,
    GRPO among them; ``floor``: study 6's claim, Δpass@1 above ``floor`` and Δpass@16 above 0, shaded too)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p1, p16 = f"val/{HELD_OUT}/pass@1", f"val/{HELD_OUT}/pass@16"
    colours = {"base": "black", **{m: plt.cm.tab10(i) for i, m in enumerate(methods)}}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    for v, name in ((base, "base"), *((m, NAMES[m]) for m in methods)):
        rs, colour = by.get(v, []), colours["base" if v == base else v]
        if (point := pareto_point(rs, HELD_OUT)) is None:
            continue
        left.scatter([r[p1] for r in rs], [r[p16] for r in rs], s=12, alpha=0.35, color=colour)
        left.errorbar(
            point[0],
            point[1],
            xerr=point[2],
            yerr=point[3],
            capsize=3,
            color=colour,
            label=name,
            marker="*" if v == base else "o",
            markersize=11 if v == base else 7,
        )
        if v in (base, "grpo"):
            continue
        d1, d16 = paired(by, v, p1), paired(by, v, p16)
        if d1:
            ci1, ci16 = (0 if math.isnan(ci(d)) else ci(d) for d in (d1, d16))
            right.errorbar(
                mean(d1), mean(d16), xerr=ci1, yerr=ci16, capsize=3, color=colour, marker="o", label=f"{name} − GRPO"
            )
            right.scatter(d1, d16, s=12, alpha=0.35, color=colour)
    left.set(
        xlabel="held-out pass@1",
        ylabel="held-out pass@16",
        title="each arm: mean ± 95% CI over its runs (dots: the runs)",
    )
    right.axhline(0, color="grey", lw=0.8)
    right.axvline(0, color="grey", lw=0.8)
    x0, x1 = right.get_xlim()
    y0, y1 = right.get_ylim()
    right.fill_between([0, max(x1, 0.01)], 0, max(y1, 0.01), color="green", alpha=0.07, label="Pareto-dominates GRPO")
    if floor is not None:
        right.fill_between(
            [floor, 0],
            0,
            max(y1, 0.01),
            color="orange",
            alpha=0.07,
            label=f"study 6's claim: both CIs inside (Δpass@1 > {floor}, Δpass@16 > 0)",
        )
    right.set(
        xlim=(min(x0, -0.01), max(x1, 0.01)),
        ylim=(min(y0, -0.01), max(y1, 0.01)),
        xlabel="Δ held-out pass@1 vs GRPO",
        ylabel="Δ held-out pass@16 vs GRPO",
        title="paired on base × seed: mean ± 95% CI (dots: the pairs)",
    )
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def write_study4_report(
    study: Study,
    setting: Study4Setting = STUDY4,
    out: Path = RESULTS / "study4.md",
    figure: Path = RESULTS / "study4_pareto.png",
) -> None:
    """benchmarks/results/study4.md (+ its figure), the content study4_plan.md declares, from the work folder alone.

    Reads only the base × seed blocks in which every arm finished; the others' runs are listed by label.
    """
    base = f"base_{setting.warm}"
    by = group(study.records())
    blocks = complete_blocks(by, STUDY4_METHODS)
    planned = study4_jobs(setting)
    missing = [j.label for j in planned if j.label not in study.done_labels()]
    cut = sorted(r["label"] for v in (*STUDY4_METHODS, base) for r in by.get(v, []) if block_of(r) not in blocks)
    by = in_blocks(by, blocks, (*STUDY4_METHODS, base))
    shown = ", ".join(f"({b}, {s})" for b, s in blocks) or "none"
    smoke = setting != STUDY4
    sections = [
        "# Study 4: MaxRL beside GRPO, DPH-F and Pass@k in the demo's regime\n",
        *(
            [
                "**SMOKE CHECK (`--smoke`): a 5-step base, 2 RL steps, a few validation prompts. It shows the pipeline runs; "
                "its numbers are not results.**\n"
            ]
            if smoke
            else []
        ),
        "Plan, hypotheses and rule committed before these runs: [`study4_plan.md`](study4_plan.md). Command: "
        f"`python benchmarks/diversity_collapse.py --preset study4{' --smoke' if smoke else ''} --slots 2`; every record in `"
        + _shown(study.metrics)
        + "`, each run's `lit-rlvr` commands in `"
        + _shown(study.work / "logs")
        + "`"
        + seconds_note(study.work)
        + f". Bases: warm start `{setting.warm}` with seeds {', '.join(map(str, setting.bases))}, made on this machine; RL seeds "
        f"{', '.join(map(str, setting.seeds))}; every run {setting.steps} steps of 16 prompts × 16 samples at lr 1e-4, validated at 32 "
        "samples per prompt with rollout seed 1000 + its RL seed. Mean ± 95% t-interval over runs, the worst (lowest) run "
        "in brackets. Study 3's numbers are not compared with these: its bases were made on another machine kind "
        "(study4_plan.md).\n",
        "## Machine and bases\n",
        *study4_machine_lines(study, setting),
        f"\nComplete base × seed blocks (all {len(STUDY4_METHODS)} arms recorded): {shown} ({len(blocks)} of "
        f"{len(planned) // len(STUDY4_METHODS)}); runs of incomplete blocks, left out of every table: "
        f"{', '.join(f'`{c}`' for c in cut) or 'none'}; planned runs not recorded: {', '.join(f'`{m}`' for m in missing) or 'none'}.\n",
    ]
    if blocks:
        study4_pareto_plot(by, figure, base, f"study 4: held-out countdown, {setting.steps} steps, blocks {shown}")
        power = (
            f"With {len(blocks)} pairs the interval's t is {T95[len(blocks) - 1]}: a `=` can be a lack of power, not evidence "
            "of no difference."
            if 2 <= len(blocks) <= 10
            else "With fewer than 2 pairs there is no interval: every sign reads `=`."
        )
        g = {
            v: [
                deltas(by.get(v, []), {block_of(r): r for r in by.get(base, [])}, f"val/{HELD_OUT}/pass@{k}")
                for k in (1, 16)
            ]
            for v in ("grpo", "max_rl")
        }
        sections += [
            f"## The pass@1–pass@16 picture\n\n![study 4]({figure.name})\n",
            "## Equal training steps: every arm at its shipped setting\n",
            *equal_compute_table(by, [base, *STUDY4_METHODS]),
            "\n### Paired differences (same base × seed)\n",
            *paired_table(by, list(STUDY4_METHODS[1:])),
            "",
            *paired_table(by, ["max_rl"], "dph_f"),
            "",
            *paired_table(by, ["max_rl"], "passk"),
            "\n## The hypotheses (pre-registered: study4_plan.md, `STUDY4_HYPOTHESES`) and what was seen\n",
            "`+`/`−`: the 95% CI of the paired difference lies above/below 0; `=`: it contains 0. A part is MET when the "
            "sign seen is one the hypothesis allows, else a MISS; a hypothesis HELD when every part is MET. " + power,
            *study4_verdicts(by),
            "\n## Every run (held-out pass@1 / pass@16)\n",
            *study4_runs_table(by, base, blocks),
            "\n### Training seconds per step (the training loop's time over its optimizer steps)\n",
            "Measured on a 2-core machine that other sessions may share; two jobs ran at a time. Not a criterion.\n",
            *study4_seconds_table(study, STUDY4_METHODS),
            *load_notes(study),
            "\nSupplementary, not a criterion: held-out Δ over each run's own base, GRPO: pass@1 "
            f"{cell(g['grpo'][0], signed=True)}, pass@16 {cell(g['grpo'][1], signed=True)}; MaxRL: pass@1 "
            f"{cell(g['max_rl'][0], signed=True)}, pass@16 {cell(g['max_rl'][1], signed=True)}.",
        ]
    sections += commands_section(study, "arm", lambda v: v in STUDY4_METHODS)
    publish(sections, out)
