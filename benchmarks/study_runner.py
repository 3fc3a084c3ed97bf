"""The studies' runner (benchmarks/diversity_collapse.py, benchmarks/tool_use.py): jobs, the ``lit-rlvr``
processes that run them two at a time, the records they leave in a work folder, and the plumbing of the reports
(their Commands section, where they are written).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DATA = (
    ROOT / "artifacts" / "demo" / "data"
)  # the configs/demo files read it; `lit-rlvr demo-data` writes it, deterministically
SELECT, HELD_OUT, OOD, SQL = "countdown_select", "countdown_val", "addition_val", "sql_val"


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


def study_parser(description: str, name: str, smoke: str) -> argparse.ArgumentParser:
    """The command line every pre-registered study script shares: ``--work`` (default
    ``artifacts/<name>``, ``artifacts/<name>_smoke``), ``--slots``, ``--smoke`` (``smoke`` says what it
    runs), ``--report-only`` and ``--deadline`` (UTC)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--work", type=Path, default=None, help=f"work folder (default artifacts/{name}, artifacts/{name}_smoke)"
    )
    parser.add_argument("--slots", type=int, default=2, help="jobs at a time (one torch thread each)")
    parser.add_argument("--smoke", action="store_true", help=f"{smoke}; reports into --work")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument(
        "--deadline",
        type=lambda v: datetime.fromisoformat(v).replace(tzinfo=UTC),
        default=None,
        help="no job starts after this UTC time (e.g. 2026-12-07T12:00); those running finish, the report reads complete blocks",
    )
    return parser


def load_notes(study: Study) -> list[str]:
    """``load_notes.txt`` of the work folder, written by whoever ran other work on the machine during the study:
    which runs shared the cores with it (their seconds are not comparable with the others')."""
    path = study.work / "load_notes.txt"
    return ["", *(f"Load: {line}" for line in path.read_text().splitlines() if line.strip())] if path.exists() else []


def record_seconds(work: Path, invocation: str, t0: float) -> None:
    """Append one invocation of a study script and its wall seconds since ``t0`` (``time.perf_counter()``) to
    ``work``/seconds.txt, which the study's report quotes (:func:`seconds_note`)."""
    with (work / "seconds.txt").open("a") as f:
        f.write(f"{invocation} {time.perf_counter() - t0:.0f}\n")


def seconds_of(work: Path) -> list[str]:
    """The ``<invocation> <seconds>`` lines :func:`record_seconds` wrote to ``work``/seconds.txt (none without it)."""
    path = work / "seconds.txt"
    return path.read_text().split("\n")[:-1] if path.exists() else []


def seconds_note(work: Path, what: str = "each invocation") -> str:
    """`` (wall time of <what>, seconds: <invocation> <s>, …)`` from ``work``/seconds.txt, or ``""`` without it."""
    lines = seconds_of(work)
    return f" (wall time of {what}, seconds: " + ", ".join(lines) + ")" if lines else ""


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


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
