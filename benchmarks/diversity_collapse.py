"""Diversity collapse and its cure on the CPU demo: a study across bases and seeds, an anchor ablation
whose choice is made on a selection split, the pass@1–pass@16 Pareto, equal wall-clock, and SQL.

    python benchmarks/diversity_collapse.py                   # the whole study (preset "study", ~2 h on 2 cores)
    python benchmarks/diversity_collapse.py --preset budget   # the smaller grid this repo's results come from (~75 min)
    python benchmarks/diversity_collapse.py --preset quick    # GRPO, DPH-F, Pass@k: 1 base, 1 seed, 60 steps
    python benchmarks/diversity_collapse.py --preset robust   # one part only (ablation | robust | pareto | wallclock | sql)
    python benchmarks/diversity_collapse.py --preset methods  # the entropy/diversity methods of docs/methods.md §8 vs GRPO
    python benchmarks/diversity_collapse.py --preset regime           # study 2: GRPO's regime candidates on the selection split
    python benchmarks/diversity_collapse.py --preset regime_confirm   # study 2: the chosen regime on 2 bases x 3 fresh seeds, held out
    python benchmarks/diversity_collapse.py --preset study3   # study 3: every method in study 2's regime (3-5 h on 2 cores)
    python benchmarks/diversity_collapse.py --preset study4   # study 4: MaxRL beside GRPO, DPH-F, Pass@k (~1 h on 2 cores)
    python benchmarks/diversity_collapse.py --preset study4 --smoke --work /tmp/study4_smoke   # its smoke check (minutes)
    python benchmarks/diversity_collapse.py --report-only     # summarise an existing --work folder

Every run goes through the ``lit-rlvr`` CLI and ``configs/demo/``: ``warmstart`` (one base per
warm-start seed), ``demo-data``, ``cache`` (per base), then per job ``fit`` and ``validate`` of the
exported policy on the selection split (``countdown_select``: training pairs left out of RL), the
held-out countdown pairs (in-domain) and 2-digit addition (out-of-domain), 32 samples per prompt.
Two jobs run at a time, one torch thread each. Results (every record, the choice, the tables, the
plots) go to ``benchmarks/results/study*.md`` and ``.png``.

The rule that picks the demo's DPH-F settings was written (here, and in
``benchmarks/results/study.md``) before any run of the study: among the ablation's configurations,
the one with the highest mean pass@16 on the **selection split** among those whose mean
selection pass@1 is at least the base's + 0.04; if none qualifies, the highest mean selection
pass@1 + pass@16. Held-out sets are never read by the rule. The chosen configuration is then
run on 2 bases × 3 seeds (robust), in the Pareto sweep over η, and at equal wall-clock.

The ``methods`` preset runs the other published cures (Clip-Cov, KL-Cov, forking tokens, the
entropy bonus and its adaptive coefficient, PSR, NSR, W-REINFORCE, the unlikeliness reward;
``configs/demo/<method>.yaml``) and GRPO on 2 bases × 3 seeds at each config's setting, and a sweep
of each method's one main knob (``METHODS``) on base 0 × 2 seeds; the report gives their
pass@1–pass@16 plot, the table, the paired differences against GRPO on the same base × seed, the
training seconds per step, and each method's expected direction from its paper (``EXPECTED``,
written before any run of the preset) with every miss reported as a miss.

Study 2's regime presets (``benchmarks/results/study2_plan.md``, written before their runs) choose
the demo's task schedule: ``regime`` runs GRPO for each candidate of :data:`REGIMES` on base 0 of
its warm-start length (RL seeds 0, 1) and picks one by :func:`choose_regime` on the selection split
only; ``regime_confirm`` runs the choice on bases 0 and 1 × fresh RL seeds 3, 4, 5 and checks the
acceptance criterion on the held-out pairs (:func:`regime_criterion`). Their work folder defaults
to ``artifacts/study2`` and their report is ``benchmarks/results/study2_regime.md``.

Study 3 (``--preset study3``; ``benchmarks/results/study3_plan.md``, written before its runs) runs
every method in that regime (200-step warm starts, lr 1e-4, 160 steps): DPH's coverage re-chosen by
:func:`choose_dph` among :data:`COVERAGE` on the selection split (part A), every method of
``STUDY3_METHODS`` at its config on 2 bases × 3 seeds (B), each knob of :data:`KNOBS` at two more
values on base 0 × seed 0 (C), and the methods slower per step than GRPO at GRPO's wall-clock (D).
Work folder ``artifacts/study3``; report ``benchmarks/results/study3.md`` and ``study3_pareto.png``.

Study 4 (``--preset study4``; ``benchmarks/results/study4_plan.md``, written before its runs) runs GRPO,
DPH-F (study 3's chosen coverage), Pass@k and MaxRL in the same regime on 2 bases × 3 seeds made on
the machine it runs on (:data:`STUDY4`), and judges :data:`STUDY4_HYPOTHESES` by study 3's rule. Work
folder ``artifacts/study4`` (it refuses to continue on another machine kind); report
``benchmarks/results/study4.md`` and ``study4_pareto.png``. ``--smoke`` runs the same pipeline on
:data:`STUDY4_SMOKE` and reports into its work folder.
``--pause-file PATH`` holds new jobs while PATH exists.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from lightning import Callback
from study1 import (
    BUDGET_ABLATION,
    ablation_jobs,
    choose_dph,
    methods_jobs,
    pareto_jobs,
    robust_jobs,
    sql_jobs,
    wallclock_jobs,
    write_report,
)
from study2 import run_regime, write_regime_report
from study3 import run_study3, run_study3_amended, run_study3_amendment2, run_study3_amendment3, write_study3_report
from study4 import STUDY4, STUDY4_SMOKE, claim_work, run_study4, write_study4_report
from study_runner import RESULTS, ROOT, Job, Study, record_seconds


class FitTimer(Callback):
    """Writes ``{"train_seconds", "steps"}`` of a fit: the training loop's time, as ``Trainer(max_time=...)`` counts it."""

    def __init__(self, path: str):
        self.path = path

    def on_train_start(self, trainer, pl_module):
        self.t0 = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        Path(self.path).write_text(
            json.dumps({"train_seconds": round(time.perf_counter() - self.t0, 2), "steps": trainer.global_step})
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--preset",
        default="study",
        choices=[
            "study",
            "budget",
            "quick",
            "ablation",
            "robust",
            "pareto",
            "wallclock",
            "sql",
            "methods",
            "regime",
            "regime_confirm",
            "study3",
            "study4",
        ],
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="work folder (default artifacts/study; artifacts/study2 for the regime presets, artifacts/study3 for "
        "study3, artifacts/study4 for study4, artifacts/study4_smoke with --smoke)",
    )
    parser.add_argument("--slots", type=int, default=2, help="jobs at a time (one torch thread each)")
    parser.add_argument(
        "--pause-file", type=Path, default=None, help="while this file exists no new job starts (running ones finish)"
    )
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument(
        "--amendment",
        type=int,
        choices=[1, 2, 3],
        default=1,
        help="study3 with --deadline: which amendment of study3_plan.md governs the run (2: part B's blocks, then "
        "part C; 3: part A, the last sweeps, part D, DPH at the chosen coverage)",
    )
    parser.add_argument(
        "--deadline",
        type=lambda v: datetime.fromisoformat(v).replace(tzinfo=UTC),
        default=None,
        help="study3: amendment 1 of study3_plan.md — no job starts after this UTC time (e.g. 2026-12-03T13:25); "
        "no part A, part B block by block, no parts C and D",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="study4: the smoke check — base 0 from a 5-step warm start, RL seed 0, 2 steps, 8 prompts per "
        "validation set; its report goes to the work folder, never to benchmarks/results",
    )
    args = parser.parse_args(argv)
    if args.smoke and args.preset != "study4":
        parser.error(f"--smoke is study4's smoke check; got --preset {args.preset}")
    return args


