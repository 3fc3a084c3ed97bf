"""Scale-out on CPU: step time and rollout tokens/s of `lit-rlvr fit` with 1 vs 2 processes, same global batch.

    python benchmarks/scale_out.py            # hf and vllm engines, P=8 prompts × G=8 samples × T=32 per step
    python benchmarks/scale_out.py --quick    # hf only, fewer steps (< 2 minutes)

Each run goes through the CLI as a user would type it (``--trainer.devices=2
--trainer.strategy=ddp|fsdp2``). With 2 processes each rank gets P/2 prompts (the global batch is
the same), owns one engine (HF on the live policy, or vLLM through ``external_launcher``) and one
torch thread; with 1 process, one engine and 2 torch threads. A step is the gap between
consecutive ``on_train_batch_end`` on rank 0 (ranks are in lockstep); rollout tokens/s is the
tokens all ranks generated in a step over its rollout seconds (the slowest rank's). Medians
after dropping the first 2 steps; runs alternate. Writes ``benchmarks/results/scale_out.md``; the
last line is ``scale_out_step_ratio=<2-process / 1-process median step>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common  # benchmarks/common.py
from lightning import Callback


class StepTimer(Callback):
    """Per rank: step end times and the step's rollout tokens/seconds (JSON lines at ``path``.rank<r>)."""

    def __init__(self, path: str):
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        rollouts = batch.rollouts
        seconds = float(trainer.callback_metrics.get("rollout/seconds", float("nan")))
        with open(f"{self.path}.rank{trainer.global_rank}", "a") as f:
            f.write(
                json.dumps({"end": time.perf_counter(), "tokens": rollouts.num_tokens(), "rollout_s": seconds}) + "\n"
            )


def run(model_dir: Path, rows_file: str, work: Path, devices: int, strategy: str, engine: str, cfg) -> dict:
    out = work / f"{engine}-{strategy}-{devices}-{time.perf_counter_ns()}"
    engine_kwargs = {
        "dtype": "float32",
        "max_model_len": 256,
        "kv_cache_memory_bytes": 64 * 2**20,
        "enforce_eager": True,
    }
    config = {
        "imports": ["bench_reward"],
        "trainer": {
            "accelerator": "cpu",
            "devices": devices,
            "strategy": strategy if devices > 1 else "auto",
            "max_steps": cfg.steps + 2,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            "callbacks": [{"class_path": "scale_out.StepTimer", "init_args": {"path": str(out)}}],
        },
        "model": {
            "policy": {"path": str(model_dir)},
            "sampling": {"n": cfg.samples, "max_new_tokens": cfg.new_tokens, "seed": 0},
            "scoring": {"workers": 0},
            "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-6}},
        },
        "rollout": {
            "init_args": {
                "engine": engine,
                "drift_every_n_steps": 0,
                "engine_options": engine_kwargs if engine == "vllm" else {},
            }
        },
        "data": {"train": {"files": rows_file}, "batch_size": cfg.prompts // devices},
    }
    import yaml

    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    threads = str(max(1, cfg.threads // devices))
    env = dict(
        os.environ,
        OMP_NUM_THREADS=threads,
        PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(work), *sys.path]),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "lit_rlvr.cli", "fit", "--config", str(path)],
        env=env,
        capture_output=True,
        text=True,
        cwd=work,
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    ranks = [[json.loads(line) for line in Path(f"{out}.rank{r}").read_text().splitlines()] for r in range(devices)]
    steps = [b["end"] - a["end"] for a, b in zip(ranks[0], ranks[0][1:])][1:]  # drop the first 2 steps
    tokens = [
        sum(r[i]["tokens"] for r in ranks) / max(r[i]["rollout_s"] for r in ranks) for i in range(2, len(ranks[0]))
    ]
    return {"step_s": steps, "tokens_per_s": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all (split over the processes)")
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"])
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp2"])
    parser.add_argument("--out", help="file name under benchmarks/results/ or an absolute path")
    cfg = parser.parse_args()
    if cfg.quick:
        cfg.steps, cfg.rounds, cfg.engines = 4, 1, ["hf"]
    common.quiet_libraries()
    load_before = common.load_average()
    work = common.work_dir("lit_rlvr_scale_")
    model_dir = common.build_model_dir(work / "model")
    (work / "bench_reward.py").write_text(
        "from lit_rlvr.rewards import register_reward\n"
        "register_reward('bench_seven')(lambda completion, answer, **row: float('7' in completion))\n"
    )
    rows_file = common.write_jsonl(work / "prompts.jsonl", common.countdown_rows(cfg.prompts * (cfg.steps + 2)))
    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    for _ in range(cfg.rounds):
        for engine in cfg.engines:
            for devices in (1, 2):
                r = run(model_dir, rows_file, work, devices, cfg.strategy, engine, cfg)
                slot = results.setdefault((engine, devices), {"step_s": [], "tokens_per_s": []})
                slot["step_s"] += r["step_s"]
                slot["tokens_per_s"] += r["tokens_per_s"]
                print(
                    f"  {engine} × {devices} process(es): median step {statistics.median(r['step_s']) * 1e3:.0f} ms",
                    flush=True,
                )
    lines = [
        f"# Scale-out on CPU ({'quick' if cfg.quick else 'full'}; {time.strftime('%Y-%m-%d %H:%M')}; commit {common.git_rev()})",
        "",
        f"Command: `python benchmarks/scale_out.py{' --quick' if cfg.quick else ''}`. Global batch per step: P={cfg.prompts} "
        f"prompts × G={cfg.samples} samples × up to T={cfg.new_tokens} tokens; tiny Llama; strategy `{cfg.strategy}` for 2 "
        f"processes; {cfg.threads} torch threads in all; {cfg.rounds} alternated round(s) × {cfg.steps} timed steps. "
        f"Load average before: {load_before}; after: {common.load_average()}.",
        "",
        "| engine | processes | median step (ms) | rollout tokens/s (median) | step ratio 2/1 | tokens/s ratio 2/1 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ratio = None
    for engine in cfg.engines:
        one, two = results[(engine, 1)], results[(engine, 2)]
        step_ratio = statistics.median(two["step_s"]) / statistics.median(one["step_s"])
        tok_ratio = statistics.median(two["tokens_per_s"]) / statistics.median(one["tokens_per_s"])
        ratio = step_ratio if ratio is None else ratio
        for devices, r in ((1, one), (2, two)):
            cells = f"{statistics.median(r['step_s']) * 1e3:.0f} | {statistics.median(r['tokens_per_s']):.0f}"
            extra = f" | {step_ratio:.2f}× | {tok_ratio:.2f}×" if devices == 2 else " | | "
            lines.append(f"| {engine} | {devices} | {cells}{extra} |")
    print("\n".join(lines[-2 * len(cfg.engines) - 2 :]))
    path = common.write_result(cfg.out or ("scale_out_quick.md" if cfg.quick else "scale_out.md"), lines)
    print(f"wrote {path}")
    print(f"scale_out_step_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
