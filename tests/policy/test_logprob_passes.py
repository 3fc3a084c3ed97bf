"""The no-grad log-prob passes outside the module follow length-sorted, cropped micro-batches:
the rollout callback's drift check and the reference-cache builder's log π_ref."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlvr.cache.builder import reference_logprobs
from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.lockstep import Lockstep
from lit_rlvr.policy import (
    MicroBatching,
    completion_logprobs,
    packs_sequences,
    sequence_logprob,
)
from lit_rlvr.rollout import HFEngine
from lit_rlvr.rollout.engine import logprob_drift
from lit_rlvr.rollout.types import SamplingParams


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


def record_shapes(model) -> list[tuple[int, int]]:
    shapes: list[tuple[int, int]] = []
    handle = model.model.register_forward_pre_hook(
        lambda mod, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    return shapes, handle


@pytest.mark.parametrize(
    "module_batching",
    [MicroBatching(max_rows=3), MicroBatching(max_rows=3, max_tokens=64), MicroBatching(max_rows=2, padding_free=True)],
)
def test_drift_in_micro_batches_equals_drift_of_one_padded_forward(model_and_tok, module_batching):
    model, tok = model_and_tok
    prompts = [tok("C375=026:").input_ids, tok("C1=2:").input_ids]
    rollouts = HFEngine(model, tok).generate(prompts, SamplingParams(n=4, max_new_tokens=24, seed=3))
    assert len({len(c) for c in rollouts.completion_ids}) > 2  # ragged
    pad = rollouts.to_padded(tok.pad_token_id)
    with torch.no_grad():
        lp, _ = completion_logprobs(model, pad["input_ids"], pad["attention_mask"], pad["response_mask"].shape[1])
    want = logprob_drift(pad["old_logprobs"], lp, pad["response_mask"]).item()
    pl_module = types.SimpleNamespace(policy=model, tokenizer=tok, micro_batching=module_batching, lockstep=Lockstep())
    packed = packs_sequences(model, module_batching.padding_free)  # probes first
    shapes, handle = record_shapes(model)
    got = RolloutCallback().drift(pl_module, rollouts, 1.0)
    handle.remove()
    assert got == pytest.approx(want, abs=1e-6) and got < 1e-4
    assert all(b <= module_batching.max_rows for b, _ in shapes)  # the module's row cap (packed: bins of rows)
    assert len(shapes) >= 3 and (packed or sum(b for b, _ in shapes) == 8)
    if module_batching.max_tokens:
        assert all(b * L <= 64 or b == 1 for b, L in shapes)  # the module's token budget


@pytest.mark.parametrize("batch_size,max_tokens", [(16, None), (2, None), (16, 30), (3, 1)])
def test_reference_cache_logprobs_in_length_sorted_micro_batches(model_and_tok, batch_size, max_tokens):
    model, tok = model_and_tok
    prompts = [tok(p).input_ids for p in ["C375=026:", "C375=026:", "C1=2:", "C1=2:", "C98=1:"]]
    completions = [tok(c).input_ids for c in ["3*7+5;", "1", "", "12+34-5*6;", "9"]]
    shapes, handle = record_shapes(model)
    got = reference_logprobs(model, prompts, completions, tok.pad_token_id, MicroBatching(batch_size, max_tokens))
    handle.remove()
    assert [len(x) for x in got] == [len(c) for c in completions]
    for g, p, c in zip(got, prompts, completions):
        if c:
            assert torch.allclose(torch.from_numpy(g), sequence_logprob(model, p, c), atol=1e-5)
    assert all(b <= batch_size and (max_tokens is None or b * L <= max_tokens or b == 1) for b, L in shapes)
    assert reference_logprobs(model, [], [], tok.pad_token_id) == []
