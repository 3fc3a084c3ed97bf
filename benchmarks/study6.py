"""Study 6: a no-cost cure? (benchmarks/results/study6.md, the plan, written before any run)

    python benchmarks/study6.py --slots 2                          # the study: 6 arms × 2 bases × 3 seeds (~70 min)
    python benchmarks/study6.py --smoke --work /tmp/study6_smoke   # its smoke check (minutes; numbers are not results)
    python benchmarks/study6.py --report-only                      # the report from the work folder alone

Study 4's regime (:data:`study4.STUDY4`: 200-step warm starts ``ws200`` with seeds 0 and 1 made on the
machine it runs on, RL seeds 0, 1, 2, 160 steps of 16 prompts × 16 samples, validation at 32 samples per
prompt on the selection split, held-out countdown and OOD addition) with the arms of :data:`ARMS`: GRPO,
DPH-F at threshold 4, UCPO, Pass@k combined and two hybrids designed from studies 3 and 4 before any run.
Each arm is a ``configs/demo/<config>.yaml`` and flags the CLI already takes; no knob is chosen here (the
hybrids' anchor coverages are study 3's part-A candidates, read on its selection split). The claim
(:func:`claim_check`): an arm whose paired held-out pass@1 difference to GRPO has a 95% CI with its lower
bound above −0.01 and whose pass@16 difference's CI lies above 0. The directions of :data:`HYPOTHESES` are
judged by study 3's rule (:func:`study_stats.sign_seen`). Work folder ``artifacts/study6`` (it refuses to
continue on another machine kind); report ``benchmarks/results/study6_results.md`` and
``study6_pareto.png`` (``--smoke``: in the work folder).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import study3
import study4
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
    record_seconds,
    seconds_note,
    study_parser,
)
from study_stats import T95, Hypothesis, block_of, ci, group, in_blocks, mean, verdict

STUDY6 = study4.STUDY4  # the same bases, seeds, steps and validations as study 4
SMOKE = study4.STUDY4_SMOKE
FLOOR = -0.01  # the claim: the lower bound of Δpass@1's 95% CI above this, and of Δpass@16's above 0

ANCHORS = study3.COVERAGE["cov_thr4_exp_all"]  # study 3's chosen coverage: DPH-F's arm, as in study 4
LIGHT_ANCHORS = study3.COVERAGE["cov_thr6_exp_all"]  # the part-A candidate with the highest selection pass@1
UCPO = ["--model.loss.advantage=ucpo", "--model.loss.advantage_options={tau: 0.2}"]  # configs/demo/ucpo.yaml's
PASSK_COMBINED = ["--model.loss.advantage=passk_combined", "--model.loss.advantage_options={k: 4}"]

# variant: (configs/demo/<config>.yaml, the flags beyond it); the order inside a block
ARMS: dict[str, tuple[str, list[str]]] = {
    "grpo": ("grpo", []),
    "dph_f": ("dph_f", ANCHORS),
    "ucpo": ("ucpo", []),
    "passk_combined": ("passk_combined", []),
    "dph_f_ucpo": ("dph_f", [*ANCHORS, *UCPO]),  # hybrid 1: DPH-F's anchors, UCPO on the prompts RL trains
    "dph6_passk_combined": ("dph_f", [*LIGHT_ANCHORS, *PASSK_COMBINED]),  # hybrid 2: lighter anchors, Pass@k comb.
}
METHODS = tuple(ARMS)
CURES = METHODS[1:]  # every arm the claim is judged for

# study6.md's table, written before any run
HYPOTHESES = (
    Hypothesis(
        "K1",
        "dph_f",
        "grpo",
        {1: "-", 16: "+"},
        "studies 3 and 4 replicated (study 4 on the AVX-512 machine: −0.048 ± 0.018 pass@1, +0.104 ± 0.036 pass@16)",
    ),
    Hypothesis(
        "K2",
        "passk_combined",
        "grpo",
        {1: "=", 16: "+"},
        "study 3 (study3.md, part B): −0.009 ± 0.010 pass@1, +0.033 ± 0.022 pass@16",
    ),
    Hypothesis(
        "K3",
        "ucpo",
        "grpo",
        {1: "=", 16: "+"},
        "UCPO (arXiv 2605.00365; docs/methods.md §10): each correct set keeps GRPO's advantage mass (pass@1 kept) "
        "and shares it toward its least likely samples (the correct set does not collapse onto one mode)",
    ),
    Hypothesis(
        "K4",
        "dph_f_ucpo",
        "dph_f",
        {1: "+=", 16: "+="},
        "this plan's design: UCPO on the prompts RL trains adds to the anchors' pass@16 at no further pass@1 cost",
    ),
    Hypothesis(
        "K5",
        "dph6_passk_combined",
        "grpo",
        {1: "=", 16: "+"},
        "this plan's design from study 3's parts: threshold-6 anchors −0.016 ± 0.014 / +0.055 ± 0.026, "
        "Pass@k combined −0.009 ± 0.010 / +0.033 ± 0.022 (pass@1 / pass@16 − GRPO)",
    ),
)
# no source predicts these: reported with the sign the rule gives, not judged
UNJUDGED = (
    ("dph_f_ucpo", "ucpo"),
    ("dph6_passk_combined", "passk_combined"),
    ("dph6_passk_combined", "dph_f"),
    ("dph_f_ucpo", "grpo"),
)


def jobs(setting: study4.Study4Setting = STUDY6) -> list[Job]:
    """Every arm on every base × seed, in study 3's block order (base, seed), the arms in :data:`ARMS` order inside a block."""
    blocks = [(b, s) for b, s in study3.STUDY3_BLOCKS if b in setting.bases and s in setting.seeds]
    return [
        Job(v, config, b, s, list(flags), steps=setting.steps, warm=setting.warm)
        for b, s in blocks
        for v, (config, flags) in ARMS.items()
    ]


