"""HFEngine's KV-cache decode loop (``decode="fast"``) against ``model.generate`` (``decode="generate"``).

The reference is the ``generate`` path itself: with the same seed both must return the same
completions, finish reasons, texts and sampler log-probs (the fast loop draws the same random
numbers, see :func:`lit_rlvr.rollout.hf.sample_next`). Independently of ``generate``, the
sampler log-probs must equal the policy's own log-probs of the sampled tokens
(:func:`lit_rlvr.policy.completion_logprobs`) at the sampling temperature.
"""

from __future__ import annotations

import pytest
import torch

import lit_rlvr.rollout.hf as hf
from lit_rlvr.demo.tiny import build_tiny_llama
from lit_rlvr.policy import completion_logprobs
from lit_rlvr.rollout import HFEngine, SamplingParams
from tests.rollout.conftest import PROMPTS


def engines(model, tok, **kw):
    return HFEngine(model, tok, decode="fast", **kw), HFEngine(model, tok, decode="generate", **kw)


def assert_same(a, b, atol=1e-6):
    assert a.completion_ids == b.completion_ids
    assert a.finish_reasons == b.finish_reasons
    assert a.texts == b.texts
    for la, lb in zip(a.sampler_logprobs, b.sampler_logprobs):
        assert len(la) == len(lb)
        torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), atol=atol, rtol=0)


CASES = {
    "sample_t1_seed0": SamplingParams(n=4, max_new_tokens=24, seed=0),
    "sample_t1_seed7": SamplingParams(n=3, max_new_tokens=17, seed=7),
    "sample_t07": SamplingParams(n=4, temperature=0.7, max_new_tokens=20, seed=1),
    "sample_t13": SamplingParams(n=2, temperature=1.3, max_new_tokens=12, seed=2),
    "top_k": SamplingParams(n=4, top_k=5, max_new_tokens=16, seed=3),
    "top_p": SamplingParams(n=4, top_p=0.8, max_new_tokens=16, seed=4),
    "top_k_top_p_t08": SamplingParams(n=3, temperature=0.8, top_k=7, top_p=0.9, max_new_tokens=16, seed=5),
    "greedy": SamplingParams(n=2, temperature=0.0, max_new_tokens=20),
    "greedy_top_k_ignored": SamplingParams(n=1, temperature=0.0, top_k=3, max_new_tokens=8),
    "one_token": SamplingParams(n=3, max_new_tokens=1, seed=6),
    "stop_strings": SamplingParams(n=4, max_new_tokens=24, stop=("a", "1"), seed=8),
    "stop_multichar": SamplingParams(n=4, max_new_tokens=32, stop=("=0", "ab", "zz"), seed=9),
    "greedy_stop": SamplingParams(n=1, temperature=0.0, max_new_tokens=32, stop=("7",)),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CASES))
def test_fast_equals_generate(model, tok, prompts, name):
    fast, gen = engines(model, tok)
    assert fast.fast and not gen.fast
    a, b = fast.generate(prompts, CASES[name]), gen.generate(prompts, CASES[name])
    assert_same(a, b)
    assert all(len(c) <= CASES[name].max_new_tokens for c in a.completion_ids)


@pytest.mark.timeout(120)
def test_stop_strings_end_the_row_and_cut_the_text(model, tok, prompts):
    params = CASES["stop_strings"]
    eng = HFEngine(model, tok)
    out = eng.generate(prompts, params)
    by_string = [r == "stop" and ids[-1] not in eng.eos_ids for ids, r in zip(out.completion_ids, out.finish_reasons)]
    assert any(by_string) and "length" in out.finish_reasons  # the case exercises both outcomes
    for ids, reason, text, stopped in zip(out.completion_ids, out.finish_reasons, out.texts, by_string):
        full = tok.decode(ids, skip_special_tokens=True)
        if stopped:  # the stop string completes with the last token, not before
            assert any(s in full for s in params.stop) and not any(
                s in tok.decode(ids[:-1], skip_special_tokens=True) for s in params.stop
            )
            assert text.endswith(tuple(params.stop))
        elif reason == "length":
            assert len(ids) == params.max_new_tokens and not any(s in full for s in params.stop)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [0, 1])
def test_eos_ends_rows(tok, prompts, seed):
    """Extra EOS ids from the generation config (frequent characters) make rows end early."""
    model = build_tiny_llama(tok, num_layers=2, seed=1).eval()
    eos = [tok.eos_token_id, *tok.convert_tokens_to_ids(["7", "3", "a"])]
    model.generation_config.eos_token_id = eos
    fast, gen = engines(model, tok)
    assert fast.eos_ids == eos
    params = SamplingParams(n=6, max_new_tokens=24, seed=seed)
    a, b = fast.generate(prompts, params), gen.generate(prompts, params)
    assert_same(a, b)
    assert "stop" in a.finish_reasons and "length" in a.finish_reasons
    for ids, reason in zip(a.completion_ids, a.finish_reasons):
        ends = [t for t, x in enumerate(ids) if x in eos]
        assert ends == ([len(ids) - 1] if reason == "stop" else [])  # EOS kept, and only as the last token


