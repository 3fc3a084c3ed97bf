"""Prefix reuse in the ``hf`` engine (lit_rlvr/rollout/prefix.py, ``HFEngine.prefix_reuse``).

The reference is the same engine without reuse (``prefix_cache_mb=0``): every call prefills the
whole prompt. With the same seed, reuse must return the same completions, finish reasons and texts
and the same sampler log-probs up to rounding, in the multi-turn loop and in direct calls that mix
kept prefixes with new prompts, while prefilling only the tokens after the kept prefixes. Kept rows
are dropped when the weights change, and never exceed ``prefix_cache_mb``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from lit_rlvr.demo.tiny import build_tiny_llama
from lit_rlvr.envs import EnvironmentBase, EnvSpec, Step
from lit_rlvr.rollout import HFEngine, SamplingParams
from lit_rlvr.rollout.prefix import PrefixCache, RowKV
from lit_rlvr.rollout.turns import TurnLoop, TurnOptions

OBSERVATION = "=ok="
TOKEN_BYTES = 2 * 2 * 4 * 32 * 4  # layers × (keys, values) × heads × head size × float32


class Echo(EnvironmentBase):
    """Answers every turn with the same observation and never ends the episode."""

    def step(self, action: str) -> Step:
        return Step(OBSERVATION, tool_call="x")


def prefill_widths(model) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """A hook recording the width of every forward that feeds more than one token (a prefill)."""
    widths: list[int] = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            widths.append(ids.shape[1])

    return widths, model.register_forward_pre_hook(hook, with_kwargs=True)


def turns(engine, tok, prompts, params, max_turns=4):
    loop = TurnLoop(tok, TurnOptions(max_turns=max_turns, step_timeout_s=None))
    rows = [{"id": str(i)} for i in range(len(prompts))]
    return loop.generate(engine, prompts, rows, params, EnvSpec("echo", {}, Echo, "1"))


def assert_same(a, b, atol=1e-5):
    assert a.completion_ids == b.completion_ids
    assert a.finish_reasons == b.finish_reasons
    assert a.texts == b.texts
    assert a.loss_mask == b.loss_mask
    for la, lb in zip(a.sampler_logprobs, b.sampler_logprobs):
        assert len(la) == len(lb)
        torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), atol=atol, rtol=0)


CASES = {
    "sample_seed0": SamplingParams(n=3, max_new_tokens=12, seed=0),
    "sample_t07_top_p": SamplingParams(n=2, temperature=0.7, top_p=0.9, max_new_tokens=10, seed=1),
    "greedy": SamplingParams(n=1, temperature=0.0, max_new_tokens=10),
    "stop_strings": SamplingParams(n=3, max_new_tokens=12, stop=("a", "1"), seed=2),
}


# ---------------------------------------------------------------------------------------- PrefixCache


def kv(n: int, fill: float = 0.0) -> RowKV:
    """A one-layer row of n tokens, 16 bytes a token."""
    return RowKV((torch.full((1, n, 2), fill),), (torch.full((1, n, 2), fill),))


def test_lookup_finds_the_longest_stored_prefix_and_leaves_a_token_to_feed():
    cache = PrefixCache(max_bytes=10_000)
    for ids in ([1, 2], [1, 2, 3, 4], [1, 9, 3], [7]):
        assert cache.store(ids, kv(len(ids)))
    entry, usable = cache.lookup([1, 2, 3, 4, 5])
    assert entry.ids == (1, 2, 3, 4) and usable == 4
    entry, usable = cache.lookup([1, 2, 3, 5])  # [1, 2, 3, 4] is no prefix of it: the next longest
    assert entry.ids == (1, 2) and usable == 2
    entry, usable = cache.lookup([1, 2, 3, 4])  # the whole prompt is kept: its last token is fed again
    assert entry.ids == (1, 2, 3, 4) and usable == 3
    assert cache.lookup([7]) is None  # nothing would be left to feed
    assert cache.lookup([2, 1]) is None and cache.lookup([]) is None


def test_memory_stays_within_max_bytes_least_recently_used_out():
    cache = PrefixCache(max_bytes=16 * 10)  # ten tokens
    assert cache.store([1, 2, 3, 4], kv(4)) and cache.store([5, 6, 7, 8], kv(4))
    assert cache.lookup([1, 2, 3, 4, 0]) is not None  # [1..4] used last: [5..8] goes first
    assert cache.store([9, 9, 9], kv(3))
    assert cache.nbytes == 16 * 7 <= cache.max_bytes and len(cache) == 2
    assert cache.lookup([5, 6, 7, 8, 0]) is None and cache.lookup([1, 2, 3, 4, 0]) is not None
    assert not cache.store(list(range(11)), kv(11))  # alone over the bound: not kept, nothing evicted
    assert len(cache) == 2
    for i in range(50):
        cache.store([100 + i, 1], kv(2))
        assert cache.nbytes == sum(e.kv.nbytes for e in cache._entries.values()) <= cache.max_bytes
    assert len(cache) == 5


def test_store_replaces_discard_check_and_refusals():
    cache = PrefixCache(max_bytes=1000)
    cache.store([1, 2], kv(2, 0.0))
    cache.store([1, 2], kv(2, 1.0))
    entry, _ = cache.lookup([1, 2, 3])
    assert len(cache) == 1 and cache.nbytes == 32 and float(entry.kv.keys[0][0, 0, 0]) == 1.0
    cache.discard(entry)
    assert len(cache) == 0 and cache.nbytes == 0 and cache.lookup([1, 2, 3]) is None
    cache.store([1, 2], kv(2))
    cache.check("v1")  # the first version seen empties it too
    assert len(cache) == 0
    cache.store([1, 2], kv(2))
    cache.check("v1")
    assert len(cache) == 1
    cache.check("v2")
    assert len(cache) == 0 and cache.nbytes == 0
    with pytest.raises(ValueError, match="3 token ids but keys and values for 2"):
        cache.store([1, 2, 3], kv(2))
    with pytest.raises(ValueError, match="max_bytes must be an integer >= 0"):
        PrefixCache(-1)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "64", None])
def test_prefix_cache_mb_is_checked(model, tok, bad):
    with pytest.raises(ValueError, match=rf"prefix_cache_mb must be an integer >= 0 .*got {bad!r}"):
        HFEngine(model, tok, prefix_cache_mb=bad)


# ---------------------------------------------------------------------------------------- the engine


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CASES))
def test_multi_turn_rollouts_unchanged_and_turns_prefill_only_new_tokens(model, tok, prompts, name):
    params = CASES[name]
    widths, handle = prefill_widths(model)
    try:
        reused = turns(HFEngine(model, tok), tok, prompts, params)
        reused_widths, widths[:] = list(widths), []
        full = turns(HFEngine(model, tok, prefix_cache_mb=0), tok, prompts, params)
    finally:
        handle.remove()
    assert_same(reused, full)
    assert max(len(ids) for ids in full.completion_ids) > 3 * params.max_new_tokens  # four turns ran
    # the first turn prefills the prompts; a later one its last token, the observation, and padding for rows
    # whose turn ended at a stop string (their kept prefix ends one token earlier)
    later = len(tok.encode(OBSERVATION)) + 2
    assert reused_widths[0] == widths[0] == max(map(len, prompts))
    assert all(w <= later for w in reused_widths[1:]), reused_widths
    assert max(widths[1:]) > 3 * params.max_new_tokens


@pytest.mark.timeout(120)
def test_calls_mixing_kept_prefixes_and_new_prompts(model, tok, prompts):
    """Rows of one call hit kept prefixes of different lengths or none; batches split by max_batch_rows."""
    params = SamplingParams(n=2, max_new_tokens=9, seed=3)
    reuse, full = HFEngine(model, tok, max_batch_rows=4), HFEngine(model, tok, max_batch_rows=4, prefix_cache_mb=0)
    with reuse.prefix_reuse():
        first = reuse.generate(prompts, params)
        assert_same(first, full.generate(prompts, params))
        assert len(reuse.prefix_cache) == len(prompts) * params.n
        extra = [tok.encode(s) for s in ("+", "==1", "ab", "", "?x")]
        nxt = [list(first.prompt_ids[i // 2]) + first.completion_ids[i] + extra[i % 5] for i in range(0, 10, 3)]
        nxt += [tok.encode("fresh prompt"), prompts[1]]  # no kept prefix; a prompt shorter than its kept rows
        step = SamplingParams(n=1, max_new_tokens=7, seed=4)
        assert_same(reuse.generate(nxt, step), full.generate(nxt, step))
    assert reuse.prefix_cache is None


@pytest.mark.timeout(120)
def test_update_weights_drops_the_kept_rows(model, tok, prompts):
    policy = copy.deepcopy(model)
    engine = HFEngine(copy.deepcopy(model), tok)
    params = SamplingParams(n=2, max_new_tokens=8, seed=5)
    with engine.prefix_reuse():
        first = engine.generate(prompts, params)
        assert len(engine.prefix_cache) == len(prompts) * params.n
        with torch.no_grad():
            for p in policy.parameters():
                p.mul_(1.5)
        engine.update_weights(policy)
        assert len(engine.prefix_cache) == 0
        nxt = [list(first.prompt_ids[i // 2]) + first.completion_ids[i] + tok.encode("=1") for i in range(6)]
        after = engine.generate(nxt, SamplingParams(n=1, max_new_tokens=8, seed=6))
    assert_same(
        after, HFEngine(policy, tok, prefix_cache_mb=0).generate(nxt, SamplingParams(n=1, max_new_tokens=8, seed=6))
    )


@pytest.mark.timeout(120)
def test_parameters_written_in_place_drop_the_kept_rows(tok, prompts):
    """The live policy changes without update_weights (an optimizer step): the kept keys are stale."""
    model = build_tiny_llama(tok, num_layers=2, seed=1).eval()
    engine = HFEngine(model, tok)
    params = SamplingParams(n=2, max_new_tokens=8, seed=7)
    with engine.prefix_reuse():
        first = engine.generate(prompts, params)
        with torch.no_grad():
            model.model.layers[0].self_attn.k_proj.weight.mul_(3.0)
        nxt = [list(first.prompt_ids[i // 2]) + first.completion_ids[i] + tok.encode("=1") for i in range(6)]
        after = engine.generate(nxt, SamplingParams(n=1, max_new_tokens=8, seed=8))
        assert len(engine.prefix_cache) == len(nxt)  # emptied, then this call's rows kept
    reference = HFEngine(model, tok, prefix_cache_mb=0).generate(nxt, SamplingParams(n=1, max_new_tokens=8, seed=8))
    assert_same(after, reference)


@pytest.mark.timeout(120)
def test_kept_rows_stay_within_prefix_cache_mb(model, tok, prompts):
    params = SamplingParams(n=8, max_new_tokens=12, seed=9)  # 40 trajectories of ~60 tokens: ~2,400 tokens
    engine = HFEngine(model, tok, prefix_cache_mb=1)  # 512 tokens
    peaks: list[int] = []
    generate = engine._generate

    def spy(prompt_ids, p):
        out = generate(prompt_ids, p)
        peaks.append(engine.prefix_cache.nbytes)
        return out

    engine._generate = spy
    reused = turns(engine, tok, prompts, params)
    assert len(peaks) == 4 and 0 < max(peaks) <= 2**20
    assert max(peaks) > 2**20 - 60 * TOKEN_BYTES  # the bound, not the rows, limited it
    assert engine.prefix_cache is None  # cleared when the rollout ends
    assert_same(reused, turns(HFEngine(model, tok, prefix_cache_mb=0), tok, prompts, params))


def test_prefix_reuse_nests_and_is_off_where_it_cannot_apply(model, tok):
    engine = HFEngine(model, tok)
    assert engine.prefix_cache is None
    with engine.prefix_reuse():
        cache = engine.prefix_cache
        assert cache is not None and cache.max_bytes == 1024 * 2**20
        with engine.prefix_reuse():
            assert engine.prefix_cache is cache
        assert engine.prefix_cache is cache
    assert engine.prefix_cache is None
    for off in (HFEngine(model, tok, prefix_cache_mb=0), HFEngine(model, tok, decode="generate")):
        with off.prefix_reuse():
            assert off.prefix_cache is None
