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
import dataclasses
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from lightning import Callback

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DATA = (
    ROOT / "artifacts" / "demo" / "data"
)  # the configs/demo files read it; `lit-rlvr demo-data` writes it, deterministically
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
SELECT, HELD_OUT, OOD, SQL = "countdown_select", "countdown_val", "addition_val", "sql_val"
KS = (1, 4, 16, 32)

# The ablation of the anchor (DPH-F, forward KL): coverage of D_pef and eta. "paper" marks the
# DPH-RL paper's own choice where it made one (threshold 6/8–8/8 with D_pef out of RL, anchors =
# correct samples); eta's paper values (0.01–0.05 at lr 1e-6 on 7B models) do not transfer to this
# 1.3M-parameter model at lr 2e-4, so every eta here is ours.
ABLATION = {
    "thr6_exp_correct_eta1": [
        "--data.cache.perfect_threshold=6",
        "--data.cache.train_split=exp",
        "--data.cache.anchor_samples=correct",
        "--model.anchor.coef=1.0",
    ],
    "thr8_exp_correct_eta1": [
        "--data.cache.perfect_threshold=8",
        "--data.cache.train_split=exp",
        "--data.cache.anchor_samples=correct",
        "--model.anchor.coef=1.0",
    ],
    "thr4_exp_correct_eta1": [
        "--data.cache.perfect_threshold=4",
        "--data.cache.train_split=exp",
        "--data.cache.anchor_samples=correct",
        "--model.anchor.coef=1.0",
    ],
    "thr6_all_correct_eta1": [
        "--data.cache.perfect_threshold=6",
        "--data.cache.train_split=all",
        "--data.cache.anchor_samples=correct",
        "--model.anchor.coef=1.0",
    ],
    "thr8_all_correct_eta1": [
        "--data.cache.perfect_threshold=8",
        "--data.cache.train_split=all",
        "--data.cache.anchor_samples=correct",
        "--model.anchor.coef=1.0",
    ],
    "thr4_all_correct_eta1": [
        "--data.cache.perfect_threshold=4",
        "--data.cache.train_split=all",
        "--data.cache.anchor_samples=correct",
        "--model.anchor.coef=1.0",
    ],
    "thr6_exp_all_eta1": [
        "--data.cache.perfect_threshold=6",
        "--data.cache.train_split=exp",
        "--data.cache.anchor_samples=all",
        "--model.anchor.coef=1.0",
    ],
    "thr6_exp_correct_eta0.5": [
        "--data.cache.perfect_threshold=6",
        "--data.cache.train_split=exp",
        "--data.cache.anchor_samples=correct",
        "--model.anchor.coef=0.5",
    ],
    "thr6_exp_correct_eta2": [
        "--data.cache.perfect_threshold=6",
        "--data.cache.train_split=exp",
        "--data.cache.anchor_samples=correct",
        "--model.anchor.coef=2.0",
    ],
}
PAPER_SETTINGS = {"thr6_exp_correct_eta1", "thr8_exp_correct_eta1"}  # coverage as in the paper (eta is ours)


@dataclass
class Job:
    """One fit + validate: ``label`` is ``<variant>/b<base seed>/s<rl seed>``."""

    variant: str
    method: str  # a configs/demo/<method>.yaml
    base_seed: int
    seed: int
    overrides: list[str] = field(default_factory=list)
    steps: int = 120
    domain: str = "countdown"  # or "sql"
    warm: str = ""  # a WARMSTARTS key: the base's warm-start recipe ("" = study 1's, 450 steps)

    @property
    def label(self) -> str:
        return f"{self.variant}/b{self.base_seed}/s{self.seed}"


# Warm-start recipes of the bases (flags on top of configs/demo/warmstart.yaml, whose steps moved from
# 450 to 200 with study 2's choice); each base lives in <work>/base[_<name>]/s<seed> and is validated as
# base[_<name>]/b<seed>/s<rl seed>. "" is study 1's 450 steps, so its runs stay reproducible.
# "smoke" is study 4's smoke check (a base that only proves the pipeline runs, never a result).
WARMSTARTS: dict[str, list[str]] = {
    "": ["--steps", "450"],
    "ws200": ["--steps", "200"],
    "smoke": ["--steps", "5", "--warmup_steps", "1", "--eval_samples", "0"],
}


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


def _labelled(task, label: str):
    """``task`` with the label the deadline's skip list shows."""
    task.label = label
    return task