@pytest.mark.timeout(120)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampler_logprobs_are_the_policy_logprobs(model, tok, prompts, temperature):
    params = SamplingParams(n=4, temperature=temperature, max_new_tokens=20, seed=11)
    out = HFEngine(model, tok).generate(prompts, params)
    batch = out.to_padded(tok.pad_token_id)
    T = batch["response_mask"].shape[1]
    with torch.no_grad():
        ref, _ = completion_logprobs(model, batch["input_ids"], batch["attention_mask"], T, temperature)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(batch["old_logprobs"][mask], ref[mask], atol=1e-5, rtol=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rows", [1, 5, 7])
def test_chunked_batches_continue_the_same_random_stream(model, tok, prompts, rows):
    """``max_batch_rows`` splits the call; each chunk consumes the RNG as ``generate`` does."""
    params = SamplingParams(n=3, max_new_tokens=16, seed=12)
    fast, gen = engines(model, tok, max_batch_rows=rows)
    assert_same(fast.generate(prompts, params), gen.generate(prompts, params))


@pytest.mark.timeout(120)
def test_same_seed_same_rollouts_and_caller_rng_untouched(model, tok, prompts):
    eng = HFEngine(model, tok)
    params = SamplingParams(n=4, max_new_tokens=16, seed=3)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b = eng.generate(prompts, params), eng.generate(prompts, params)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert_same(a, b, atol=0)
    c = eng.generate(prompts, SamplingParams(n=4, max_new_tokens=16, seed=4))
    assert c.completion_ids != a.completion_ids


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "params",
    [
        CASES["stop_strings"],
        SamplingParams(n=4, temperature=0.5, top_k=10, max_new_tokens=24, seed=2),
        SamplingParams(n=6, max_new_tokens=24, seed=0),
    ],
)
def test_keeping_finished_rows_changes_nothing(tok, params):
    """Dropping finished rows from the batch and KV cache gives what keeping them (padded) gives."""
    model = build_tiny_llama(tok, num_layers=2, seed=1).eval()
    eos = [tok.eos_token_id, *tok.convert_tokens_to_ids(["7", "3"])]
    rows = [tok.encode(p) for p in PROMPTS for _ in range(params.n)]
    Lp = max(map(len, rows))
    ids = torch.tensor([[0] * (Lp - len(r)) + r for r in rows])
    mask = (torch.arange(Lp) >= Lp - torch.tensor([len(r) for r in rows])[:, None]).long()
    outs = []
    for drop in (True, False):
        torch.manual_seed(params.seed or 0)
        outs.append(hf.decode_fast(model, ids, mask, params, eos, tok.pad_token_id, tok, drop_finished=drop))
    (t1, l1, s1), (t2, l2, s2) = outs
    assert torch.equal(t1, t2) and s1 == s2
    torch.testing.assert_close(l1, l2, atol=1e-6, rtol=0)
    assert (t1 == tok.pad_token_id).any()  # some rows ended early: the dropping path ran


@pytest.mark.timeout(120)
def test_sharded_world_uses_generate(model, tok, prompts, monkeypatch):
    """With several FSDP ranks every forward is a collective: only ``generate(synced_gpus=True)`` keeps step."""
    params = SamplingParams(n=2, max_new_tokens=8, seed=0)
    expected = HFEngine(model, tok).generate(prompts, params)
    monkeypatch.setattr(hf, "_sharded_world", lambda: True)
    synced = []
    real_generate = type(model).generate

    def generate(self, **kw):  # records the flag; one process cannot run the collectives themselves
        synced.append(kw.pop("synced_gpus"))
        return real_generate(self, **kw)

    monkeypatch.setattr(type(model), "generate", generate)
    monkeypatch.setattr(hf, "decode_fast", lambda *a, **k: pytest.fail("decode_fast ran in a sharded world"))
    assert_same(HFEngine(model, tok).generate(prompts, params), expected)
    assert synced == [True]


def test_unsupported_models_fall_back_to_generate(tok):
    from transformers import T5Config, T5ForConditionalGeneration

    t5 = T5ForConditionalGeneration(T5Config(vocab_size=100, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8))
    assert not HFEngine(t5, tok).fast  # encoder-decoder
    assert HFEngine(build_tiny_llama(tok, num_layers=1), tok).fast


def test_unknown_decode_mode_is_refused(model, tok):
    with pytest.raises(ValueError, match=r"decode must be one of \('fast', 'generate'\), got 'turbo'"):
        HFEngine(model, tok, decode="turbo")


@pytest.mark.timeout(120)
def test_lora_policy_fast_equals_generate(tok, prompts):
    peft = pytest.importorskip("peft")
    base = build_tiny_llama(tok, num_layers=2, seed=2)
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    ).eval()
    fast, gen = engines(model, tok)
    assert fast.fast
    params = SamplingParams(n=3, max_new_tokens=16, seed=1)
    assert_same(fast.generate(prompts, params), gen.generate(prompts, params))
