"""Study 3, every method in study 2's regime (``--preset study3`` of benchmarks/diversity_collapse.py;
benchmarks/results/study3_plan.md and its amendments, written before their runs): parts A–D's jobs, the runs
bounded by a deadline, and the report.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from study1 import choose_dph, method_flags, wallclock_jobs
from study_methods import KNOB_NAMES, KNOBS, METHODS, NAMES, expectation_check, sweep_variants
from study_runner import HELD_OUT, OOD, RESULTS, Job, Study, _shown, commands_section, load_notes, publish, seconds_note
from study_stats import T95, block_of, cell, deltas, fmt, group, in_blocks, paired, pareto_curves, step_seconds

# benchmarks/results/study3_plan.md, written before its runs: 200-step warm starts (the demo's base), 160 RL steps
STUDY3_WARM, STUDY3_STEPS, STUDY3_BASES, STUDY3_SEEDS = "ws200", 160, (0, 1), (0, 1, 2)
STUDY3_BASE = f"base_{STUDY3_WARM}"  # the variant of the bases' validations
STUDY3_BASE_LABELS = tuple(f"b{b}" for b in STUDY3_BASES)  # as the labels name them
STUDY3_WALLCLOCK_MARGIN = 0.10  # part D reruns a method slower per step than GRPO by more than this

# Part A: DPH's coverage re-chosen for the 200-step base by choose_dph's rule (η 1 in every candidate)
COVERAGE = {
    f"cov_thr{t}_{split}_all": [
        f"--data.cache.perfect_threshold={t}",
        f"--data.cache.train_split={split}",
        "--data.cache.anchor_samples=all",
        "--model.anchor.coef=1.0",
    ]
    for t, split in ((6, "exp"), (4, "exp"), (2, "exp"), (4, "all"))
}

# Part B's methods (configs/demo/<method>.yaml), the baselines first
STUDY3_METHODS = ("grpo", "dapo", "rkl", "dph_f", "dph_js", "passk", "passk_combined", "passk_then_pass1", *METHODS)


STUDY3_PART_A = {("b0", "s0"), ("b0", "s1")}  # part A's base × seed blocks, the only runs its rule reads


def coverage_jobs(seeds=(0, 1)) -> list[Job]:
    """Part A: DPH-F with each coverage candidate on base 0 of the 200-step warm start."""
    return [
        Job(name, "dph_f", 0, s, flags, steps=STUDY3_STEPS, warm=STUDY3_WARM)
        for name, flags in COVERAGE.items()
        for s in seeds
    ]


def study3_robust_jobs(dph_flags: list[str], bases=STUDY3_BASES, seeds=STUDY3_SEEDS) -> list[Job]:
    """Part B: every method at its config's setting (DPH with part A's coverage), in the order base, seed, method."""
    return [
        Job(m, m, b, s, method_flags(m, dph_flags), steps=STUDY3_STEPS, warm=STUDY3_WARM)
        for b in bases
        for s in seeds
        for m in STUDY3_METHODS
    ]


def study3_sweep_jobs(dph_flags: list[str]) -> list[Job]:
    """Part C: each method's knob at its two other values on base 0 × seed 0 (DPH keeps part A's coverage)."""
    jobs = []
    for m in STUDY3_METHODS:
        flags, values = KNOBS[m]
        coverage = [f for f in method_flags(m, dph_flags) if not f.startswith("--model.anchor.coef")]
        jobs += [
            Job(f"{m}_{v}", m, 0, 0, [*coverage, *flags(v)], steps=STUDY3_STEPS, warm=STUDY3_WARM) for v in values[1:]
        ]
    return jobs


def slower_than_grpo(
    study: Study, methods=STUDY3_METHODS, margin: float = STUDY3_WALLCLOCK_MARGIN, stat=statistics.median, bases=("b0",)
) -> list[str]:
    """Part D's methods: ``stat`` of the training seconds per step on ``bases`` above GRPO's by more than ``margin``.

    The plan reads the median of base 0's runs; amendment 3 the fastest (``stat=min``) of every part-B
    run (``bases=("b0", "b1")``), since interference from other work on the machine only adds time.
    """
    times = study.times()
    grpo = step_seconds(times, "grpo", bases)
    if not grpo:
        raise RuntimeError("part D needs part B's GRPO runs first")
    limit = (1 + margin) * stat(grpo)
    return [m for m in methods if m != "grpo" and (x := step_seconds(times, m, bases)) and stat(x) > limit]


# study3_plan.md, amendment 1 (a run bounded by a deadline): part B in base × seed blocks, in this order
STUDY3_BLOCKS = ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2))


def run_until_deadline(study: Study, groups: list[list[Job]], amendment: str = "") -> None:
    """Run ``groups`` in order; once the deadline has passed, none starts and their unrecorded runs are
    named in ``deadline.txt`` (after the deadline and the ``amendment`` line, when given)."""
    for jobs in groups:
        if study.past_deadline():
            done = study.done_labels()
            study.skipped += [j.label for j in jobs if j.label not in done]
            continue
        study.run(jobs)
    (study.work / "deadline.txt").write_text(
        f"deadline {study.deadline.isoformat() if study.deadline else 'none'}\n"
        + (f"{amendment}\n" if amendment else "")
        + "".join(f"not started: {label}\n" for label in study.skipped)
    )


def run_study3_amended(study: Study) -> None:
    """Amendment 1 of study3_plan.md: no part A (the shipped DPH coverage), part B block by block until the deadline."""
    study.prepare(base_seeds=list(STUDY3_BASES), sql_seeds=[], warms=(STUDY3_WARM,))
    run_until_deadline(study, [study3_robust_jobs([], bases=(b,), seeds=(s,)) for b, s in STUDY3_BLOCKS])


# study3_plan.md, amendment 2: after part B's remaining blocks, part C method by method in this order
# (the library's two methods first, then the plan's table order), DPH at its shipped coverage (no part A)
STUDY3_SWEEP_ORDER = (
    "dph_f",
    "dph_js",
    "passk",
    "passk_combined",
    "passk_then_pass1",
    "grpo",
    "dapo",
    "rkl",
    "clip_cov",
    "kl_cov",
    "forking_tokens",
    "entropy_bonus",
    "entropy_adaptive",
    "w_reinforce",
    "unlikeliness",
)


def run_study3_amendment2(study: Study) -> None:
    """Amendment 2 of study3_plan.md: part B's blocks as amendment 1, then part C method by method, until the deadline."""
    study.prepare(base_seeds=list(STUDY3_BASES), sql_seeds=[], warms=(STUDY3_WARM,))
    sweeps = study3_sweep_jobs([])
    groups = [study3_robust_jobs([], bases=(b,), seeds=(s,)) for b, s in STUDY3_BLOCKS]
    groups += [[j for j in sweeps if j.method == m] for m in STUDY3_SWEEP_ORDER]
    run_until_deadline(study, groups, "amendment 2")


