"""Study 2, the demo's regime (``--preset regime`` and ``regime_confirm`` of benchmarks/diversity_collapse.py;
benchmarks/results/study2_plan.md, written before its runs): the candidates, their jobs, the rule that chooses
one on the selection split, the acceptance criterion on held-out pairs, and the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from study_runner import HELD_OUT, OOD, RESULTS, SELECT, WARMSTARTS, Job, Study, _shown, fit_commands
from study_stats import ci, fmt, mean


@dataclass(frozen=True)
class Regime:
    """A candidate setting of the demo's task and schedule for study 2 (benchmarks/results/study2_plan.md)."""

    warm: str  # a WARMSTARTS key
    lr: float
    steps: int

    @property
    def flags(self) -> list[str]:
        return [f"--model.optimizer.init_args.lr={self.lr}"]

    @property
    def cost(self) -> tuple[int, int]:
        """What the rule's tie-break compares: (warm-start steps, RL steps)."""
        warm = WARMSTARTS[self.warm]
        return (int(warm[warm.index("--steps") + 1]), self.steps)


# The candidates of study2_plan.md, in its order (GRPO only; the rest of configs/demo as shipped)
REGIMES: dict[str, Regime] = {
    "ref": Regime("", 2e-4, 120),
    "lr1e-4": Regime("", 1e-4, 120),
    "lr5e-5": Regime("", 5e-5, 120),
    "ws200": Regime("ws200", 2e-4, 120),
    "ws200_lr1e-4": Regime("ws200", 1e-4, 120),
    "ws200_lr1e-4_s160": Regime("ws200", 1e-4, 160),
}
REGIME_SEEDS, CONFIRM_SEEDS, CONFIRM_BASES = (0, 1), (3, 4, 5), (0, 1)
REGIME_MIN_GAIN = 0.08  # the acceptance criterion's held-out pass@1 gain, and the rule's bar on the selection split


def regime_jobs(names=tuple(REGIMES), seeds=REGIME_SEEDS) -> list[Job]:
    """Study 2's selection runs: GRPO with each candidate regime on base 0 of its warm start."""
    return [
        Job(n, "grpo", 0, s, REGIMES[n].flags, steps=REGIMES[n].steps, warm=REGIMES[n].warm)
        for n in names
        for s in seeds
    ]


def confirm_jobs(name: str, bases=CONFIRM_BASES, seeds=CONFIRM_SEEDS) -> list[Job]:
    """Study 2's confirmation: the chosen regime on every base × fresh RL seeds (variant ``confirm_<name>``)."""
    r = REGIMES[name]
    return [Job(f"confirm_{name}", "grpo", b, s, r.flags, steps=r.steps, warm=r.warm) for b in bases for s in seeds]


def regime_deltas(records: list[dict], name: str, key: str, variant: str | None = None) -> list[tuple[str, float]]:
    """``(label, run − its base)`` for every run of regime ``name`` (variant ``name`` or ``variant``) that has ``key``.

    The base is the regime's warm start with the run's base seed, validated with the run's seed.
    """
    warm = REGIMES[name].warm
    base_variant = f"base_{warm}" if warm else "base"
    bases = {tuple(r["label"].split("/")[1:]): r for r in records if r["label"].split("/")[0] == base_variant}
    out = []
    for r in records:
        v, b, s = r["label"].split("/")
        base = bases.get((b, s))
        if v == (variant or name) and base is not None and key in r and key in base:
            out.append((r["label"], r[key] - base[key]))
    return out


