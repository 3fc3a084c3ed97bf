"""One GPU: RLVR steps of a randomly initialised model of a real shape, in bf16, with the transformers engine.

    python benchmarks/gpu_step.py --strategy fsdp     # Lightning's FSDP (FSDP1), 1 device
    python benchmarks/gpu_step.py --strategy fsdp2    # FSDP2 (fully_shard), 1 device
    python benchmarks/gpu_step.py --smoke             # a tiny model on CPU: checks the script itself

The model has Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV heads, FFN 4864, tied
embeddings) with random weights and a character vocabulary (the machine has no hub), so step time,
rollout tokens/s, MFU and peak memory are real for that shape while the text is noise. A step is
GRPO on P prompts × G samples × up to T new tokens with `engine: hf` (vLLM is not installed on the
lent GPU machine). MFU = 6·N·(training tokens per step) / step time / peak bf16 FLOP/s (N =
non-embedding parameters; generation and the log-prob passes are counted in the time, not in the
FLOPs, so this is a lower bound of the trainer's utilisation). Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import common  # benchmarks/common.py
import torch
from lightning import Callback, Trainer

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 FLOP/s


class Times(Callback):
    def __init__(self):
        self.ends, self.tokens, self.train_tokens = [], [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())
        r = batch.rollouts
        self.tokens.append(r.num_tokens())
        self.train_tokens.append(r.num_tokens() + sum(len(p) for p in r.prompt_ids) * r.n)


def qwen_like(tok, smoke: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = (
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
        if smoke
        else dict(
            hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
        )
    )
    config = Qwen2Config(
        vocab_size=len(tok),
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        rope_theta=1e6,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **shape,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", default="fsdp2", choices=["fsdp", "fsdp2", "auto"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, 2 steps (tests the script)")
    cfg = parser.parse_args()
    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.data import DatasetSpec, PromptDataModule
    from lit_rlvr.demo.tiny import build_char_tokenizer, save_tiny_model
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions
    from lit_rlvr.strategies import FSDP2Strategy  # noqa: F401  (registers fsdp2)

    common.quiet_libraries()
    common.register_bench_reward()
    on_gpu = torch.cuda.is_available() and not cfg.smoke
    if cfg.smoke:
        cfg.prompts, cfg.samples, cfg.new_tokens, cfg.steps, cfg.strategy = 2, 2, 8, 2, "auto"
    work = common.work_dir("lit_rlvr_gpu_")
    tok = build_char_tokenizer()
    model = qwen_like(tok, cfg.smoke)
    non_embedding = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    model_dir = save_tiny_model(work / "model", model, tok)
    rows = common.countdown_rows(cfg.prompts * (cfg.steps + 2))
    prompts = common.write_jsonl(work / "prompts.jsonl", rows)
    dm = PromptDataModule(
        tokenizer=str(model_dir),
        train=DatasetSpec(files=prompts, name="bench"),
        batch_size=cfg.prompts,
        gold_check=None,
    )
    policy = PolicyOptions(str(model_dir), dtype="bfloat16" if on_gpu else "float32", attn_implementation="sdpa")
    module = RLVRModule(
        policy,
        sampling=SamplingParams(n=cfg.samples, max_new_tokens=cfg.new_tokens, seed=0),
        scoring=ScoringOptions(workers=0),
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-6),
    )
    times = Times()
    rollout = RolloutCallback(engine="hf", drift_every_n_steps=0)
    trainer = Trainer(
        accelerator="gpu" if on_gpu else "cpu",
        devices=1,
        strategy=cfg.strategy,
        max_steps=cfg.steps + 2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[rollout, times],
    )
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(module, datamodule=dm)
    steps = [b - a for a, b in zip(times.ends, times.ends[1:])][1:]  # drop the first 2 steps
    step_s = statistics.median(steps)
    name = torch.cuda.get_device_name() if on_gpu else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    train_tokens = statistics.median(times.train_tokens[2:])
    result = {
        "device": name,
        "strategy": cfg.strategy,
        "params_non_embedding": non_embedding,
        "work": f"{cfg.prompts}x{cfg.samples}x{cfg.new_tokens}",
        "step_ms": round(step_s * 1e3, 1),
        "rollout_tokens_per_s": round(statistics.median(times.tokens[2:]) / step_s, 1),
        "mfu": round(6 * non_embedding * train_tokens / step_s / peak, 4) if peak else None,
        "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if on_gpu else None,
        "loss": float(trainer.callback_metrics["train/loss"]),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