class Study:
    """Runs jobs two at a time through the CLI and keeps every record in ``work``."""

    def __init__(
        self,
        work: Path,
        slots: int = 2,
        pause: Path | None = None,
        poll: float = 30.0,
        deadline: datetime | None = None,
        validate_flags: tuple[str, ...] = (),
    ):
        self.work, self.slots = work, slots
        self.validate_flags = (
            validate_flags  # added to every `lit-rlvr validate` (study 4's smoke check: fewer prompts)
        )
        self.pause, self.poll = pause, poll  # while the file ``pause`` exists, no new job starts (those running finish)
        self.deadline = (
            deadline  # no job starts after it (those running finish); a plan's amendment sets it before the runs
        )
        self.skipped: list[str] = []  # what the deadline kept from starting, in order
        self.work.mkdir(parents=True, exist_ok=True)
        self.metrics = work / "metrics.jsonl"
        self.timings = work / "timings.jsonl"
        self.log_lock = threading.Lock()

    # ------------------------------------------------------------------ running
    def lit(self, *args: str, log: str, threads: int = 1) -> float:
        """``lit-rlvr args`` in a fresh process with ``threads`` torch threads; returns its wall seconds."""
        env = dict(
            os.environ,
            OMP_NUM_THREADS=str(threads),
            TOKENIZERS_PARALLELISM="false",
            PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), *sys.path]),
        )
        path = self.work / "logs" / f"{log}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with path.open("a") as f:
            f.write(f"\n$ lit-rlvr {' '.join(args)}\n")
            f.flush()
            proc = subprocess.run(
                [sys.executable, "-m", "lit_rlvr.cli", *args], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT
            )
        if proc.returncode:
            raise RuntimeError(
                f"lit-rlvr {args[0]} failed (exit {proc.returncode}); see {path}:\n" + path.read_text()[-3000:]
            )
        return time.perf_counter() - t0

    def base_dir(self, seed: int, domain: str = "countdown", warm: str = "") -> Path:
        return self.work / ("base_sql" if domain == "sql" else f"base_{warm}" if warm else "base") / f"s{seed}"

    def prepare(
        self, base_seeds: list[int], sql_seeds: list[int], warms: tuple[str, ...] = ("",), cache: bool = True
    ) -> None:
        """Data, one warm start per base seed and recipe (two at a time), and each base's reference cache (``cache``)."""
        self.lit("demo-data", "--out_dir", str(DATA), log="prepare")

        def warm(seed: int, domain: str, recipe: str = "") -> None:
            # the SQL base: SQL + addition, 200 steps (measured: SQL pass@1 0.42 / pass@16 0.98 on sql_val)
            extra = (
                ["--countdown_share", "0.0", "--sql_share", "0.5", "--steps", "200"]
                if domain == "sql"
                else WARMSTARTS[recipe]
            )
            base = self.base_dir(seed, domain, recipe)
            if (base / "model.safetensors").exists() and (not cache or (base / "ref_cache" / "manifest.json").exists()):
                return  # made by an earlier run of the study (or copied from one that ran the same command)
            if not (base / "model.safetensors").exists():
                self.lit(
                    "warmstart",
                    "--config",
                    "configs/demo/warmstart.yaml",
                    "--out_dir",
                    str(base),
                    "--seed",
                    str(seed),
                    "--progress_bar",
                    "false",
                    *extra,
                    log=f"warmstart_{domain}{recipe and '_' + recipe}_s{seed}",
                )
            if cache:
                config = "configs/demo/cache.yaml" if domain == "countdown" else "configs/demo/sql_cache.yaml"
                self.lit(
                    "cache",
                    "--config",
                    config,
                    f"--policy.path={base}",
                    f"--data.cache.path={base / 'ref_cache'}",
                    "--progress=false",
                    log=f"cache_{domain}{recipe and '_' + recipe}_s{seed}",
                )

        self.parallel(
            [lambda s=s, w=w: warm(s, "countdown", w) for w in warms for s in base_seeds]
            + [lambda s=s: warm(s, "sql") for s in sql_seeds]
        )

    def parallel(self, tasks: list) -> None:
        """Run callables ``self.slots`` at a time; re-raise the first failure after all finished."""
        errors, pending, lock = [], list(tasks), threading.Lock()

        def worker():
            while True:
                self.wait_while_paused()
                with lock:
                    if not pending:
                        return
                    task = pending.pop(0)
                    if self.past_deadline():
                        self.skipped.append(getattr(task, "label", "a job"))
                        continue
                try:
                    task()
                except Exception as err:  # keep the other slot going, report at the end
                    errors.append(err)

        threads = [threading.Thread(target=worker) for _ in range(self.slots)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def past_deadline(self) -> bool:
        return self.deadline is not None and datetime.now(UTC) >= self.deadline

    def wait_while_paused(self) -> None:
        """Block while the pause file exists (checked every ``poll`` seconds), saying so once."""
        said = False
        while self.pause is not None and self.pause.exists():
            if not said:
                print(f"  paused: {self.pause} exists; no new job starts until it is removed", flush=True)
                said = True
            time.sleep(self.poll)

    def done_labels(self) -> set[str]:
        return {r["label"] for r in self.records()}

    def validate(
        self, label: str, model: Path, seed: int, domain: str, counts: Path | None, out_counts: Path | None
    ) -> None:
        """Validate ``model`` on the domain's sets (countdown: selection, held-out, addition; sql: sql_val, addition)."""
        extra = [f"--model.evaluation.retention_reference={counts}"] if counts else [f"--pass_counts.path={out_counts}"]
        self.lit(
            "validate",
            "--config",
            "configs/demo/base.yaml",
            "--config",
            "configs/demo/record.yaml",
            *self.configs(domain)[2:],
            f"--trainer.callbacks.init_args.path={self.metrics}",
            f"--trainer.callbacks.init_args.label={label}",
            f"--model.policy.path={model}",
            f"--model.sampling.seed={1000 + seed}",
            "--trainer.enable_progress_bar=false",
            *extra,
            *self.validate_flags,
            log=label.replace("/", "_"),
        )

    @staticmethod
    def configs(domain: str, method: str | None = None) -> list[str]:
        """The config files of a run: the demo's base, the domain's sets, the method."""
        files = [
            "configs/demo/base.yaml",
            "configs/demo/study_sets.yaml" if domain == "countdown" else "configs/demo/sql.yaml",
        ]
        files += [f"configs/demo/{method}.yaml"] if method else []
        return [arg for f in files for arg in ("--config", f)]

    def base_label(self, base_seed: int, seed: int, domain: str, warm: str = "") -> str:
        return f"{'sql_base' if domain == 'sql' else f'base_{warm}' if warm else 'base'}/b{base_seed}/s{seed}"

    def counts_path(self, base_seed: int, seed: int, domain: str, warm: str = "") -> Path:
        return self.work / "counts" / f"{domain}{warm and '_' + warm}_b{base_seed}_s{seed}.json"

    def ensure_base_validation(self, jobs: list[Job]) -> None:
        wanted = sorted({(j.base_seed, j.seed, j.domain, j.warm) for j in jobs})
        done = self.done_labels()
        tasks = []
        for b, s, domain, w in wanted:
            label = self.base_label(b, s, domain, w)
            if label not in done:
                path = self.counts_path(b, s, domain, w)
                path.parent.mkdir(parents=True, exist_ok=True)
                tasks.append(
                    lambda b=b, s=s, d=domain, w=w, label=label, path=path: self.validate(
                        label, self.base_dir(b, d, w), s, d, None, path
                    )
                )
        self.parallel(tasks)

    def run(self, jobs: list[Job]) -> None:
        """Validate the bases the jobs need, then fit + validate every job not already recorded."""
        self.ensure_base_validation(jobs)
        done = self.done_labels()
        self.parallel([_labelled(lambda j=j: self.run_job(j), j.label) for j in jobs if j.label not in done])

    def run_dir(self, job: Job) -> Path:
        return self.work / "runs" / job.label.replace("/", "_")

    def fit_args(self, job: Job) -> list[str]:
        """The job's ``lit-rlvr fit`` arguments: configs, base, seeds, steps, the job's own flags, then the study's timer.

        The job's flags come before the timer is appended, so a flag addressing the configs' last
        callback (``--trainer.callbacks.init_args.…``, e.g. the Pass@k → Pass@1 switch) reaches it.
        """
        out, base = self.run_dir(job), self.base_dir(job.base_seed, job.domain, job.warm)
        cache = [f"--data.cache.path={base / 'ref_cache'}"] if job.method.startswith("dph") else []
        return [
            "fit",
            *self.configs(job.domain, job.method),
            f"--model.policy.path={base}",
            *cache,
            f"--seed_everything={job.seed}",
            f"--data.seed={job.seed}",
            f"--model.sampling.seed={job.seed}",
            f"--trainer.max_steps={job.steps}",
            f"--export.dirpath={out / 'hf'}",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={out}",
            "--trainer.logger=false",
            "--trainer.limit_val_batches=0",
            *job.overrides,
            "--trainer.callbacks+=diversity_collapse.FitTimer",
            f"--trainer.callbacks.init_args.path={out / 'timer.json'}",
        ]

    def run_job(self, job: Job) -> None:
        out = self.run_dir(job)
        timer = out / "timer.json"
        seconds = self.lit(*self.fit_args(job), log=job.label.replace("/", "_"))
        self.validate(
            job.label,
            out / "hf",
            job.seed,
            job.domain,
            self.counts_path(job.base_seed, job.seed, job.domain, job.warm),
            None,
        )
        timing = {"label": job.label, "wall_seconds": round(seconds, 1), **json.loads(timer.read_text())}
        with self.log_lock, self.timings.open("a") as f:
            f.write(json.dumps(timing) + "\n")
        print(f"  {job.label}: {timing['train_seconds']:.0f} s training, {timing['steps']} steps", flush=True)

    # ------------------------------------------------------------------ reading
    def records(self) -> list[dict]:
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    def times(self) -> dict[str, dict]:
        if not self.timings.exists():
            return {}
        return {
            t["label"]: t for t in (json.loads(line) for line in self.timings.read_text().splitlines() if line.strip())
        }


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


# ---------------------------------------------------------------------------- the presets


# The budget preset (benchmarks/results/study_plan.md, amendment written before its runs): one
# factor at a time around the paper's coverage, seed 0 only.
BUDGET_ABLATION = (
    "thr6_exp_correct_eta1",
    "thr4_exp_correct_eta1",
    "thr8_exp_correct_eta1",
    "thr4_all_correct_eta1",
    "thr6_exp_all_eta1",
    "thr6_exp_correct_eta2",
)


def ablation_jobs(seeds=(0, 1), names=tuple(ABLATION)) -> list[Job]:
    return [Job(name, "dph_f", 0, s, ABLATION[name]) for name in names for s in seeds]


def choose_dph(
    study: Study,
    candidates: dict[str, list[str]] = ABLATION,
    base: str = "base",
    blocks: set[tuple[str, str]] | None = None,
) -> tuple[str, list[str], list[str]]:
    """The written-down rule (module docstring), on the selection split only; returns (name, flags, reasons).

    ``candidates``: name → flags (study 1's ``ABLATION``; study 3's ``COVERAGE``); ``base``: the
    variant under which their base's validations are recorded (``base_ws200`` for study 3);
    ``blocks``: only the candidates' runs on these (base, seed) blocks count (study 3's part A: base 0 ×
    seeds 0, 1 — amendment 3 extends the chosen candidate to every block afterwards).
    """
    by = group(study.records())
    if blocks is not None:
        by = in_blocks(by, blocks, candidates)
    # the base's validations with the candidates' seeds only ("base 0, same validation seeds"): the
    # robust part validates base 0 with more seeds, which must not move the threshold afterwards
    seeds = {r["label"].split("/")[2] for name in candidates for r in by.get(name, [])}
    base1 = mean(
        [
            r[f"val/{SELECT}/pass@1"]
            for r in by.get(base, [])
            if r["label"].split("/")[1] == "b0" and r["label"].split("/")[2] in seeds
        ]
    )
    rows, lines = [], []
    for name in candidates:
        rs = by.get(name, [])
        if not rs:
            continue
        p1, p16 = mean([r[f"val/{SELECT}/pass@1"] for r in rs]), mean([r[f"val/{SELECT}/pass@16"] for r in rs])
        rows.append((name, p1, p16))
        lines.append(f"| {name} | {len(rs)} | {p1:.3f} | {p16:.3f} | {'yes' if p1 >= base1 + 0.04 else 'no'} |")
    qualified = [r for r in rows if r[1] >= base1 + 0.04]
    best = max(qualified, key=lambda r: (r[2], r[1])) if qualified else max(rows, key=lambda r: r[1] + r[2])
    why = (
        f"highest selection pass@16 ({best[2]:.3f}) among configurations with selection pass@1 >= base {base1:.3f} + 0.04"
        if qualified
        else f"no configuration reached selection pass@1 >= base {base1:.3f} + 0.04: highest pass@1 + pass@16"
    )
    table = [
        "| configuration | seeds | selection pass@1 | selection pass@16 | pass@1 >= base + 0.04 |",
        "|---|---|---|---|---|",
        *lines,
    ]
    return best[0], candidates[best[0]], [why, *table]


def robust_jobs(dph_flags: list[str], bases=(0, 1), seeds=(0, 1, 2), schedule: bool = True) -> list[Job]:
    variants = [("grpo", "grpo", []), ("dph_f", "dph_f", dph_flags), ("passk", "passk", [])]
    variants += [("passk_then_pass1", "passk_then_pass1", [])] if schedule else []
    return [Job(v, m, b, s, f) for v, m, f in variants for b in bases for s in seeds]


def pareto_jobs(dph_flags: list[str], seeds=(0, 1), schedule: bool = False) -> list[Job]:
    """The knobs' other values (their robust-preset value is the robust run); ``schedule``: Pass@k → Pass@1 too."""
    coverage = [f for f in dph_flags if not f.startswith("--model.anchor.coef")]
    chosen = next((f.split("=")[1] for f in dph_flags if f.startswith("--model.anchor.coef")), "1.0")
    etas = [e for e in ("0.5", "1.0", "2.0") if float(e) != float(chosen)][:2]
    jobs = [
        Job(f"grpo_lr{lr}", "grpo", 0, s, [f"--model.optimizer.init_args.lr={lr}"])
        for lr in ("1.0e-4", "4.0e-4")
        for s in seeds
    ]
    jobs += [
        Job(f"dph_f_eta{eta}", "dph_f", 0, s, [*coverage, f"--model.anchor.coef={eta}"]) for eta in etas for s in seeds
    ]
    jobs += [
        Job(f"dph_js_eta{eta}", "dph_js", 0, s, [*coverage, f"--model.anchor.coef={eta}"])
        for eta in ("2.0", "4.0", "8.0")
        for s in seeds
    ]
    jobs += [
        Job(f"passk_k{k}", "passk", 0, s, [f"--model.loss.advantage_options={{k: {k}}}"]) for k in (2, 8) for s in seeds
    ]
    jobs += [Job("passk_then_pass1", "passk_then_pass1", 0, s) for s in seeds] if schedule else []
    return jobs


# The entropy and diversity methods (docs/methods.md §8): config, the flags of its one main knob at
# a value, and the knob's sweep (the config's own value first: its runs are the variant named after
# the method; the others are <method>_<value>). PSR and NSR have no knob.
def _options(key: str, template: str):
    return lambda v: [f"--model.{key}={{{template.format(v=v)}}}"]


METHODS = {
    "clip_cov": (
        _options("loss.policy_loss_options", "clip_cov_ratio: {v}, clip_cov_lb: 1.0, clip_cov_ub: 5.0"),
        ["0.02", "0.005", "0.05"],
    ),
    "kl_cov": (_options("loss.policy_loss_options", "kl_cov_ratio: {v}, ppo_kl_coef: 1.0"), ["0.02", "0.005", "0.05"]),
    "forking_tokens": (_options("loss.token_mask_options", "top_entropy_quantile: {v}"), ["0.2", "0.1", "0.5"]),
    "entropy_bonus": (_options("entropy.options", "entropy_coef: {v}"), ["0.01", "0.003", "0.03"]),
    "entropy_adaptive": (
        _options(
            "entropy.options",
            "entropy_coef: 0.0, entropy_target: {v}, entropy_coef_delta: 0.002, entropy_coef_max: 0.05",
        ),
        ["0.3", "0.2", "0.4"],
    ),
    "psr": (None, []),
    "nsr": (None, []),
    "w_reinforce": (_options("loss.advantage_options", "positive_advantage_weight: {v}"), ["0.1", "0.03", "0.3"]),
    "unlikeliness": (_options("loss.advantage_options", "rank_penalty: {v}"), ["0.25", "0.1", "0.5"]),
}

# Each method's expected direction against GRPO on held-out countdown (paired differences on the same
# base × seed), from its paper, written before any run of the methods preset: "+" above GRPO (95% CI
# above 0), "-" below (CI below 0), "=" not distinguishable (CI contains 0).
EXPECTED = {
    "clip_cov": {"pass@1": "+", "pass@16": "+"},  # Cui et al.: higher entropy and accuracy than GRPO
    "kl_cov": {"pass@1": "+", "pass@16": "+"},
    "forking_tokens": {"pass@1": "=", "pass@16": "+"},  # Wang et al.: on par at 8B, better at 14B/32B; entropy kept
    "entropy_bonus": {"pass@1": "=", "pass@16": "+"},  # Cui et al.: sensitive; keeps entropy when it works
    "entropy_adaptive": {
        "pass@1": "=",
        "pass@16": "+",
    },  # Skywork-OR1: entropy held near the target, no loss in accuracy
    "psr": {"pass@1": "=", "pass@16": "-"},  # Zhu et al.: PSR sharpens, pass@k at large k falls
    "nsr": {"pass@1": "=", "pass@16": "+"},  # Zhu et al.: NSR keeps pass@k over the whole k range
    "w_reinforce": {"pass@1": "=", "pass@16": "+"},
    "unlikeliness": {"pass@1": "=", "pass@16": "+"},  # He et al.: pass@N up, pass@1 kept
    # the baselines, added by study 3's plan (benchmarks/results/study3_plan.md) before its runs:
    # DAPO (arXiv 2503.14476): dynamic sampling reaches the accuracy sooner; its clip-higher is in this GRPO already
    "dapo": {"pass@1": "+", "pass@16": "="},
    # DPH-RL (arXiv 2509.07430), Llama-3.1-8B on Spider, pass@1 / pass@16: GRPO 73.0 / 80.6, RKL 71.0 / 80.6,
    # DPH-F 77.4 / 85.7, DPH-JS 76.0 / 84.1
    "rkl": {"pass@1": "-", "pass@16": "="},
    "dph_f": {"pass@1": "+", "pass@16": "+"},
    "dph_js": {"pass@1": "+", "pass@16": "+"},
    # Pass@k Training (arXiv 2508.10751): pass@k up without hurting pass@1; Eq. 18's mix keeps that exploration;
    # "P@k T. + P@1 T." on Enigmata 30.8 / 40.6 (pass@1 / pass@k) vs Pass@1 training's 12.9 / 21.3
    "passk": {"pass@1": "=", "pass@16": "+"},
    "passk_combined": {"pass@1": "=", "pass@16": "+"},
    "passk_then_pass1": {"pass@1": "+", "pass@16": "+"},
}


def _switch(step: str) -> list[str]:
    """Pass@k → Pass@1 switching at ``step`` (the phases of configs/demo/passk_then_pass1.yaml, its last callback)."""
    return [
        f"--trainer.callbacks.init_args.phases=[{{start_step: 0, advantage: passk, options: {{k: 4}}}}, "
        f"{{start_step: {step}, advantage: grpo, options: {{std: population}}}}]"
    ]


# The baselines' one main knob, as METHODS (study 3's part C; the config's value first)
BASELINE_KNOBS = {
    "grpo": (lambda v: [f"--model.optimizer.init_args.lr={v}"], ["1e-4", "5e-5", "2e-4"]),
    "dapo": (lambda v: [f"--model.loss.clip_high={v}"], ["0.28", "0.2", "0.4"]),
    "rkl": (lambda v: [f"--model.kl.coef={v}"], ["0.05", "0.01", "0.2"]),
    "dph_f": (lambda v: [f"--model.anchor.coef={v}"], ["1.0", "0.5", "2.0"]),
    "dph_js": (lambda v: [f"--model.anchor.coef={v}"], ["4.0", "2.0", "8.0"]),
    "passk": (_options("loss.advantage_options", "k: {v}"), ["4", "2", "8"]),
    "passk_combined": (_options("loss.advantage_options", "k: {v}"), ["4", "2", "8"]),
    "passk_then_pass1": (_switch, ["80", "40", "120"]),
}
KNOBS = {**BASELINE_KNOBS, **METHODS}
KNOB_NAMES = {
    "grpo": "lr",
    "dapo": "clip_high",
    "rkl": "β",
    "dph_f": "η",
    "dph_js": "η",
    "passk": "k",
    "passk_combined": "k",
    "passk_then_pass1": "switch step",
    "clip_cov": "clip_cov_ratio",
    "kl_cov": "kl_cov_ratio",
    "forking_tokens": "top_entropy_quantile",
    "entropy_bonus": "entropy_coef",
    "entropy_adaptive": "entropy_target",
    "w_reinforce": "λ",
    "unlikeliness": "rank_penalty",
}
NAMES = {
    "grpo": "GRPO",
    "dapo": "DAPO",
    "rkl": "RKL",
    "dph_f": "DPH-F",
    "dph_js": "DPH-JS",
    "passk": "Pass@k",
    "passk_combined": "Pass@k combined",
    "passk_then_pass1": "Pass@k → Pass@1",
    "clip_cov": "Clip-Cov",
    "kl_cov": "KL-Cov",
    "forking_tokens": "forking tokens",
    "entropy_bonus": "entropy bonus",
    "entropy_adaptive": "adaptive entropy",
    "psr": "PSR",
    "nsr": "NSR",
    "w_reinforce": "W-REINFORCE",
    "unlikeliness": "unlikeliness",
    "max_rl": "MaxRL",
}


def sweep_variants(method: str) -> list[str]:
    """The variants of ``method``'s sweep, by knob value (the config's value is the variant ``method``).

    Example:
        >>> sweep_variants("w_reinforce"), sweep_variants("nsr"), sweep_variants("grpo")
        (['w_reinforce_0.03', 'w_reinforce', 'w_reinforce_0.3'], ['nsr'], ['grpo_5e-5', 'grpo', 'grpo_2e-4'])
    """
    values = KNOBS[method][1]
    return [v for _, v in sorted((float(x), f"{method}_{x}" if i else method) for i, x in enumerate(values))] or [
        method
    ]


def methods_jobs(bases=(0, 1), seeds=(0, 1, 2), sweep_seeds=(0, 1)) -> list[Job]:
    """GRPO and every method at its config's setting on ``bases`` × ``seeds``; the knobs' other values on base 0."""
    jobs = [Job(m, m, b, s) for m in ("grpo", *METHODS) for b in bases for s in seeds]
    for method, (flags, values) in METHODS.items():
        jobs += [Job(f"{method}_{v}", method, 0, s, flags(v)) for v in values[1:] for s in sweep_seeds]
    return jobs


def sign_seen(diffs: list[float]) -> str:
    """Study 3's rule: ``+`` when the 95% t-interval of the mean lies above 0, ``-`` below, ``=`` when it contains 0
    (or when one value gives no interval).

    Example:
        >>> sign_seen([0.05, 0.06, 0.07]), sign_seen([-0.05, 0.06, 0.07]), sign_seen([-0.05, -0.06, -0.07]), sign_seen([0.1])
        ('+', '=', '-', '=')
    """
    m, h = mean(diffs), ci(diffs)
    return "=" if math.isnan(h) or m - h <= 0 <= m + h else ("+" if m > 0 else "-")


def direction_check(by: dict, variant: str, k: int, want: str | None, label: str, against: str = "grpo") -> str:
    """The held-out pass@k difference ``variant`` − ``against`` over the pairs on the same base × seed, the sign
    :func:`sign_seen` gives and, when ``want`` (the allowed signs, e.g. ``"+="``) is given, MET or MISS."""
    diffs = paired(by, variant, f"val/{HELD_OUT}/pass@{k}", against)
    if not diffs:
        return f"- {label} pass@{k}: not run"
    return sign_line(diffs, f"{label} pass@{k} − {NAMES.get(against, against)}", want)


def sign_line(diffs: list[float], subject: str, want: str | None, pairs: str = "paired runs") -> str:
    """``- subject: mean ± CI over n pairs (worst …); `` then the sign :func:`sign_seen` gives and, when
    ``want`` (the allowed signs) is given, MET or MISS.

    Example:
        >>> sign_line([0.05, 0.06, 0.07], "DPH-F pass@16 − GRPO", "+")
        '- DPH-F pass@16 − GRPO: 0.060 ± 0.025 over 3 paired runs (worst +0.050); expected +, seen +: MET'
    """
    seen = sign_seen(diffs)
    line = f"- {subject}: {fmt(diffs)} over {len(diffs)} {pairs} (worst {min(diffs):+.3f}); "
    if want is None:
        return line + f"seen {seen} (no direction pre-registered)"
    return line + f"expected {' or '.join(want)}, seen {seen}: {'MET' if seen in want else 'MISS'}"


def verdict(parts: list[str], names: list[str]) -> str:
    """A hypothesis from its parts' lines (:func:`sign_line`; ``names``: each part's name): HELD, MISSED
    naming the parts that missed, or not run.

    Example:
        >>> verdict(["- a: … expected +, seen +: MET", "- b: … expected +, seen =: MISS"], ["pass@1", "pass@16"])
        'MISSED (pass@16 missed)'
    """
    missed = [n for n, p in zip(names, parts) if p.endswith("MISS")]
    return (
        "not run"
        if any(p.endswith("not run") for p in parts)
        else f"MISSED ({', '.join(missed)} missed)"
        if missed
        else "HELD"
    )


def expectation_check(by: dict, method: str, k: int, variant: str | None = None) -> str:
    """One pre-registered expectation against the paired differences to GRPO: MET or a miss, with the numbers
    (``variant``: the runs read, when not the method's own, e.g. DPH-F at part A's coverage)."""
    label = f"{method} ({variant})" if variant else method
    return direction_check(by, variant or method, k, EXPECTED[method][f"pass@{k}"], label)


def methods_section(by: dict, study: Study, preset: str) -> list[str]:
    """The methods preset's report: Pareto plot, table, paired differences against GRPO, seconds per step."""
    variants = [v for m in METHODS for v in sweep_variants(m) if v in by]
    stem = "study" if preset == "study" else f"study_{preset}"
    name = f"{stem}_pareto.png" if preset == "methods" else f"{stem}_methods_pareto.png"
    methods_pareto_plot(by, RESULTS / name)
    times = study.times()
    per_step = ["| variant | runs | training seconds per step |", "|---|---|---|"]
    for v in ["grpo", *variants]:
        ts = [times[r["label"]] for r in by.get(v, []) if r["label"] in times and times[r["label"]]["steps"]]
        if ts:
            per_step.append(f"| {v} | {len(ts)} | {fmt([t['train_seconds'] / t['steps'] for t in ts], 3)} |")
    return [
        "\n## Entropy and diversity methods (docs/methods.md §8) against GRPO\n",
        f"![methods]({name})\n",
        *summary_table(by, ["grpo", *variants], [HELD_OUT, OOD]),
        "\n### Expected directions (pre-registered in benchmarks/diversity_collapse.py EXPECTED) and what was seen\n",
        *[expectation_check(by, m, k) for m in METHODS for k in (1, 16)],
        "\n### Training seconds per step (wall-clock of the training loop / optimizer steps)\n",
        *per_step,
    ]


def methods_pareto_plot(by: dict, out: Path) -> None:
    """pass@1 (x) vs pass@16 (y) on base 0, one line per method over its knob (sorted by value), GRPO and the base as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    curves = [("base", ["base"]), ("GRPO", ["grpo"]), *[(m, sweep_variants(m)) for m in METHODS]]
    for ax, (s, title) in zip(axes, ((HELD_OUT, "held-out countdown (in-domain)"), (OOD, "addition (out-of-domain)"))):
        pareto_curves(ax, by, curves, s, stars=("base", "GRPO"))
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.suptitle("pass@1 vs pass@16 on base 0, each method over its knob (mean ± 95% CI over RL seeds)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def pareto_point(rs: list[dict], s: str) -> tuple[float, float, float, float] | None:
    """(mean pass@1, mean pass@16, their 95% CI half-widths, 0 for a single run) of the records ``rs`` on set ``s``."""
    rs = [r for r in rs if f"val/{s}/pass@16" in r]
    if not rs:
        return None
    a, b = [r[f"val/{s}/pass@1"] for r in rs], [r[f"val/{s}/pass@16"] for r in rs]
    return mean(a), mean(b), 0 if math.isnan(ci(a)) else ci(a), 0 if math.isnan(ci(b)) else ci(b)


def pareto_curves(
    ax, by: dict, curves: list[tuple[str, list[str]]], s: str, bases=("b0",), stars=(), styles: dict | None = None
) -> None:
    """One line per ``(label, variants)`` through the variants' points (runs on ``bases``), CIs as error bars.

    ``styles``: label → matplotlib keywords (colour, marker) so that a method looks the same in every panel.
    """
    for label, variants in curves:
        points = [
            p
            for v in variants
            if (p := pareto_point([r for r in by.get(v, []) if r["label"].split("/")[1] in bases], s))
        ]
        if points:
            xs, ys, xe, ye = zip(*points)
            style = {
                "marker": "*" if label in stars else "o",
                "markersize": 10 if label in stars else 5,
                **(styles or {}).get(label, {}),
            }
            ax.errorbar(xs, ys, xerr=xe, yerr=ye, capsize=3, label=label, **style)
    ax.set_xlabel("pass@1")
    ax.set_ylabel("pass@16")
    ax.grid(alpha=0.3)


def wallclock_jobs(
    study: Study, dph_flags: list[str], seeds=(0, 1, 2), methods=("dph_f", "passk"), warm: str = ""
) -> list[Job]:
    """``methods`` (DPH-F and Pass@k in study 1) stopped at GRPO's median training seconds (base 0), no step limit."""
    grpo = [t["train_seconds"] for label, t in study.times().items() if label.startswith("grpo/b0/")]
    if not grpo:
        raise RuntimeError("wallclock needs the robust preset's GRPO runs first")
    budget = int(statistics.median(grpo))
    limit = [f"--trainer.max_time=00:00:{budget // 60:02d}:{budget % 60:02d}"]
    return [
        Job(f"{m}_time{budget}s", m, 0, s, [*method_flags(m, dph_flags), *limit], steps=100_000, warm=warm)
        for m in methods
        for s in seeds
    ]


def method_flags(method: str, dph_flags: list[str]) -> list[str]:
    """The flags a method runs with beyond its config: DPH-F the chosen anchor, DPH-JS its coverage (η its own)."""
    if method == "dph_f":
        return list(dph_flags)
    if method == "dph_js":
        return [f for f in dph_flags if not f.startswith("--model.anchor.coef")]
    return []


def sql_jobs(dph_flags: list[str], seeds=(0, 1, 2)) -> list[Job]:
    return [
        Job(f"sql_{v}", m, 0, s, f, steps=80, domain="sql")
        for v, m, f in (("grpo", "grpo", []), ("dph_f", "dph_f", dph_flags), ("passk", "passk", []))
        for s in seeds
    ]


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


# ---------------------------------------------------------------------------- study 3: every method in study 2's regime

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


def step_seconds(times: dict[str, dict], variant: str, bases=("b0",)) -> list[float]:
    """Training seconds per optimizer step of ``variant``'s runs on ``bases``."""
    return [
        t["train_seconds"] / t["steps"]
        for label, t in times.items()
        if label.split("/")[0] == variant and label.split("/")[1] in bases and t["steps"]
    ]


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


def block_of(record: dict) -> tuple[str, str]:
    """(base, seed) of a record's label ``variant/b<base>/s<seed>``."""
    _, b, s = record["label"].split("/")
    return b, s


def in_blocks(by: dict, blocks, variants=None) -> dict:
    """``by`` with the records of ``variants`` (every variant when None) kept only on the (base, seed) ``blocks``."""
    return {
        v: [r for r in rs if variants is not None and v not in variants or block_of(r) in blocks]
        for v, rs in by.items()
    }


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


def cell(values: list[float], digits: int = 3, signed: bool = False) -> str:
    """``mean ± 95% CI (worst)``, the worst being the lowest value; ``signed``: differences, shown with their sign."""
    if not values:
        return "–"
    sign = "+" if signed else ""
    m, h = mean(values), ci(values)
    if len(values) < 2:
        return f"{m:{sign}.{digits}f}"
    return f"{m:{sign}.{digits}f} ± {h:.{digits}f} ({min(values):{sign}.{digits}f})"


STUDY3_COLUMNS = [
    (f"val/{HELD_OUT}/pass@1", "held-out pass@1", 3),
    (f"val/{HELD_OUT}/pass@16", "held-out pass@16", 3),
    (f"val/{HELD_OUT}/pass@32", "held-out pass@32", 3),
    (f"val/{HELD_OUT}/distinct_correct_answers", "distinct correct", 2),
    (f"val/{OOD}/pass@1", "OOD addition pass@1", 3),
]


def paired(by: dict, variant: str, key: str, against: str = "grpo") -> list[float]:
    """``variant`` − ``against`` on the same base × seed, for every pair that has ``key``."""
    other = {tuple(r["label"].split("/")[1:]): r for r in by.get(against, [])}
    return [
        r[key] - o[key]
        for r in by.get(variant, [])
        if (o := other.get(tuple(r["label"].split("/")[1:]))) and key in r and key in o
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


def load_notes(study: Study) -> list[str]:
    """``load_notes.txt`` of the work folder, written by whoever ran other work on the machine during the study:
    which runs shared the cores with it (their seconds are not comparable with the others')."""
    path = study.work / "load_notes.txt"
    return ["", *(f"Load: {line}" for line in path.read_text().splitlines() if line.strip())] if path.exists() else []


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
    seconds = study.work / "seconds.txt"
    sections = [
        "# Study 3: every method side by side in the regime where GRPO clearly raises pass@1\n",
        "Plan, rule and expected directions committed before these runs: [`study3_plan.md`](study3_plan.md). Command: "
        "`python benchmarks/diversity_collapse.py --preset study3`; every record in `"
        + _shown(study.metrics)
        + "`, each run's "
        "`lit-rlvr` commands in `"
        + _shown(study.work / "logs")
        + "`"
        + (
            " (wall time of the script, seconds: " + ", ".join(seconds.read_text().split("\n")[:-1]) + ")"
            if seconds.exists()
            else ""
        )
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


# ---------------------------------------------------------------------------- study 4: MaxRL beside GRPO, DPH-F and Pass@k


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


@dataclass(frozen=True)
class Hypothesis:
    """A direction written before the runs: ``variant`` − ``against`` paired on base × seed, judged by
    :func:`sign_seen`; ``allowed`` maps what is compared (study 4: k of held-out pass@k; study 5,
    benchmarks/tool_use.py: a metric's name) to the signs that count as MET."""

    name: str
    variant: str
    against: str
    allowed: dict[int, str] | dict[str, str]
    source: str


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


def study4_runs_table(by: dict, base: str, blocks: list[tuple[str, str]]) -> list[str]:
    """One row per base × seed: held-out pass@1 / pass@16 of the base and of every arm."""
    lines = [
        "| base × seed | base | " + " | ".join(NAMES[m] for m in STUDY4_METHODS) + " |",
        "|---|---|" + "---|" * len(STUDY4_METHODS),
    ]
    for b, s in blocks:
        cells = []
        for v in (base, *STUDY4_METHODS):
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


def study4_pareto_plot(by: dict, out: Path, base: str, title: str) -> None:
    """Left: held-out pass@1 vs pass@16 per arm (mean ± 95% CI, its runs as dots); right: the paired differences
    against GRPO with their CIs, the quadrant where an arm Pareto-dominates GRPO shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p1, p16 = f"val/{HELD_OUT}/pass@1", f"val/{HELD_OUT}/pass@16"
    colours = {"base": "black", **{m: plt.cm.tab10(i) for i, m in enumerate(STUDY4_METHODS)}}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    for v, name in ((base, "base"), *((m, NAMES[m]) for m in STUDY4_METHODS)):
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
    seconds = study.work / "seconds.txt"
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
        + (
            " (wall time of each invocation, seconds: " + ", ".join(seconds.read_text().split("\n")[:-1]) + ")"
            if seconds.exists()
            else ""
        )
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


# ---------------------------------------------------------------------------- statistics


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def ci(values: list[float]) -> float:
    """Half-width of the two-sided 95% t-interval of the mean (nan below 2 values)."""
    if len(values) < 2:
        return math.nan
    return T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def group(records: list[dict]) -> dict[str, list[dict]]:
    """Records by variant (the label's first part); the base's validations under ``base``/``sql_base``."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        out[r["label"].split("/")[0]].append(r)
    return out


def deltas(records: list[dict], bases: dict[tuple[str, str], dict], key: str) -> list[float]:
    """Per run, ``key`` minus the same base (and validation seed)'s value."""
    out = []
    for r in records:
        _, b, s = r["label"].split("/")
        base = bases.get((b, s))
        if base is not None and key in r and key in base:
            out.append(r[key] - base[key])
    return out


def fmt(values: list[float], digits: int = 3) -> str:
    if not values:
        return "–"
    m, h = mean(values), ci(values)
    return f"{m:.{digits}f}" if math.isnan(h) else f"{m:.{digits}f} ± {h:.{digits}f}"


def summary_table(by: dict, variants: list[str], sets: list[str], base_key: str = "base") -> list[str]:
    lines = []
    for s in sets:
        lines += [
            f"\n**{s}** (mean ± 95% CI over runs; worst = the lowest run)\n",
            "| variant | runs | "
            + " | ".join(f"pass@{k}" for k in KS)
            + " | worst pass@1 | worst pass@16 | distinct correct | retention@32 |",
            "|---|---|" + "---|" * (len(KS) + 4),
        ]
        for v in [base_key, *variants]:
            rs = [r for r in by.get(v, []) if f"val/{s}/pass@1" in r]
            if not rs:
                continue
            cells = [fmt([r[f"val/{s}/pass@{k}"] for r in rs if f"val/{s}/pass@{k}" in r]) for k in KS]
            worst1 = min(r[f"val/{s}/pass@1"] for r in rs)
            worst16 = min(r.get(f"val/{s}/pass@16", math.nan) for r in rs)
            cells += [
                f"{worst1:.3f}",
                f"{worst16:.3f}",
                fmt([r[f"val/{s}/distinct_correct_answers"] for r in rs], 2),
                fmt([r[f"val/{s}/retention/pass@32"] for r in rs if f"val/{s}/retention/pass@32" in r]),
            ]
            lines.append(f"| {v} | {len(rs)} | " + " | ".join(cells) + " |")
    return lines


def targets(by: dict) -> list[str]:
    """Issue 16's targets on held-out countdown (means over every base × seed; deltas to each run's own base)."""
    bases = {tuple(r["label"].split("/")[1:]): r for r in by.get("base", [])}
    d = lambda v, key: deltas(by.get(v, []), bases, key)  # noqa: E731
    p1, p16 = f"val/{HELD_OUT}/pass@1", f"val/{HELD_OUT}/pass@16"
    ood = f"val/{OOD}/pass@1"

    def check(name: str, ok: bool | None, detail: str) -> str:
        return f"- {name}: {'MET' if ok else 'not met' if ok is not None else 'not run'} — {detail}"

    out = []
    g1, g16 = d("grpo", p1), d("grpo", p16)
    out.append(
        check(
            "GRPO pass@16 ≥ 0.10 below the base with pass@1 ≥ 0.06 above",
            (mean(g16) <= -0.10 and mean(g1) >= 0.06) if g1 else None,
            f"Δpass@1 {fmt(g1)}, Δpass@16 {fmt(g16)}",
        )
    )
    f1, f16 = d("dph_f", p1), d("dph_f", p16)
    out.append(
        check(
            "DPH-F keeps pass@16 within 0.03 of the base with pass@1 ≥ +0.04",
            (mean(f16) >= -0.03 and mean(f1) >= 0.04) if f1 else None,
            f"Δpass@1 {fmt(f1)}, Δpass@16 {fmt(f16)}",
        )
    )
    for v in ("passk", "passk_then_pass1"):
        k1, k16 = d(v, p1), d(v, p16)
        out.append(
            check(
                f"{v}: pass@16 ≥ base − 0.03 with pass@1 ≥ base + 0.06",
                (mean(k16) >= -0.03 and mean(k1) >= 0.06) if k1 else None,
                f"Δpass@1 {fmt(k1)}, Δpass@16 {fmt(k16)}",
            )
        )
    go, fo = [r[ood] for r in by.get("grpo", [])], [r[ood] for r in by.get("dph_f", [])]
    separated = bool(go and fo) and mean(fo) - ci(fo) > mean(go) + ci(go)
    out.append(
        check(
            "DPH-F forgets less OOD (addition pass@1) than GRPO, CIs not overlapping",
            separated if go else None,
            f"DPH-F {fmt(fo)} vs GRPO {fmt(go)}",
        )
    )
    grpo_by = {tuple(r["label"].split("/")[1:]): r for r in by.get("grpo", [])}
    for key, name in ((ood, "addition pass@1"), (p16, "held-out pass@16"), (p1, "held-out pass@1")):
        paired = [
            r[key] - grpo_by[tuple(r["label"].split("/")[1:])][key]
            for r in by.get("dph_f", [])
            if tuple(r["label"].split("/")[1:]) in grpo_by
        ]
        if paired:
            out.append(
                f"- supplementary, not a pre-registered criterion: DPH-F − GRPO {name} on the same base × seed: {fmt(paired)}, "
                f"worst {min(paired):+.3f}, DPH-F higher in {sum(d > 0 for d in paired)} of {len(paired)}"
            )
    return out


def pareto_plot(by: dict, out: Path, chosen_eta: float = 1.0) -> None:
    """pass@1 (x) vs pass@16 (y) per method, each a curve over its knob, CI bars; in-domain and OOD panels.

    ``chosen_eta``: the η of the chosen DPH-F setting, whose runs are the variant ``dph_f``.
    """
    dph_f = {
        "dph_f": chosen_eta,
        **{f"dph_f_eta{e}": float(e) for e in ("0.5", "1.0", "2.0") if float(e) != chosen_eta},
    }
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {
        "GRPO (lr 1e-4, 2e-4, 4e-4)": ["grpo_lr1.0e-4", "grpo", "grpo_lr4.0e-4"],
        "DPH-F (η 0.5, 1, 2)": sorted(dph_f, key=dph_f.get),
        "DPH-JS (η 2, 4, 8)": ["dph_js_eta2.0", "dph_js_eta4.0", "dph_js_eta8.0"],
        "Pass@k (k 2, 4, 8)": ["passk_k2", "passk", "passk_k8"],
        "Pass@k → Pass@1": ["passk_then_pass1"],
        "base": ["base"],
    }
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, (s, title) in zip(axes, ((HELD_OUT, "held-out countdown (in-domain)"), (OOD, "addition (out-of-domain)"))):
        for name, variants in curves.items():
            xs, ys, xe, ye = [], [], [], []
            for v in variants:
                rs = [r for r in by.get(v, []) if r["label"].split("/")[1] == "b0" and f"val/{s}/pass@16" in r]
                if not rs:
                    continue
                a, b = [r[f"val/{s}/pass@1"] for r in rs], [r[f"val/{s}/pass@16"] for r in rs]
                (
                    xs.append(mean(a)),
                    ys.append(mean(b)),
                    xe.append(0 if math.isnan(ci(a)) else ci(a)),
                    ye.append(0 if math.isnan(ci(b)) else ci(b)),
                )
            if xs:
                ax.errorbar(
                    xs,
                    ys,
                    xerr=xe,
                    yerr=ye,
                    marker="o" if name != "base" else "*",
                    markersize=10 if name == "base" else 6,
                    capsize=3,
                    label=name,
                )
        ax.set_xlabel("pass@1")
        ax.set_ylabel("pass@16")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("pass@1 vs pass@16 on base 0 (mean ± 95% CI over RL seeds)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def wallclock_table(by: dict, study: Study) -> list[str]:
    times = study.times()
    lines = [
        "| variant | runs | training seconds | steps | held-out pass@1 | held-out pass@16 | OOD pass@1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in sorted(k for k in by if k in ("grpo", "dph_f", "passk") or "_time" in k):
        rs = [r for r in by[v] if r["label"].split("/")[1] == "b0"]
        ts = [times[r["label"]] for r in rs if r["label"] in times]
        if not ts:
            continue
        lines.append(
            f"| {v} | {len(rs)} | {fmt([t['train_seconds'] for t in ts], 0)} | {fmt([t['steps'] for t in ts], 0)} | "
            f"{fmt([r[f'val/{HELD_OUT}/pass@1'] for r in rs])} | {fmt([r[f'val/{HELD_OUT}/pass@16'] for r in rs])} | "
            f"{fmt([r[f'val/{OOD}/pass@1'] for r in rs])} |"
        )
    return lines


# ---------------------------------------------------------------------------- main


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
            with (study.work / "seconds.txt").open("a") as f:
                f.write(f"{args.preset}{' --smoke' if args.smoke else ''} {time.perf_counter() - t0:.0f}\n")
        where = study.work if args.smoke else RESULTS
        write_study4_report(study, setting, where / "study4.md", where / "study4_pareto.png")
        return
    if args.preset == "study3":
        if not args.report_only:
            amended = {1: run_study3_amended, 2: run_study3_amendment2, 3: run_study3_amendment3}[args.amendment]
            amended(study) if args.deadline else run_study3(study)
            with (study.work / "seconds.txt").open("a") as f:
                f.write(f"{args.preset} {time.perf_counter() - t0:.0f}\n")
        write_study3_report(study)
        return
    if regime:
        if not args.report_only:
            run_regime(study, args.preset)
            with (study.work / "seconds.txt").open("a") as f:
                f.write(f"{args.preset} {time.perf_counter() - t0:.0f}\n")
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
        with (args.work / "seconds.txt").open("a") as f:
            f.write(f"{args.preset} {time.perf_counter() - t0:.0f}\n")
    write_report(study, args.preset)


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


def commands_section(study: Study, noun: str, shown: Callable[[str], bool]) -> list[str]:
    """A report's "Commands" section: the ``lit-rlvr fit`` line of the first recorded run of each variant
    ``shown`` keeps (``noun``: what the report calls a variant)."""
    firsts: dict[str, str] = {}
    for r in study.records():
        firsts.setdefault(r["label"].split("/")[0], r["label"])
    return [
        "\n## Commands\n",
        f"Each {noun}'s first run (the others differ only in `--model.policy.path`, the seeds and the output "
        "paths); every run's `lit-rlvr fit` and `validate` lines are in its log:\n",
        *fit_commands(study, [label for v, label in firsts.items() if shown(v)]),
    ]


def publish(sections: list[str], out: Path) -> None:
    """Write a report's sections to ``out`` (one per line) and print it."""
    body = "\n".join(sections) + "\n"
    out.write_text(body)
    print(body)


def fit_commands(study: Study, labels: list[str]) -> list[str]:
    """The ``lit-rlvr fit`` command line each run's log recorded (paths shown relative to the repository)."""
    out = []
    for label in labels:
        log = study.work / "logs" / f"{label.replace('/', '_')}.log"
        fits = (
            [line[2:] for line in log.read_text().splitlines() if line.startswith("$ lit-rlvr fit")]
            if log.exists()
            else []
        )
        if fits:
            out.append(f"- `{label}`: `{fits[-1].replace(str(ROOT) + os.sep, '')}`")
    return out


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


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def write_report(study: Study, preset: str) -> None:
    by = group(study.records())
    sections = [
        f"# The diversity-collapse study on the CPU demo (preset `{preset}`)\n",
        f"Command: `python benchmarks/diversity_collapse.py{'' if preset == 'study' else f' --preset {preset}'}`; "
        "every record in `"
        + _shown(study.metrics)
        + "`. Wall time (s) per run of the script: "
        + ", ".join((study.work / "seconds.txt").read_text().split("\n")[:-1])
        + ".\n"
        if (study.work / "seconds.txt").exists()
        else "",
    ]
    if any(v in by for v in ABLATION):
        name, _, why = choose_dph(study)
        sections += [
            "## 1. Choosing DPH-F's anchor on the selection split (rule fixed before the study)\n",
            "Rule: highest mean selection-split pass@16 among configurations whose mean selection pass@1 ≥ the base's + 0.04; "
            "else highest pass@1 + pass@16. Held-out sets are not read. Paper's coverage: "
            + ", ".join(sorted(PAPER_SETTINGS))
            + " (η is ours in every row).\n",
            *why[1:],
            f"\n**Chosen: `{name}`** — {why[0]}.\n",
            "Held-out results of every ablation configuration (not used by the rule):",
            *summary_table(by, list(ABLATION), [HELD_OUT, OOD]),
        ]
    if "grpo" in by:
        sections += [
            "\n## 2. Robustness: the chosen settings on every base × seed\n",
            *summary_table(by, ["grpo", "dph_f", "passk", "passk_then_pass1"], [HELD_OUT, OOD]),
            "\n### Targets (held-out countdown; Δ = a run minus its own base's validation with the same seed)\n",
            *targets(by),
        ]
    if any(k.startswith(("grpo_lr", "dph_js", "passk_k")) for k in by):
        chosen = choose_dph(study)[1] if any(v in by for v in ABLATION) else []
        eta = next((float(f.split("=")[1]) for f in chosen if f.startswith("--model.anchor.coef")), 1.0)
        pareto_plot(by, RESULTS / f"{'study' if preset == 'study' else f'study_{preset}'}_pareto.png", eta)
        variants = sorted(
            k
            for k in by
            if k.startswith(("grpo", "dph_f", "dph_js", "passk")) and "_time" not in k and k not in ABLATION
        )
        sections += [
            "\n## 3. pass@1 vs pass@16 (base 0)\n",
            f"![Pareto]({'study' if preset == 'study' else f'study_{preset}'}_pareto.png)\n",
            *summary_table(by, variants, [HELD_OUT, OOD]),
        ]
    if any("_time" in k for k in by):
        sections += [
            "\n## 4. Equal wall-clock (base 0): DPH-F and Pass@k stopped at GRPO's median training seconds\n",
            *wallclock_table(by, study),
        ]
    if any(m in by for m in METHODS):
        sections += methods_section(by, study, preset)
    if any(k.startswith("sql_") for k in by):
        sections += [
            "\n## 5. Text-to-SQL toy (real SQL reward; base warm-started on SQL + addition)\n",
            *summary_table(by, ["sql_grpo", "sql_dph_f", "sql_passk"], [SQL, OOD], base_key="sql_base"),
        ]
    superseded = study.work / "superseded_metrics.jsonl"
    if superseded.exists() and superseded.read_text().strip():
        labels = [json.loads(line)["label"] for line in superseded.read_text().splitlines() if line.strip()]
        sections += [
            "\n## Superseded runs\n",
            "The first pass through the later parts recomputed the choice after the robust part had validated base 0 "
            'with seeds 1 and 2 too, and averaged them into the threshold, against the rule\'s "same validation seeds" '
            "(the ablation's seed 0 only): it picked another configuration for these runs, which were then re-run with "
            "the rule's choice (the one the robust part used). Their records are kept in `"
            + _shown(superseded)
            + "`, not in any table above: "
            + ", ".join(f"`{label}`" for label in labels)
            + ".",
        ]
    body = "\n".join(sections) + "\n"
    name = "study" if preset == "study" else f"study_{preset}"
    (RESULTS / f"{name}.md").write_text(body)
    print(body)


if __name__ == "__main__":
    main()