def choose_regime(study: Study) -> tuple[str | None, list[str]]:
    """Study 2's rule (study2_plan.md), on the selection split only; returns (name or None, [why, *table]).

    Qualify: mean selection Δpass@16 < 0. Pick: the highest mean selection Δpass@1; means within 0.01
    of the best go to the cheaper demo (fewer warm-start steps, then fewer RL steps). ``None`` when
    nothing ran yet.
    """
    records = study.records()
    p1, p16 = f"val/{SELECT}/pass@1", f"val/{SELECT}/pass@16"
    rows, lines = [], []
    for name, r in REGIMES.items():
        d1, d16 = [d for _, d in regime_deltas(records, name, p1)], [d for _, d in regime_deltas(records, name, p16)]
        if not d1:
            continue
        ok = mean(d16) < 0
        rows.append((name, mean(d1), ok))
        lines.append(
            f"| `{name}` | {r.cost[0]} | {r.lr:.0e} | {r.steps} | {len(d1)} | {fmt(d1)} | {min(d1):+.3f} | {fmt(d16)} | {'yes' if ok else 'no'} |"
        )
    table = [
        "| candidate | warm-start steps | lr | RL steps | runs | selection Δpass@1 | worst Δpass@1 | selection Δpass@16 | qualifies (Δpass@16 < 0) |",
        "|---|---|---|---|---|---|---|---|---|",
        *lines,
    ]
    qualified = [r for r in rows if r[2]]
    if not qualified:
        return None, ["no candidate has run yet" if not rows else "no candidate qualifies (Δpass@16 < 0)", *table]
    top = max(r[1] for r in qualified)
    best = min((r for r in qualified if r[1] >= top - 0.01), key=lambda r: REGIMES[r[0]].cost)
    why = (
        f"highest mean selection Δpass@1 ({top:+.3f})"
        + (f"; `{best[0]}` ({best[1]:+.3f}) is within 0.01 of it and the cheaper demo" if best[1] < top else "")
        + (
            f"; below the +{REGIME_MIN_GAIN} bar, so not confirmed (study2_plan.md, rule 3)"
            if best[1] < REGIME_MIN_GAIN
            else ""
        )
    )
    return best[0], [why, *table]


def regime_criterion(study: Study, name: str) -> tuple[bool | None, list[float], str]:
    """The acceptance criterion on the confirmation runs: held-out Δpass@1 mean ≥ +0.08 with its 95% CI above 0."""
    d = [x for _, x in regime_deltas(study.records(), name, f"val/{HELD_OUT}/pass@1", f"confirm_{name}")]
    if len(d) < 2:
        return None, d, f"not run ({len(d)} confirmation runs)"
    met = mean(d) >= REGIME_MIN_GAIN and mean(d) - ci(d) > 0
    return (
        met,
        d,
        (
            f"{'MET' if met else 'NOT MET'}: held-out Δpass@1 {fmt(d)} over {len(d)} runs (95% CI [{mean(d) - ci(d):+.3f}, "
            f"{mean(d) + ci(d):+.3f}]; needs mean ≥ +{REGIME_MIN_GAIN} and lower bound > 0), worst run {min(d):+.3f}"
        ),
    )


def run_regime(study: Study, preset: str) -> None:
    """``regime``: every candidate on the selection split; ``regime_confirm``: the rule's choice on every base × fresh seed."""
    if preset == "regime":
        study.prepare(
            base_seeds=[0], sql_seeds=[], warms=tuple(sorted({r.warm for r in REGIMES.values()})), cache=False
        )
        study.run(regime_jobs())
        return
    name, why = choose_regime(study)
    if name is None or not any(line.startswith("highest") for line in why[:1]):
        raise RuntimeError(f"regime_confirm needs the regime preset's choice first: {why[0]}")
    if "not confirmed" in why[0]:
        raise RuntimeError(f"the rule's choice `{name}` is not confirmed on held-out pairs: {why[0]}")
    study.prepare(base_seeds=list(CONFIRM_BASES), sql_seeds=[], warms=(REGIMES[name].warm,), cache=False)
    study.run(confirm_jobs(name))


