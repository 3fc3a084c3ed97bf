"""A multi-turn reference cache: the initial policy's trajectories in the environment, their loss
masks, and the environment's identity, which a run with another environment refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import lit_rlvr.demo  # noqa: F401  (the countdown environment)
from lit_rlvr.cache import build_reference_cache
from lit_rlvr.cache.builder import call_seed
from lit_rlvr.cache.format import CacheMismatchError
from lit_rlvr.cache.reader import ReferenceCache
from lit_rlvr.data.prompts import encode_prompt
from lit_rlvr.demo.agents import CountdownChecker
from lit_rlvr.demo.data import countdown_rows
from lit_rlvr.envs import ENVIRONMENTS, register_environment
from lit_rlvr.rollout.engine import context_length
from lit_rlvr.rollout.hf import HFEngine
from lit_rlvr.rollout.turns import EnvironmentOptions, RolloutSampler
from lit_rlvr.rollout.types import SamplingParams

ENV = EnvironmentOptions("countdown", max_turns=3, max_turn_tokens=4)
PARAMS = SamplingParams(n=3, max_new_tokens=4, seed=5)

if "_countdown_v2" not in ENVIRONMENTS:
    register_environment("_countdown_v2")(type("CountdownV2", (CountdownChecker,), {"version": "2"}))


class NoScorer:
    """The countdown checker scores every trajectory: the rewards are never asked."""

    def score(self, completions, rows):
        raise AssertionError(f"scored {len(completions)} completions that the environment scored")


@pytest.fixture(scope="module")
def multiturn_cache(tmp_path_factory, tiny):
    model, tok = tiny
    # no `reward`: the checker scores its episodes, so the rows need none (nor does the manifest list one)
    rows = [
        {k: v for k, v in r.items() if k != "reward"} for r in countdown_rows([("357", 26), ("129", 11), ("248", 16)])
    ]
    prompt_ids = [encode_prompt(r, tok) for r in rows]
    out = build_reference_cache(
        tmp_path_factory.mktemp("mt") / "cache",
        rows,
        prompt_ids,
        engine=HFEngine(model, tok),
        scorer=NoScorer(),
        model=model,
        tokenizer=tok,
        params=PARAMS,
        prompts_per_shard=2,
        progress=False,
        environment=ENV,
    )
    return out, rows, prompt_ids


def test_the_cache_holds_the_samplers_trajectories_with_their_masks_and_rewards(multiturn_cache, tiny):
    model, tok = tiny
    out, rows, prompt_ids = multiturn_cache
    engine = HFEngine(model, tok)
    sampler = RolloutSampler(tok, ENV, context_length(engine, model)[0])
    with ReferenceCache(out) as cache:
        assert cache.multi_turn and cache.manifest["environment"] == ENV.identity(rows)
        assert cache.manifest["environment"]["environments"] == ["countdown@1"] and cache.manifest["rewards"] == []
        for i, row in enumerate(
            rows
        ):  # the builder's call for prompt i: its seed from the run seed and the prompt's id
            expected = sampler(
                engine, [prompt_ids[i]], [row], replace(PARAMS, seed=call_seed(PARAMS.seed, [row["id"]]))
            )
            samples = [cache.sample(i * PARAMS.n + j) for j in range(PARAMS.n)]
            assert [s.completion_ids.tolist() for s in samples] == expected.completion_ids
            assert [s.loss_mask.tolist() for s in samples] == expected.loss_mask
            assert [s.reward for s in samples] == [e.reward for e in expected.episodes]
        assert any(0 in s.loss_mask for s in cache.iter_samples())  # the environment answered
        anchor = cache.anchor_batch([0, 4, 8], pad_id=tok.pad_token_id)
        samples = [cache.sample(i) for i in (0, 4, 8)]
        for a, s in enumerate(samples):
            T = len(s.completion_ids)
            assert anchor.loss_mask[a, :T].tolist() == s.loss_mask.tolist() and not anchor.loss_mask[a, T:].any()
        assert torch.equal(anchor.loss_tokens, anchor.response_mask * anchor.loss_mask)


def test_a_run_with_another_environment_version_or_limits_is_refused(multiturn_cache, built_cache):
    out, rows, _ = multiturn_cache
    with ReferenceCache(out) as cache:
        cache.check(environment=ENV.identity(rows))  # the run that built it
        cache.check(environment=replace(ENV, step_timeout_s=5.0).identity(rows))  # a deadline samples the same
        for run, said in [
            (None, "this run samples single-turn completions"),
            (
                EnvironmentOptions("_countdown_v2", max_turns=3, max_turn_tokens=4),
                r"this run samples trajectories in _countdown_v2@2",
            ),
            (replace(ENV, max_turns=2), r"'max_turns': 2"),
        ]:
            with pytest.raises(
                CacheMismatchError, match=r"environment: cache sampled trajectories in countdown@1 .*" + said
            ):
                cache.check(environment=run if run is None else run.identity(rows))
    with ReferenceCache(built_cache) as single:
        single.check(environment=None)
        with pytest.raises(CacheMismatchError, match="environment: cache sampled single-turn completions"):
            single.check(environment=ENV.identity(rows))


class HintedCountdown(CountdownChecker):
    """The countdown checker with an option (what it answers could depend on it)."""

    def __init__(self, *, hint: str = ""):
        super().__init__()
        self.hint = hint


if "_countdown_hinted" not in ENVIRONMENTS:
    register_environment("_countdown_hinted", scores=True)(HintedCountdown)


def test_a_run_with_other_environment_options_is_refused_naming_the_option(tmp_path, tiny):
    """The environment's options are part of the cache's identity: a run whose option differs (or is
    left out) is refused, the differing option named; the run that built it passes."""
    model, tok = tiny
    rows = [{k: v for k, v in r.items() if k != "reward"} for r in countdown_rows([("357", 26)])]
    built = EnvironmentOptions("_countdown_hinted", options={"_countdown_hinted": {"hint": "a"}}, max_turns=2)
    out = build_reference_cache(
        tmp_path / "cache",
        rows,
        [encode_prompt(r, tok) for r in rows],
        engine=HFEngine(model, tok),
        scorer=NoScorer(),
        model=model,
        tokenizer=tok,
        params=replace(PARAMS, n=2),
        progress=False,
        environment=built,
    )
    with ReferenceCache(out) as cache:
        assert cache.manifest["environment"]["options"] == {"_countdown_hinted@1": {"hint": "a"}}
        cache.check(environment=built.identity(rows))
        for options, said in [({"hint": "b"}, "'a', this run 'b'"), ({}, "'a', this run not set")]:
            run = replace(built, options={"_countdown_hinted": options})
            with pytest.raises(CacheMismatchError, match=r"options differ: _countdown_hinted@1 hint: cache " + said):
                cache.check(environment=run.identity(rows))