def run(study: Study, setting: study4.Study4Setting = STUDY6) -> None:
    """The plan: data, the bases and their caches, the bases' validations, then every job (a rerun skips what is recorded)."""
    study4.claim_work(study.work, setting, study4.machine_record(study.slots))
    study.prepare(base_seeds=list(setting.bases), sql_seeds=[], warms=(setting.warm,))
    study.run(jobs(setting))


# ---------------------------------------------------------------------------- reading


def bound_line(diffs: list[float], pairs: list[str], subject: str, floor: float) -> tuple[bool, str]:
    """Whether the 95% CI of the mean of ``diffs`` lies above ``floor``, and the line that says so with its numbers
    and the worst pair named (``pairs``: each difference's base × seed).

    Example:
        >>> bound_line([0.01, 0.0, 0.02], ["b0/s0", "b1/s0", "b0/s1"], "UCPO pass@1 − GRPO", -0.01)
        (False, '- UCPO pass@1 − GRPO: +0.010 ± 0.025, 95% CI [-0.015, +0.035] over 3 pairs, worst pair b1/s0 +0.000; lower bound above -0.01: MISS')
    """
    if len(diffs) < 2:
        return False, f"- {subject}: {len(diffs)} pair(s), no interval: MISS"
    m, h = mean(diffs), ci(diffs)
    worst = min(range(len(diffs)), key=diffs.__getitem__)
    ok = m - h > floor
    return ok, (
        f"- {subject}: {m:+.3f} ± {h:.3f}, 95% CI [{m - h:+.3f}, {m + h:+.3f}] over {len(diffs)} pairs, worst pair "
        f"{pairs[worst]} {diffs[worst]:+.3f}; lower bound above {floor:g}: {'MET' if ok else 'MISS'}"
    )


def paired_named(by: dict, variant: str, key: str, against: str = "grpo") -> tuple[list[float], list[str]]:
    """:func:`study_stats.paired` with each pair's base × seed."""
    other = {block_of(r): r for r in by.get(against, []) if key in r}
    kept = [
        (r[key] - other[block_of(r)][key], "/".join(block_of(r)))
        for r in by.get(variant, [])
        if key in r and block_of(r) in other
    ]
    return [d for d, _ in kept], [p for _, p in kept]


