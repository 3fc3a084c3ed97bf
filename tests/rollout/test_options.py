"""The rollout callback's option groups check themselves: each error names the key, the value and what is accepted."""

from __future__ import annotations

import dataclasses

import pytest

from lit_rlvr.rollout import HFEngine
from lit_rlvr.rollout.options import MAX_LANES, AsyncOptions, RolloutOptions


@pytest.mark.parametrize(
    ("k", "on_stale", "ahead"), [(0, "wait", 0), (0, "drop", 1), (MAX_LANES - 2, "wait", MAX_LANES - 2)]
)
def test_async_options_accept_the_seed_lanes_and_say_how_far_ahead(k, on_stale, ahead):
    assert AsyncOptions(k, on_stale).ahead == ahead


@pytest.mark.parametrize(
    ("k", "on_stale", "match"),
    [
        (MAX_LANES - 1, "wait", r"rollout.max_staleness must be an integer in \[0, 6\] or null, got 7"),
        (-1, "wait", r"in \[0, 6\] or null, got -1"),
        (1.5, "wait", r"an integer .* got 1.5"),
        (1, "skip", "rollout.on_stale must be 'wait' or 'drop', got 'skip'"),
    ],
)
def test_async_options_refuse_a_lag_outside_the_lanes_or_an_unknown_policy(k, on_stale, match):
    with pytest.raises(ValueError, match=match):
        AsyncOptions(k, on_stale)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sync_every_n_steps": 0}, "rollout.sync_every_n_steps must be >= 1, got 0"),
        ({"drift_every_n_steps": -1}, r"rollout.drift_every_n_steps must be >= 0 \(0 = never\), got -1"),
        ({"engine": "trt"}, r"rollout.engine: unknown rollout engine 'trt'; valid names: \[.*'hf'"),
        (
            {"engine": "hf", "engine_options": {"decod": "hf"}},
            r"rollout.engine_options: unknown option\(s\) \['decod'\]",
        ),
        ({"engine": "hf", "engine_options": {"tokenizer": None}}, r"\['tokenizer'\] are set by the callback itself"),
        (
            {"engine": "hf", "asynchronous": AsyncOptions(1)},
            "max_staleness=1 needs an engine that generates apart.*'hf'",
        ),
        (
            {"engine": "vllm_server", "asynchronous": AsyncOptions(0), "sync_every_n_steps": 3},
            r"use sync_every_n_steps: 1 with it \(got 3\)",
        ),
    ],
)
def test_rollout_options_refuse_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RolloutOptions(**kwargs)


def test_a_ready_engine_is_checked_by_what_it_is_not_by_the_registry(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = HFEngine(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    )
    options = RolloutOptions(engine=engine, engine_options={"anything": 1})  # a built engine's options are its own
    assert options.engine_kind == "hf"
    with pytest.raises(ValueError, match="needs an engine that generates apart.*'hf' samples in the trainer's process"):
        RolloutOptions(engine=engine, asynchronous=AsyncOptions(0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.sync_every_n_steps = 2