def write_regime_report(study: Study, out: Path = RESULTS / "study2_regime.md") -> None:
    """benchmarks/results/study2_regime.md: the selection table and choice, the confirmation and its criterion, every run."""
    records = study.records()
    by_label = {r["label"]: r for r in records}
    name, why = choose_regime(study)
    sections = [
        "# Study 2, part 1: the demo's regime (GRPO's pass@1 gain)\n",
        "Plan and rule committed before these runs: [`study2_plan.md`](study2_plan.md). Commands: "
        "`python benchmarks/diversity_collapse.py --preset regime` (selection), then `--preset regime_confirm` (held-out); "
        "every record in `"
        + _shown(study.metrics)
        + "`, each run's `lit-rlvr` commands in `"
        + _shown(study.work / "logs")
        + "`. "
        "Δ = a run minus its own base validated with the same rollout seed (1000 + RL seed), 32 samples per prompt; "
        "mean ± 95% t-interval over runs; worst = the lowest run.\n",
        "## 1. Choosing the regime on the selection split (`countdown_select` only)\n",
        *why[1:],
        f"\n**Chosen: `{name}`** — {why[0]}.\n" if name else f"\nNo choice: {why[0]}.\n",
    ]
    keys = [(SELECT, "selection"), (HELD_OUT, "held-out"), (OOD, "OOD addition")]

    def head(sets: list[tuple[str, str]]) -> list[str]:
        return [
            "| run | " + " | ".join(f"{n} pass@1 base → run (Δ) | {n} pass@16 base → run (Δ)" for _, n in sets) + " |",
            "|---|" + "---|---|" * len(sets),
        ]

    def run_rows(variant: str, regime_name: str, sets: list[tuple[str, str]]) -> list[str]:
        warm = REGIMES[regime_name].warm
        base_variant = f"base_{warm}" if warm else "base"
        lines = []
        for r in records:
            v, b, s = r["label"].split("/")
            base = by_label.get(f"{base_variant}/{b}/{s}")
            if v != variant or base is None:
                continue
            cells = []
            for key, _ in sets:
                for k in (1, 16):
                    x, y = base[f"val/{key}/pass@{k}"], r[f"val/{key}/pass@{k}"]
                    cells.append(f"{x:.3f} → {y:.3f} ({y - x:+.3f})")
            lines.append(f"| `{r['label']}` | " + " | ".join(cells) + " |")
        return lines

    selection_runs = [row for n in REGIMES for row in run_rows(n, n, keys[:1])]
    if selection_runs:
        sections += ["\nEvery selection run (the rule reads these numbers only):\n", *head(keys[:1]), *selection_runs]
    if name:
        variant = f"confirm_{name}"
        met, d, line = regime_criterion(study, name)
        sections += [
            f"\n## 2. Confirmation on the held-out pairs: `{name}` on bases {', '.join(map(str, CONFIRM_BASES))} × fresh RL seeds "
            f"{', '.join(map(str, CONFIRM_SEEDS))}\n",
            f"**Acceptance criterion {line}.**\n",
        ]
        if d:
            summary = ["| metric (Δ = run − its base) | mean ± 95% CI | worst run |", "|---|---|---|"]
            for key, label in ((HELD_OUT, "held-out"), (OOD, "OOD addition"), (SELECT, "selection")):
                for k in (1, 16, 32):
                    ds = [x for _, x in regime_deltas(records, name, f"val/{key}/pass@{k}", variant)]
                    summary.append(f"| {label} Δpass@{k} | {fmt(ds)} | {min(ds):+.3f} |")
            ds = [x for _, x in regime_deltas(records, name, f"val/{HELD_OUT}/distinct_correct_answers", variant)]
            summary.append(f"| held-out Δ distinct correct answers | {fmt(ds, 2)} | {min(ds):+.2f} |")
            sections += [*summary, "\nEvery confirmation run:\n", *head(keys), *run_rows(variant, name, keys)]
        if selection_runs:
            sections += [
                "\n## 3. The selection runs' held-out and OOD numbers (recorded by the same validations; not read by the rule)\n",
                *head(keys[1:]),
                *[row for n in REGIMES for row in run_rows(n, n, keys[1:])],
            ]
    labels = [r["label"] for r in records if not r["label"].startswith("base")]
    if name:
        sections.append(
            "\n`make demo` in this regime, one run with its wall time: [`study2_demo_run.md`](study2_demo_run.md)."
        )
    sections += [
        "\n## Commands of every run\n",
        "Each run's `lit-rlvr fit` (then `lit-rlvr validate --config configs/demo/base.yaml "
        "--config configs/demo/record.yaml --config configs/demo/study_sets.yaml` of its export and of its base, as in its log):\n",
        *fit_commands(study, labels),
    ]
    body = "\n".join(sections) + "\n"
    out.write_text(body)
    print(body)