def claim_check(by: dict, variant: str) -> tuple[str, list[str]]:
    """The no-cost claim for one arm: HELD when Δpass@1's 95% CI lower bound is above :data:`FLOOR` and Δpass@16's
    above 0 (paired with GRPO on base × seed); else MISSED naming the part that missed; each part's line."""
    parts, names, lines = [], [], []
    for k, floor in ((1, FLOOR), (16, 0.0)):
        diffs, pairs = paired_named(by, variant, f"val/{HELD_OUT}/pass@{k}")
        ok, line = bound_line(diffs, pairs, f"{NAMES[variant]} pass@{k} − GRPO", floor)
        parts.append(ok)
        names.append(f"pass@{k}")
        lines.append(line)
    missed = [n for n, ok in zip(names, parts) if not ok]
    return ("HELD" if not missed else f"MISSED ({', '.join(missed)} missed)"), lines


def claim_lines(by: dict) -> list[str]:
    lines = []
    for v in CURES:
        held, parts = claim_check(by, v)
        lines += [f"\n**{NAMES[v]}: the claim {held}**\n", *parts]
    return lines


def verdicts(by: dict) -> list[str]:
    """Each direction HELD or MISSED (naming the parts that missed), its parts MET or MISS with their numbers."""
    lines = []
    for h in HYPOTHESES:
        parts = [direction_check(by, h.variant, k, want, NAMES[h.variant], h.against) for k, want in h.allowed.items()]
        held = verdict(parts, [f"pass@{k}" for k in h.allowed])
        lines += [f"\n**{h.name}: {held}** — {NAMES[h.variant]} − {NAMES[h.against]}; source: {h.source}.\n", *parts]
    lines += ["\nNot judged (no direction from a source; pass@32 is reported for every arm against GRPO):\n"]
    lines += [direction_check(by, v, k, None, NAMES[v], a) for v, a in UNJUDGED for k in (1, 16)]
    lines += [direction_check(by, v, 32, None, NAMES[v], "grpo") for v in CURES]
    return lines


