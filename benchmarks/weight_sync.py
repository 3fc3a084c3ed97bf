"""Weight sync of a LoRA policy into a colocated vLLM engine: merged full sync vs adapter-only, and buckets.

    python benchmarks/weight_sync.py            # 57M-param Llama, LoRA r = 16 on every linear layer
    python benchmarks/weight_sync.py --quick    # a 17M-param Llama, fewer syncs: checks the script (< 2 minutes; --out or a temp folder)
    python benchmarks/weight_sync.py --gpu      # on a GPU machine with vLLM: policy and engine on GPU 0

Contenders, each a ``VLLMEngine`` (``lit_rlvr.rollout.build_engine("vllm", ...)``) in a worker process
of its own, syncing the same policy (the LoRA weights moved before every sync, as an optimizer step
would), in rotating rounds:

- ``merged, streamed``: today's default for an in-process engine (``rollout.adapter_sync: false``):
  the adapter merged into the base weights, every tensor handed to ``reload_weights``, unmerged;
- ``adapter only``: ``adapter_sync: true``: the adapter written to a folder, loaded by vLLM under a
  new name, the previous one removed (the base went in once, at the untimed first sync);
- ``merged, files, N MB buckets``: the merged weights through the ``lit_rlvr_file`` weight-transfer
  backend in files of at most ``--bucket-mb`` (the path of a multi-process engine and of ``engine:
  vllm_server``'s ``file`` transfer);
- ``merged, files, one bucket``: the same with one bucket for the whole model (what the multi-process
  path wrote before buckets).

Per contender: seconds per sync (the ``update_weights`` call; the median and p25–p75 of the timed
syncs), bytes per sync (what the engine's stats count it moved), and the peak extra memory during a
sync (on CPU the process's resident memory above its level just before the sync, sampled every
millisecond by a thread: the trainer's copies, the files' pages, vLLM's load buffers; on GPU the
peak allocated CUDA memory above the level before the sync). After each round every engine passes
the fingerprint check (``check_fingerprint``): it holds the policy. Writes
``benchmarks/results/weight_sync.md``; the last line is ``adapter_vs_merged=<adapter only / merged,
streamed median seconds per sync>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import common  # benchmarks/common.py

FULL = {"shape": common.ModelShape(6, 768, 12, 64), "syncs": 6, "rounds": 3, "bucket_mb": 64}
QUICK = {"shape": common.ModelShape(4, 512, 8, 64), "syncs": 3, "rounds": 1, "bucket_mb": 16}
GPU = {"shape": common.ModelShape(24, 896, 14, 64), "syncs": 6, "rounds": 3, "bucket_mb": 256}  # Qwen2.5-0.5B's shape


def contenders(bucket_mb: int) -> dict[str, dict]:
    """name -> how its engine syncs (``adapter_sync``, through files, bucket MB)."""
    return {
        "merged, streamed": {"adapter_sync": False, "files": False, "bucket_mb": bucket_mb},
        "adapter only": {"adapter_sync": True, "files": False, "bucket_mb": bucket_mb},
        f"merged, files, {bucket_mb} MB buckets": {"adapter_sync": False, "files": True, "bucket_mb": bucket_mb},
        "merged, files, one bucket": {"adapter_sync": False, "files": True, "bucket_mb": 2**20},
    }


class PeakMemory:
    """The peak extra memory while active, in MiB: CUDA's peak allocation on GPU, else resident memory
    sampled every millisecond by a thread, above the level at entry."""

    def __init__(self, gpu: bool):
        self.gpu, self.peak_mb = gpu, 0.0

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakMemory:
        if self.gpu:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        self._base, self._peak, self._stop = self._rss(), 0, threading.Event()

        def sample() -> None:
            while not self._stop.is_set():
                self._peak = max(self._peak, self._rss())
                time.sleep(0.001)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.gpu:
            import torch

            torch.cuda.synchronize()
            self.peak_mb = (torch.cuda.max_memory_allocated() - self._base) / 2**20
            return
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self._peak, self._rss()) - self._base
        self.peak_mb /= 2**20


def setup(model_dir: str, how: dict, rank: int, gpu: bool, syncs: int):
    """A contender's worker: the LoRA policy, its engine, the untimed first sync; returns ``run``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlvr.rollout import build_engine, check_fingerprint, probe_sequence

    device = "cuda" if gpu else "cpu"
    tok = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if gpu else torch.float32).to(device)
    torch.manual_seed(0)
    lora = get_peft_model(
        policy, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", init_lora_weights=False)
    )
    options = {"max_model_len": 64, "enforce_eager": not gpu}
    options.update({"gpu_memory_utilization": 0.3} if gpu else {"kv_cache_memory_bytes": 16 * 2**20})
    engine = build_engine(
        "vllm", model=lora, tokenizer=tok, adapter_sync=how["adapter_sync"], sync_bucket_mb=how["bucket_mb"], **options
    )
    if how["files"]:  # the multi-process executors' path (and the server's file transfer) on this in-process engine
        engine._in_process = lambda: False
    engine.update_weights(lora)  # the first sync (an adapter sync's base weights): not timed
    probe = probe_sequence(len(tok))
    g = torch.Generator(device=device).manual_seed(1)

    def run() -> common.StepRun:
        times, nbytes, peaks = [], [], []
        for _ in range(syncs):
            with torch.no_grad():  # an optimizer step's worth of change to the adapter
                for name, p in lora.named_parameters():
                    if "lora_" in name:
                        p.add_(1e-3 * torch.randn(p.shape, generator=g, device=device, dtype=p.dtype))
            before = engine.stats().sync_bytes
            with PeakMemory(gpu) as memory:
                t0 = time.perf_counter()
                engine.update_weights(lora)
                times.append(time.perf_counter() - t0)
            nbytes.append(engine.stats().sync_bytes - before)
            peaks.append(memory.peak_mb)
        check_fingerprint(engine, lora, probe)  # WeightSyncError unless the engine holds the policy
        # StepRun's fields, reused: times = seconds per sync, lengths = bytes per sync, own = peak extra MB
        return common.StepRun(times, nbytes, peaks)

    run.close = engine.close  # the adapter folders it wrote
    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 17M-param model, 3 syncs, 1 round: checks the script")
    parser.add_argument("--gpu", action="store_true", help="policy and engine on GPU 0 (bf16, Qwen2.5-0.5B's shape)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank r")
    parser.add_argument("--syncs", type=int, help="timed syncs per contender per round")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--bucket-mb", type=int, help="the bucketed contender's sync_bucket_mb")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--out", help="file name under benchmarks/results/ or an absolute path (--quick: default a temporary folder)"
    )
    parser.add_argument("--note", help="a line added under the machine's (e.g. that the machine was loaded)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    plan = {**(GPU if cfg.gpu else QUICK if cfg.quick else FULL)}
    plan.update(
        {k: v for k, v in (("syncs", cfg.syncs), ("rounds", cfg.rounds), ("bucket_mb", cfg.bucket_mb)) if v is not None}
    )
    load_before, work, model_dir = common.start_bench(cfg, plan["shape"])
    how = contenders(plan["bucket_mb"])
    setups = {name: (setup, (str(model_dir), h, cfg.rank, cfg.gpu, plan["syncs"])) for name, h in how.items()}
    # every contender imports these (the RSS columns include them for each alike): imported once, then forked;
    # vLLM's LLM entry point, worker and model are what starting the engine imports beyond `import vllm`
    worker = "vllm.v1.worker.gpu_worker" if cfg.gpu else "vllm.v1.worker.cpu_worker"
    vllm_start = ["vllm.entrypoints.llm", "vllm.model_executor.models.llama", worker]
    preload = ["common", "peft", "transformers", *vllm_start, "lit_rlvr.rollout.vllm"]
    runs, rss = common.alternate_in_workers(setups, plan["rounds"], cfg.threads, preload=preload)
    rows, medians = [], {}
    for name, r in runs.items():
        medians[name] = statistics.median(r.times)
        rows.append(
            f"| {name} | {common.median_ms(r.times):.1f} | {common.iqr_ms(r.times)} | {statistics.median(r.lengths) / 2**20:.2f} | "
            f"{max(r.own):.0f} | {rss[name]['peak_mb']:.0f} |"
        )
    ratio = medians["adapter only"] / medians["merged, streamed"]
    n = plan["rounds"] * plan["syncs"]
    lines = [
        f"# Weight sync of a LoRA policy (r = {cfg.rank}) into a colocated vLLM engine ({'quick, ' if cfg.quick else ''}"
        f"{time.strftime('%Y-%m-%d %H:%M')}; commit {common.git_rev()})",
        "",
        f"Random Llama, {plan['shape'].label()}, {'bf16 on GPU' if cfg.gpu else 'float32 on CPU'}; LoRA on every linear layer; "
        f"{plan['rounds']} rotated round(s) × {plan['syncs']} timed syncs per contender (n = {n}), each contender in a worker "
        "process of its own; the first sync of each engine (an adapter sync's base weights) not timed.",
        f"{common.machine_line(cfg.threads)}. Load average (1/5/15 min) before: {load_before}; after: {common.load_average()}.",
        *([cfg.note] if cfg.note else []),
        "",
        "| contender | median ms per sync | p25–p75 ms | MiB per sync | peak extra MiB during a sync | worker peak RSS MiB |",
        "|---|---:|---|---:|---:|---:|",
        *rows,
        "",
        f"Adapter-only sync takes {ratio:.3f}× the merged streamed sync's seconds and moves "
        f"{statistics.median(runs['adapter only'].lengths) / statistics.median(runs['merged, streamed'].lengths):.4f}× its bytes.",
    ]
    print("\n".join(line for line in lines if line.startswith("|")))
    path = common.write_result(
        common.result_name(
            cfg.out,
            cfg.quick,
            "weight_sync_quick.md" if cfg.quick else "weight_sync_gpu.md" if cfg.gpu else "weight_sync.md",
        ),
        lines,
    )
    print(f"wrote {path}")
    print(f"adapter_vs_merged={ratio:.3f}")


if __name__ == "__main__":
    main()