def main() -> None:
    args = parse_args()
    regime = args.preset.startswith("regime")
    folder = {"study3": "study3", "study4": "study4_smoke" if args.smoke else "study4"}.get(
        args.preset, "study2" if regime else "study"
    )
    setting = STUDY4_SMOKE if args.smoke else STUDY4
    study = Study(
        args.work or ROOT / "artifacts" / folder,
        args.slots,
        pause=args.pause_file,
        deadline=args.deadline,
        validate_flags=setting.validate_flags if args.preset == "study4" else (),
    )
    t0 = time.perf_counter()
    if args.preset == "study4":
        if args.report_only:
            claim_work(study.work, setting, None)
        else:
            run_study4(study, setting)
            record_seconds(study.work, f"{args.preset}{' --smoke' if args.smoke else ''}", t0)
        where = study.work if args.smoke else RESULTS
        write_study4_report(study, setting, where / "study4.md", where / "study4_pareto.png")
        return
    if args.preset == "study3":
        if not args.report_only:
            amended = {1: run_study3_amended, 2: run_study3_amendment2, 3: run_study3_amendment3}[args.amendment]
            amended(study) if args.deadline else run_study3(study)
            record_seconds(study.work, args.preset, t0)
        write_study3_report(study)
        return
    if regime:
        if not args.report_only:
            run_regime(study, args.preset)
            record_seconds(study.work, args.preset, t0)
        write_regime_report(study)
        return
    parts = {
        "study": ["ablation", "robust", "wallclock", "pareto", "sql"],
        "budget": ["ablation", "robust", "sql", "wallclock", "pareto"],
    }
    parts = parts.get(args.preset, [args.preset])
    budget = args.preset == "budget"  # seed 0 only outside robust, priority order (study_plan.md's amendment)
    if not args.report_only:
        study.prepare(
            base_seeds=[0] if args.preset in ("quick", "ablation", "pareto", "wallclock") else [0, 1],
            sql_seeds=[0] if args.preset in ("study", "budget", "sql") else [],
        )
        if args.preset == "quick":
            study.run([Job(v, v, 0, 0, steps=60) for v in ("grpo", "dph_f", "passk")])
        for part in parts:
            if part == "ablation":
                study.run(ablation_jobs(seeds=(0,), names=BUDGET_ABLATION) if budget else ablation_jobs())
                continue
            if part == "quick":
                continue
            if part == "methods":
                study.run(methods_jobs())
                continue
            name, flags, _ = choose_dph(study)
            seeds = (0,) if budget else (0, 1)
            jobs = {
                "robust": lambda: robust_jobs(flags, schedule=not budget),
                "pareto": lambda: pareto_jobs(flags, seeds, schedule=budget),
                "wallclock": lambda: wallclock_jobs(study, flags, seeds=(0,) if budget else (0, 1, 2)),
                "sql": lambda: sql_jobs(flags, seeds=(0,) if budget else (0, 1, 2)),
            }[part]()
            study.run(jobs)
        record_seconds(args.work, args.preset, t0)
    write_report(study, args.preset)


if __name__ == "__main__":
    main()