STUDY3_SHIPPED_COVERAGE = "cov_thr6_exp_all"  # configs/demo/dph_f.yaml's coverage, which amendments 1 and 2 ran


def chosen_coverage_jobs(name: str, dph_flags: list[str]) -> tuple[list[Job], list[Job]]:
    """Amendment 3's steps 4 and 5: DPH-F at part A's chosen coverage on every part-B block (its variant is
    the candidate's name, whose base-0 seeds 0 and 1 are part A's runs; none when the shipped coverage
    was chosen), and DPH-JS at that coverage (η its own) as ``dph_js_<candidate>``."""
    dph_f = (
        []
        if name == STUDY3_SHIPPED_COVERAGE
        else [Job(name, "dph_f", b, s, list(dph_flags), steps=STUDY3_STEPS, warm=STUDY3_WARM) for b, s in STUDY3_BLOCKS]
    )
    dph_js = [
        Job(f"dph_js_{name}", "dph_js", b, s, method_flags("dph_js", dph_flags), steps=STUDY3_STEPS, warm=STUDY3_WARM)
        for b, s in STUDY3_BLOCKS
    ]
    return dph_f, dph_js


def run_study3_amendment3(study: Study) -> None:
    """Amendment 3 of study3_plan.md: part A and its rule, unlikeliness's two sweep runs, part D (methods by
    their fastest part-B run), DPH-F then DPH-JS at the chosen coverage — until the deadline."""
    study.prepare(base_seeds=list(STUDY3_BASES), sql_seeds=[], warms=(STUDY3_WARM,))
    run_until_deadline(study, [coverage_jobs()], "amendment 3")
    name, dph_flags, why = choose_dph(study, COVERAGE, STUDY3_BASE, STUDY3_PART_A)
    print(f"part A chose {name}: {why[0]}", flush=True)
    slower = slower_than_grpo(study, stat=min, bases=STUDY3_BASE_LABELS)
    print(f"part D re-runs {', '.join(slower) or 'none'}", flush=True)
    dph_f, dph_js = chosen_coverage_jobs(name, dph_flags)
    groups = [
        [j for j in study3_sweep_jobs([]) if j.method == "unlikeliness"],
        wallclock_jobs(study, dph_flags, seeds=STUDY3_SEEDS, methods=slower, warm=STUDY3_WARM),
        dph_f,
        dph_js,
    ]
    run_until_deadline(study, groups, "amendment 3")