def write_report(
    study: Study,
    setting: study4.Study4Setting = STUDY6,
    out: Path = RESULTS / "study6_results.md",
    figure: Path = RESULTS / "study6_pareto.png",
) -> None:
    """The report study6.md declares, from the work folder alone; complete base × seed blocks only."""
    base = f"base_{setting.warm}"
    by = group(study.records())
    blocks = study3.complete_blocks(by, METHODS)
    planned = jobs(setting)
    missing = [j.label for j in planned if j.label not in study.done_labels()]
    cut = sorted(r["label"] for v in (*METHODS, base) for r in by.get(v, []) if block_of(r) not in blocks)
    by = in_blocks(by, blocks, (*METHODS, base))
    shown = ", ".join(f"({b}, {s})" for b, s in blocks) or "none"
    smoke = setting != STUDY6
    sections = [
        "# Study 6: a no-cost cure? GRPO, DPH-F, UCPO, Pass@k combined and two hybrids in study 4's regime\n",
        *(
            [
                "**SMOKE CHECK (`--smoke`): a 5-step base, 2 RL steps, a few validation prompts. It shows the pipeline runs; "
                "its numbers are not results.**\n"
            ]
            if smoke
            else []
        ),
        "Plan, hypotheses and rule committed before these runs: [`study6.md`](study6.md). Command: "
        f"`python benchmarks/study6.py{' --smoke' if smoke else ''} --slots 2`; every record in `{_shown(study.metrics)}`, "
        f"each run's `lit-rlvr` commands in `{_shown(study.work / 'logs')}`"
        + seconds_note(study.work)
        + f". Bases: warm start `{setting.warm}` with seeds {', '.join(map(str, setting.bases))}, made on this machine; RL "
        f"seeds {', '.join(map(str, setting.seeds))}; every run {setting.steps} steps of 16 prompts × 16 samples at lr 1e-4, "
        "validated at 32 samples per prompt with rollout seed 1000 + its RL seed. Mean ± 95% t-interval over runs, the "
        "worst (lowest) run in brackets.\n",
        "## Machine and bases\n",
        *study4.study4_machine_lines(study, setting),
        f"\nComplete base × seed blocks (all {len(METHODS)} arms recorded): {shown} ({len(blocks)} of "
        f"{len(planned) // len(METHODS)}); runs of incomplete blocks, left out of every table: "
        f"{', '.join(f'`{c}`' for c in cut) or 'none'}; planned runs not recorded: {', '.join(f'`{m}`' for m in missing) or 'none'}.\n",
    ]
    if blocks:
        title = f"study 6: held-out countdown, {setting.steps} steps, blocks {shown}"
        study4.study4_pareto_plot(by, figure, base, title, METHODS, FLOOR)
        power = (
            f"With {len(blocks)} pairs the interval's t is {T95[len(blocks) - 1]}."
            if 2 <= len(blocks) <= 10
            else "With fewer than 2 pairs there is no interval: every claim misses and every sign reads `=`."
        )
        sections += [
            f"## The pass@1–pass@16 picture\n\n![study 6]({figure.name})\n",
            "## Equal training steps: every arm at its setting\n",
            *study3.equal_compute_table(by, [base, *METHODS]),
            "\n### Paired differences (same base × seed)\n",
            *study3.paired_table(by, list(CURES)),
            "",
            *study3.paired_table(by, ["dph_f_ucpo", "dph6_passk_combined"], "dph_f"),
            "",
            *study3.paired_table(by, ["dph_f_ucpo"], "ucpo"),
            "",
            *study3.paired_table(by, ["dph6_passk_combined"], "passk_combined"),
            "\n## The claim (pre-registered: study6.md, `claim_check`): a cure at no pass@1 cost\n",
            f"An arm HOLDS the claim when, paired with GRPO on base × seed, the 95% CI of its held-out pass@1 difference "
            f"has its lower bound above {FLOOR:g} and that of its pass@16 difference above 0; otherwise it MISSES, the "
            "part that missed named. Each line names the worst pair. " + power,
            *claim_lines(by),
            "\n## The directions (pre-registered: study6.md, `HYPOTHESES`) and what was seen\n",
            "`+`/`−`: the 95% CI of the paired difference lies above/below 0; `=`: it contains 0 (study 3's rule). A part "
            "is MET when the sign seen is one the hypothesis allows, else a MISS; a hypothesis HELD when every part is MET. "
            "A `=` can be a lack of power.",
            *verdicts(by),
            "\n## Every run (held-out pass@1 / pass@16)\n",
            *study4.study4_runs_table(by, base, blocks, METHODS),
            "\n### Training seconds per step (the training loop's time over its optimizer steps)\n",
            "Two jobs at a time on 2 cores that other sessions may share. Not a criterion.\n",
            *study4.study4_seconds_table(study, METHODS),
            *load_notes(study),
        ]
    sections += commands_section(study, "arm", lambda v: v in METHODS)
    publish(sections, out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return study_parser(
        __doc__, "study6", "base 0 from a 5-step warm start, RL seed 0, 2 steps, 8 prompts per validation set"
    ).parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setting = SMOKE if args.smoke else STUDY6
    study = Study(
        args.work or ROOT / "artifacts" / ("study6_smoke" if args.smoke else "study6"),
        args.slots,
        deadline=args.deadline,
        validate_flags=setting.validate_flags,
    )
    if args.report_only:
        study4.claim_work(study.work, setting, None)
    else:
        t0 = time.perf_counter()
        run(study, setting)
        record_seconds(study.work, "study6 --smoke" if args.smoke else "study6", t0)
    where = study.work if args.smoke else RESULTS
    write_report(study, setting, where / "study6_results.md", where / "study6_pareto.png")


if __name__ == "__main__":
    main()