def complete_blocks(by: dict, methods=STUDY3_METHODS) -> list[tuple[str, str]]:
    """The base × seed blocks in which every one of ``methods`` has a record, in STUDY3_BLOCKS order."""
    have = [{block_of(r) for r in by.get(m, [])} for m in methods]
    order = [(f"b{b}", f"s{s}") for b, s in STUDY3_BLOCKS]
    return [blk for blk in order if all(blk in h for h in have)]


def run_study3(study: Study) -> None:
    """Parts A–D of study3_plan.md, in order; the Study skips every run already recorded."""
    study.prepare(base_seeds=list(STUDY3_BASES), sql_seeds=[], warms=(STUDY3_WARM,))
    study.run(coverage_jobs())
    name, dph_flags, why = choose_dph(study, COVERAGE, STUDY3_BASE, STUDY3_PART_A)
    print(f"part A chose {name}: {why[0]}", flush=True)
    shipped = STUDY3_SHIPPED_COVERAGE
    # DPH-JS's shipped coverage anchors the correct samples only, every candidate all of them: its recorded runs never match
    ran = sorted(
        label
        for label in study.done_labels()
        if label.split("/")[0] == "dph_js" or (label.split("/")[0] == "dph_f" and name != shipped)
    )
    if ran:
        raise SystemExit(
            f"part A chose {name}, but {len(ran)} DPH runs of part B are recorded at their shipped coverage ("
            f"amendment 1): the Study would skip them as done. Move their records out of {study.metrics} first."
        )
    study.run(study3_robust_jobs(dph_flags))
    study.run(study3_sweep_jobs(dph_flags))
    study.run(wallclock_jobs(study, dph_flags, seeds=STUDY3_SEEDS, methods=slower_than_grpo(study), warm=STUDY3_WARM))


STUDY3_COLUMNS = [
    (f"val/{HELD_OUT}/pass@1", "held-out pass@1", 3),
    (f"val/{HELD_OUT}/pass@16", "held-out pass@16", 3),
    (f"val/{HELD_OUT}/pass@32", "held-out pass@32", 3),
    (f"val/{HELD_OUT}/distinct_correct_answers", "distinct correct", 2),
    (f"val/{OOD}/pass@1", "OOD addition pass@1", 3),
]


def equal_compute_table(by: dict, variants: list[str]) -> list[str]:
    lines = [
        "| method | runs | " + " | ".join(name for _, name, _ in STUDY3_COLUMNS) + " |",
        "|---|---|" + "---|" * len(STUDY3_COLUMNS),
    ]
    for v in variants:
        rs = by.get(v, [])
        if rs:
            cells = [cell([r[key] for r in rs if key in r], d) for key, _, d in STUDY3_COLUMNS]
            lines.append(
                f"| {NAMES.get(v, 'base (200-step warm start)' if v == STUDY3_BASE else f'`{v}`')} | {len(rs)} | "
                + " | ".join(cells)
                + " |"
            )
    return lines


def paired_table(by: dict, variants: list[str], against: str = "grpo") -> list[str]:
    """Each variant − ``against`` on the same base × seed: mean ± 95% CI (worst pair) of the five numbers."""
    lines = [
        f"| method − {NAMES.get(against, against)} | pairs | "
        + " | ".join(f"Δ {name}" for _, name, _ in STUDY3_COLUMNS)
        + " |",
        "|---|---|" + "---|" * len(STUDY3_COLUMNS),
    ]
    for v in variants:
        ds = [paired(by, v, key, against) for key, _, _ in STUDY3_COLUMNS]
        if ds[0]:
            lines.append(
                f"| {NAMES.get(v, v)} | {len(ds[0])} | "
                + " | ".join(cell(d, digits, signed=True) for d, (_, _, digits) in zip(ds, STUDY3_COLUMNS))
                + " |"
            )
    return lines


def identical_to_grpo(by: dict) -> list[str]:
    """A note for each method whose every paired difference to GRPO is exactly 0: its term never acted in these runs."""
    same = [
        m
        for m in STUDY3_METHODS[1:]
        if (ds := [d for key, _, _ in STUDY3_COLUMNS for d in paired(by, m, key)]) and not any(ds)
    ]
    return [
        f"\n{NAMES[m]}'s runs equal GRPO's on every number above, run for run: what it adds to GRPO never acted in "
        "these runs (for adaptive entropy: the coefficient starts at 0 and moves only while the entropy is below the target)."
        for m in same
    ]


def reproduced(by: dict) -> list[str]:
    """Part A's shipped candidate has part B's DPH-F flags on the same base and seeds: do its runs equal them digit for digit?"""
    pairs = [
        (r, o)
        for r in by.get(STUDY3_SHIPPED_COVERAGE, [])
        for o in by.get("dph_f", [])
        if o["label"].split("/")[1:] == r["label"].split("/")[1:]
    ]
    if not pairs:
        return []
    keys = [key for key, _, _ in STUDY3_COLUMNS]
    same = [r["label"].split("/", 1)[1] for r, o in pairs if all(r.get(k) == o.get(k) for k in keys)]
    return [
        f"\n`{STUDY3_SHIPPED_COVERAGE}` has part B's DPH-F flags: {len(same)} of its {len(pairs)} runs equal part B's DPH-F run "
        f"on the same base × seed on every number above ({', '.join(same) or 'none'})."
    ]


def chosen_rows(by: dict, table: str) -> list[str]:
    """Amendment 3's DPH runs at part A's chosen coverage (the candidate's variant, ``dph_js_<candidate>``), below part B's tables."""
    variants = [v for v in by if v in COVERAGE and len(by[v]) > 2 or v.startswith("dph_js_cov_")]
    if not variants:
        return []
    head = (
        "\nAt part A's chosen coverage (amendment 3; DPH-F under the candidate's name, DPH-JS as `dph_js_<candidate>`), "
        "on the blocks each has:\n"
    )
    if table == "equal":
        return [head, *equal_compute_table(by, variants)]
    expected = [
        expectation_check(by, "dph_js" if v.startswith("dph_js_") else "dph_f", k, v) for v in variants for k in (1, 16)
    ]
    return [
        head,
        *paired_table(by, variants),
        "\nThe pre-registered directions of DPH-F and DPH-JS read on these runs:\n",
        *expected,
    ]


def seconds_table(study: Study, by: dict, rerun: list[str], blocks: list[tuple[str, str]] | None = None) -> list[str]:
    """Training seconds per step of each method (``blocks``: only the runs of these base × seed blocks)."""
    times = {label: t for label, t in study.times().items() if blocks is None or tuple(label.split("/")[1:]) in blocks}
    grpo = step_seconds(times, "grpo")
    fastest = step_seconds(times, "grpo", STUDY3_BASE_LABELS)
    lines = [
        "| method | runs | median s/step, base 0 | s/step, all runs | ratio to GRPO (base-0 medians) | "
        "ratio to GRPO (fastest runs; amendment 3) | equal wall-clock rerun (part D) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in STUDY3_METHODS:
        b0, every = step_seconds(times, m), step_seconds(times, m, bases=STUDY3_BASE_LABELS)
        if b0:
            ratio = f"{statistics.median(b0) / statistics.median(grpo):.2f}" if grpo else "–"
            fast = f"{min(every) / min(fastest):.2f}" if fastest else "–"
            lines.append(
                f"| {NAMES[m]} | {len(every)} | {statistics.median(b0):.3f} | {fmt(every, 3)} | {ratio} | {fast} | "
                f"{'yes' if m in rerun else 'no'} |"
            )
    return lines


def wallclock_view(study: Study, by: dict) -> list[str]:
    """Part D: each rerun method at GRPO's training seconds, beside GRPO's base-0 runs, with the paired differences."""
    times = study.times()
    variants = sorted(v for v in by if "_time" in v and v.split("_time")[0] in STUDY3_METHODS)
    lines = [
        "| run | runs | training seconds | steps | held-out pass@1 | held-out pass@16 | OOD addition pass@1 | "
        "Δ pass@1 vs GRPO | Δ pass@16 vs GRPO |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in ["grpo", *variants]:
        rs = [r for r in by[v] if r["label"].split("/")[1] == "b0"]
        ts = [times[r["label"]] for r in rs if r["label"] in times]
        d1, d16 = (
            ["–", "–"]
            if v == "grpo"
            else [cell(paired(by, v, f"val/{HELD_OUT}/pass@{k}"), signed=True) for k in (1, 16)]
        )
        name = "GRPO (base 0, 160 steps)" if v == "grpo" else f"{NAMES[v.split('_time')[0]]} at {v.split('_time')[1]}"
        lines.append(
            f"| {name} | {len(rs)} | {fmt([t['train_seconds'] for t in ts], 0)} | {fmt([t['steps'] for t in ts], 0)} | "
            f"{cell([r[f'val/{HELD_OUT}/pass@1'] for r in rs])} | {cell([r[f'val/{HELD_OUT}/pass@16'] for r in rs])} | "
            f"{cell([r[f'val/{OOD}/pass@1'] for r in rs])} | {d1} | {d16} |"
        )
    return lines


def sweep_table(by: dict) -> list[str]:
    """Part C beside its middle point: base 0 only (the shipped value: mean ± CI over its seeds; the others: seed 0)."""
    lines = [
        "| method | knob | value | runs (base 0) | held-out pass@1 | held-out pass@16 | OOD addition pass@1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in (m for m in STUDY3_METHODS if KNOBS[m][1]):
        for v in sweep_variants(m):
            rs = [r for r in by.get(v, []) if r["label"].split("/")[1] == "b0"]
            value = f"{KNOBS[m][1][0]} (shipped)" if v == m else v[len(m) + 1 :]
            if rs:
                lines.append(
                    f"| {NAMES[m]} | {KNOB_NAMES[m]} | {value} | "
                    f"{len(rs)} | {fmt([r[f'val/{HELD_OUT}/pass@1'] for r in rs])} | {fmt([r[f'val/{HELD_OUT}/pass@16'] for r in rs])} | "
                    f"{fmt([r[f'val/{OOD}/pass@1'] for r in rs])} |"
                )
    return lines


def inert_knobs(by: dict) -> list[str]:
    """A note for each swept knob whose seed-0 runs on base 0 gave the same numbers at every value: it never acted."""
    keys = [key for key, _, _ in STUDY3_COLUMNS]
    lines = []
    for m in (m for m in STUDY3_METHODS if KNOBS[m][1]):
        runs = [next((r for r in by.get(v, []) if r["label"] == f"{v}/b0/s0"), None) for v in sweep_variants(m)]
        if (
            len(runs) > 2
            and all(runs)
            and all([r.get(k) for k in keys] == [runs[0].get(k) for k in keys] for r in runs)
        ):
            lines.append(
                f"\n{NAMES[m]}'s {KNOB_NAMES[m]} gave the same numbers at {', '.join(KNOBS[m][1])} (base 0, seed 0), "
                "run for run: the knob never acted in these runs."
            )
    return lines


def coverage_sizes(pass_counts: list[int], n: int, candidates: dict[str, list[str]] = COVERAGE) -> list[str]:
    """|D_pef|, anchor samples and RL prompts of each candidate, from the base's cached pass counts (of ``n``)."""
    lines = [
        "| candidate | threshold | train_split | D_pef prompts | anchor samples (all) | RL prompts |",
        "|---|---|---|---|---|---|",
    ]
    for name, flags in candidates.items():
        opts = dict(f[2:].split("=", 1) for f in flags)
        t, split = int(opts["data.cache.perfect_threshold"]), opts["data.cache.train_split"]
        pef = sum(c >= t for c in pass_counts)
        lines.append(
            f"| `{name}` | {t} | {split} | {pef} of {len(pass_counts)} | {pef * n} | {len(pass_counts) - pef if split == 'exp' else len(pass_counts)} |"
        )
    return lines


def study3_pareto_plot(by: dict, out: Path, blocks: str = "2 bases × 3 seeds") -> None:
    """Left: each method's sweep on base 0 (a line); right: part B's 6-run means; both with 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {
        NAMES[m]: {"color": plt.cm.tab20(i % 20), "marker": "osD^vP"[i % 6]} for i, m in enumerate(STUDY3_METHODS)
    }
    styles["base"] = {"color": "black"}
    fig, axes = plt.subplots(1, 2, figsize=(17, 7))
    sweeps = [("base", [STUDY3_BASE]), *[(NAMES[m], sweep_variants(m)) for m in STUDY3_METHODS]]
    pareto_curves(axes[0], by, sweeps, HELD_OUT, stars=("base",), styles=styles)
    swept = any(v in by for m in STUDY3_METHODS for v in sweep_variants(m) if v != m)
    runs = len([r for r in by.get("grpo", []) if r["label"].split("/")[1] == "b0"])
    axes[0].set_title(
        f"base 0: each method over its knob (shipped value: mean ± 95% CI over {runs} seeds; others: seed 0)"
        if swept
        else f"base 0 only: each method's shipped setting, mean ± 95% CI over {runs} seeds (no sweeps: part C not run)",
        fontsize=9,
    )
    robust = [("base", [STUDY3_BASE]), *[(NAMES[m], [m]) for m in STUDY3_METHODS]]
    pareto_curves(axes[1], by, robust, HELD_OUT, bases=STUDY3_BASE_LABELS, stars=("base",), styles=styles)
    axes[1].set_title(f"equal compute: every method's shipped setting, {blocks} (mean ± 95% CI)", fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.suptitle("held-out countdown pass@1 vs pass@16 (study 3: 200-step warm start, lr 1e-4, 160 steps)")
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(out, dpi=100)
    plt.close(fig)


LEAK_NOTE = (
    "Study 1 (`study_plan.md`, `study_budget.md`) warm-started its base 1 with `--seed 1`, which also drew the countdown split "
    "and the held-out additions from seed 1, while the data files hold out seed 0's: that base had trained on ~90% of "
    "`countdown_val` and most of `addition_val`. Its base-1 results, and so its 6-run means, are superseded by this study, "
    "whose two bases both hold out exactly the data files' prompts (`data_seed` 0); study 1's base-0 runs are unaffected by "
    "the leak but ran in the old regime (450-step warm start, lr 2e-4, 120 steps)."
)


def write_study3_report(
    study: Study, out: Path = RESULTS / "study3.md", figure: Path = RESULTS / "study3_pareto.png"
) -> None:
    """benchmarks/results/study3.md (+ its figure), the content study3_plan.md declares.

    Part B reads only the base × seed blocks where every method finished (amendment 1); the runs of a
    block the deadline cut are listed and left out of every table.
    """
    by = group(study.records())
    blocks = complete_blocks(by)
    cut = sorted(r["label"] for v in (*STUDY3_METHODS, STUDY3_BASE) for r in by.get(v, []) if block_of(r) not in blocks)
    by = in_blocks(by, blocks, (*STUDY3_METHODS, STUDY3_BASE))
    shown = ", ".join(f"({b}, {s})" for b, s in blocks) or "none"
    deadline = study.work / "deadline.txt"
    deadline_lines = deadline.read_text().splitlines() if deadline.exists() else []
    sections = [
        "# Study 3: every method side by side in the regime where GRPO clearly raises pass@1\n",
        "Plan, rule and expected directions committed before these runs: [`study3_plan.md`](study3_plan.md). Command: "
        "`python benchmarks/diversity_collapse.py --preset study3`; every record in `"
        + _shown(study.metrics)
        + "`, each run's "
        "`lit-rlvr` commands in `"
        + _shown(study.work / "logs")
        + "`"
        + seconds_note(study.work, "the script")
        + ". Bases: 200-step warm starts, seeds 0 and 1, both holding out the data files' prompts; every run 160 steps of "
        "16 prompts × 16 samples at lr 1e-4, validated at 32 samples per prompt with rollout seed 1000 + its RL seed. "
        "Mean ± 95% t-interval over runs, the worst (lowest) run in brackets.\n",
        "**Study 1's base-1 data leak.** " + LEAK_NOTE + "\n",
    ]
    not_started = [line.split(": ", 1)[1] for line in deadline_lines if line.startswith("not started: ")]
    named = ": " + ", ".join(f"`{label}`" for label in not_started) if not_started else ""
    sweeps = {j.label for j in study3_sweep_jobs([])}
    done = sum(1 for v in by for r in by[v] if r["label"] in sweeps)
    if deadline_lines[1:2] == ["amendment 3"]:
        sections += [
            "**Amendments 1, 2 and 3 (runs bounded by the clock; study3_plan.md).** Amendment 1 (deadline "
            "2026-12-03T13:25) ran part B block by block; amendment 2 (deadline 2026-12-03T15:50) completed its blocks "
            "and ran part C method by method; amendment 3 ("
            f"{deadline_lines[0]}) ran part A and its rule, part C's last runs, part D (its methods read from each "
            "method's fastest part-B run) and DPH at the chosen coverage. "
            f"{done} of {len(sweeps)} sweep runs finished. Part B's complete base × seed blocks: {shown} ({len(blocks)}); "
            f"the runs of blocks a deadline cut, left out of every table: {', '.join(f'`{c}`' for c in cut) or 'none'}; "
            f"{len(not_started)} runs of amendment 3 not started{named}. "
            "After these runs `configs/demo/dph_f.yaml` and `dph_js.yaml` took part A's choice, as the plan says; "
            "part B's DPH-F and DPH-JS rows are the coverage they shipped with while amendments 1 and 2 ran "
            "(threshold 6; DPH-JS on the correct samples), and the chosen coverage's rows follow part B's tables.\n"
        ]
    elif deadline_lines[1:2] == ["amendment 2"]:
        sections += [
            "**Amendments 1 and 2 (runs bounded by the clock; study3_plan.md).** Amendment 1 (deadline "
            "2026-12-03T13:25) ran part B block by block; amendment 2 ("
            f"{deadline_lines[0]}) completed its blocks in the same order, then ran part C (base 0 × RL seed 0) method "
            f"by method in the order {', '.join(NAMES[m] for m in STUDY3_SWEEP_ORDER)}: {done} of {len(sweeps)} sweep runs "
            "finished. Part A not run (DPH-F and DPH-JS at their shipped coverage in parts B and C), part D not run. "
            f"Part B's complete base × seed blocks: {shown} ({len(blocks)}); the runs of blocks the deadline cut, left out "
            f"of every table: {', '.join(f'`{c}`' for c in cut) or 'none'}; "
            f"{len(not_started)} planned runs not started{named}.\n"
        ]
    elif deadline_lines:
        sections += [
            "**Amendment 1 (a run bounded by the clock; study3_plan.md).** "
            f"{deadline_lines[0]}; part A not run (DPH-F and DPH-JS at their shipped coverage), parts C "
            f"and D not run. Part B's complete base × seed blocks: {shown} ({len(blocks)}); the runs of the blocks the "
            f"deadline cut, left out of every table: {', '.join(f'`{c}`' for c in cut) or 'none'}; "
            f"{len(not_started)} planned runs not started.\n"
        ]
    rerun = sorted({v.split("_time")[0] for v in by if "_time" in v})
    cache = study.base_dir(0, warm=STUDY3_WARM) / "ref_cache"
    if (cache / "manifest.json").exists():
        from lit_rlvr.cache.reader import ReferenceCache

        ref = ReferenceCache(cache, verify="size")
        pass_counts, n_cached = ref.pass_counts.tolist(), ref.n
    else:
        pass_counts = None
    part_a = in_blocks(by, STUDY3_PART_A)
    if any(n in by for n in COVERAGE):
        name, flags, why = choose_dph(study, COVERAGE, STUDY3_BASE, STUDY3_PART_A)
        sections += [
            "## A. DPH's coverage, re-chosen on the selection split (`countdown_select` only)\n",
            "Rule (study 1's): the highest mean selection pass@16 among candidates whose mean selection pass@1 ≥ base 0's "
            "(same validation seeds) + 0.04; else the highest pass@1 + pass@16. DPH-F, η 1, base 0 × RL seeds 0, 1.\n",
            *why[1:],
            f"\n**Chosen: `{name}`** — {why[0]}. Its coverage is DPH-F's and DPH-JS's below: "
            f"`{' '.join(f for f in flags if not f.startswith('--model.anchor.coef'))}`.\n",
        ]
        if pass_counts is not None:
            sections += [
                "What each candidate anchors and trains on (base 0's cache, 8 samples per training prompt):\n",
                *coverage_sizes(pass_counts, n_cached),
                "",
            ]
        sections += [
            "Their held-out results (not read by the rule):\n",
            *equal_compute_table(part_a, list(COVERAGE)),
            *reproduced(part_a),
        ]
    else:
        sections += [
            "## A. DPH's coverage: not re-chosen (amendment 1)\n",
            "DPH-F and DPH-JS run at their shipped coverage (threshold 6, `train_split` exp). What it anchors and trains on "
            "(base 0's cache, 8 samples per training prompt; DPH-JS anchors only the correct ones among these):\n",
        ]
        if pass_counts is not None:
            sections += [
                *coverage_sizes(
                    pass_counts, n_cached, {"cov_thr6_exp_all (shipped DPH-F)": COVERAGE["cov_thr6_exp_all"]}
                ),
                "",
            ]
    if "grpo" in by:
        study3_pareto_plot(by, figure, f"base × seed blocks {shown}")
        sections += [
            f"\n## The pass@1–pass@16 picture\n\n![study 3]({figure.name})\n",
            f"\n## B. Equal compute: every method at its shipped setting, 160 steps, blocks (base, seed) {shown}\n",
            *equal_compute_table(by, [STUDY3_BASE, *STUDY3_METHODS]),
            *chosen_rows(by, "equal"),
            "\n### Paired differences against GRPO (same base × seed)\n",
            *paired_table(by, list(STUDY3_METHODS[1:])),
            *chosen_rows(by, "paired"),
            *identical_to_grpo(by),
            "\n### Expected directions (pre-registered: study3_plan.md, `EXPECTED`) and what was seen\n",
            "`+`/`−`: the 95% CI of the paired difference lies above/below 0; `=`: it contains 0. "
            + (
                f"With {len(blocks)} pairs the interval's t is {T95[len(blocks) - 1]}: a `=` there can be a lack of power, "
                "not evidence of no difference.\n"
                if 2 <= len(blocks) <= 10
                else "\n"
            ),
            *[expectation_check(by, m, k) for m in STUDY3_METHODS[1:] for k in (1, 16)],
            "\n### Training seconds per step (the training loop's time over its optimizer steps)\n",
            "Measured on a 2-core machine that other sessions may share; two jobs ran at a time.\n",
            *seconds_table(study, by, rerun, blocks),
            *load_notes(study),
        ]
        g1, g16 = [
            deltas(
                by["grpo"],
                {tuple(r["label"].split("/")[1:]): r for r in by.get(STUDY3_BASE, [])},
                f"val/{HELD_OUT}/pass@{k}",
            )
            for k in (1, 16)
        ]
        sections += [
            "\nSupplementary, not a criterion (a replication of study 2's confirmation on RL seeds 0–2): GRPO's held-out "
            f"Δpass@1 over its own base {cell(g1, signed=True)}, Δpass@16 {cell(g16, signed=True)} over {len(g1)} runs."
        ]
    if rerun:
        sections += [
            "\n## D. Equal wall-clock: the methods slower per step than GRPO by more than 10%, stopped at GRPO's median "
            "training seconds (base 0 × RL seeds 0, 1, 2)\n",
            *wallclock_view(study, by),
        ]
    if any(v in by for m in STUDY3_METHODS for v in sweep_variants(m) if v != m):
        sections += ["\n## C. Sweeps of each method's main knob (base 0)\n", *sweep_table(by), *inert_knobs(by)]
    sections += commands_section(study, "variant", lambda v: not v.startswith("base"))
    publish(sections, out)
