"""TRL and verl reward functions run unchanged in the killable workers, one completion per call."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap

import pytest

from lit_rlvr.rewards import BatchScorer, RewardFunc, RewardMix, TrainerState
from lit_rlvr.rewards.conventions import as_value, detect_convention, imported_reward, load_function

# A reward module in TRL's documented signature (docs: "Using a custom reward function"), one
# sync and one async function, that also misbehaves on request so the workers' guarantees can be seen.
TRL_MODULE = '''
import asyncio
import os
import signal
import time


def contains_solution(prompts, completions, completion_ids, trainer_state, solution, **kwargs):
    """1.0 if the solution is in the completion; None where the row has no solution."""
    rewards = []
    for prompt, completion, ids, gold in zip(prompts, completions, completion_ids, solution):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        if text == "raise":
            raise RuntimeError("reward failed")
        if text == "hang":  # blocks SIGALRM too, so only the parent's kill can end it
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        if text == "die":
            os._exit(3)
        rewards.append(None if gold is None else float(gold in text))
    return rewards


def echo_call(prompts, completions, completion_ids, trainer_state, **kwargs):
    """What TRL would have passed, as a float code: the test decodes the pieces from the reason."""
    raise ValueError(repr({"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                           "step": trainer_state.global_step, "columns": sorted(kwargs)}))


async def slow_length_bonus(completions, **kwargs):
    """An async reward (an LLM judge would await a service): 0.5 for short completions."""
    await asyncio.sleep(0.01)
    return [0.5 if len(c if isinstance(c, str) else c[0]["content"]) < 5 else -0.5 for c in completions]


async def stuck_judge(completions, **kwargs):
    """An async reward whose service never answers."""
    await asyncio.sleep(3600)


def pid(completions, **kwargs):
    return [float(os.getpid())]
'''

VERL_MODULE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    """verl's signature; a dict result with extra keys, and a reward kwarg (custom_reward_function.reward_kwargs)."""
    if data_source != "openai/gsm8k":
        raise NotImplementedError(f"Reward function is not implemented for {data_source=}")
    answer = solution_str.split("####")[-1].strip()
    return {"score": float(answer == ground_truth) + bonus, "split": extra_info.get("split")}


def plain_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1 if solution_str.strip() == ground_truth else 0
'''


@pytest.fixture(scope="module")
def user_rewards(tmp_path_factory):
    """``trl_rewards`` (importable by name, as workers inherit ``sys.path``) and a verl reward file."""
    folder = tmp_path_factory.mktemp("user_rewards")
    (folder / "trl_rewards.py").write_text(textwrap.dedent(TRL_MODULE))
    verl_file = folder / "my_verl_reward.py"
    verl_file.write_text(textwrap.dedent(VERL_MODULE))
    sys.path.insert(0, str(folder))
    try:
        importlib.import_module("trl_rewards")
        yield {"trl": "trl_rewards", "verl": str(verl_file)}
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("trl_rewards", None)


def test_conventions_are_told_apart_by_parameter_names(user_rewards):
    assert detect_convention(load_function("trl_rewards.contains_solution")) == "trl"
    assert detect_convention(load_function("trl_rewards:slow_length_bonus")) == "trl"
    assert detect_convention(load_function(f"{user_rewards['verl']}:compute_score")) == "verl"
    assert detect_convention(load_function("lit_rlvr.demo.countdown.countdown_score")) == "native"
    with pytest.raises(ValueError, match="match no known signature; accepted: trl: f"):
        detect_convention(load_function("os.path.join"))


@pytest.mark.parametrize(("ref", "match"), [
    ("trl_rewards.nope", "module 'trl_rewards' has no attribute 'nope'"),
    ("no_such_module_xyz.f", "No module named 'no_such_module_xyz'"),
    ("missing/file.py:compute_score", "no file"),
    ("trl_rewards", "expected 'package.module.function'"),
])  # fmt: skip
def test_a_wrong_import_path_is_a_clear_error(user_rewards, ref, match):
    with pytest.raises(ImportError, match=match):
        load_function(ref)


def _echo(f: RewardFunc, *args, **kwargs) -> dict:
    """What ``echo_call`` was called with (it raises it; the scorer would make that an ``error``)."""
    with pytest.raises(ValueError) as info:
        f(*args, **kwargs)
    return eval(str(info.value))  # noqa: S307 (the repr our own test function wrote)


def test_trl_function_gets_trls_arguments_standard_and_conversational(user_rewards):
    f = RewardFunc("trl_rewards.echo_call")
    state = TrainerState(global_step=7, epoch=0, max_steps=10)
    called = _echo(f, "out", "4", id="q/0", prompt="2+2?", solution="4", completion_ids=[5, 6], trainer_state=state, reward="echo_call")
    assert called == {"prompts": ["2+2?"], "completions": ["out"], "completion_ids": [[5, 6]], "step": 7,
                      "columns": ["answer", "id", "solution"]}  # fmt: skip
    messages = [{"role": "user", "content": "2+2?"}]
    chat = _echo(f, "out", None, id="q/0", prompt=messages, solution="4")
    assert chat["prompts"] == [messages] and chat["completions"] == [[{"role": "assistant", "content": "out"}]]
    assert chat["step"] == 0 and chat["columns"] == ["id", "solution"]  # no gold: no answer column


def test_verl_function_gets_verls_arguments_and_its_dict_or_float(user_rewards):
    row = {"id": "g/0", "prompt": [{"role": "user", "content": "q"}], "data_source": "openai/gsm8k",
           "extra_info": {"split": "train", "index": 0}}  # fmt: skip
    f = RewardFunc(f"{user_rewards['verl']}:compute_score", options={"bonus": 0.5})
    assert f.convention == "verl" and f("so #### 18", "18", **row).reward == 1.5
    with pytest.raises(NotImplementedError):  # in the scorer: that item's `error`
        f("so #### 18", "18", **{**row, "data_source": "other"})
    assert RewardFunc(f"{user_rewards['verl']}:plain_score")("18", "18", **row).reward == 1.0


@pytest.mark.parametrize(("value", "expected"), [
    (None, ("not_applicable", 0.0)), (True, ("ok", 1.0)), (-1, ("ok", -1.0)), (2.5, ("ok", 2.5)),
    ("1.0", ("error", 0.0)), ([1.0], ("error", 0.0)),
])  # fmt: skip
def test_values_become_results(value, expected):
    r = as_value(value)
    assert (r.status, r.reward) == expected


@pytest.mark.timeout(120)
def test_in_workers_a_raise_a_hang_or_a_death_costs_only_its_item(user_rewards):
    """The same guarantees as lit_rlvr's own rewards: every other completion is scored."""
    mix = RewardMix.from_config(["trl_rewards.contains_solution"])
    row = {"id": "q", "prompt": "p", "solution": "7"}
    completions = ["7", "raise", "x7", "hang", "no", "die", "7!"]
    with BatchScorer(workers=2, timeout_s=1.0, kill_grace_s=0.5, chunk_size=2, rewards=mix.records) as scorer:
        scores = mix.score(scorer, completions, [row] * len(completions))
        statuses = [s.status for s in scores]
        assert [s.reward for s in scores] == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        assert statuses == ["ok", "error", "ok", "timeout", "ok", "error", "ok"]
        assert "RuntimeError: reward failed" in scores[1].results[0].reason and "worker died" in scores[5].results[0].reason
        assert [s.reward for s in mix.score(scorer, ["7"], [row])] == [1.0]  # the pool is whole again


@pytest.mark.timeout(120)
def test_async_and_negative_rewards_in_workers_match_in_process(user_rewards):
    mix = RewardMix.from_config(["trl_rewards.contains_solution", "trl_rewards.slow_length_bonus"], [1.0, 2.0],
                                correctness="contains_solution")  # fmt: skip
    rows = [{"id": "a", "prompt": "p", "solution": "7"}, {"id": "b", "prompt": "p", "solution": None}]
    completions = ["7", "a long 7 answer"]
    with BatchScorer(workers=0, rewards=mix.records) as local, BatchScorer(workers=1, rewards=mix.records) as pool:
        expected = mix.score(local, completions, rows)
        assert mix.score(pool, completions, rows) == expected
    assert [s.parts for s in expected] == [(1.0, 0.5), (None, -0.5)]
    assert [s.reward for s in expected] == [2.0, -1.0] and [s.correct for s in expected] == [1.0, 0.0]


@pytest.mark.timeout(60)
def test_imported_functions_run_in_the_workers_not_the_trainer(user_rewards):
    record = imported_reward("pid", "trl_rewards.pid")
    with BatchScorer(workers=1, rewards={"pid": record}) as scorer:
        result = scorer.score(["x"], [{"id": "q", "reward": "pid", "answer": None}])[0]
    assert result.status == "ok" and result.reward != float(os.getpid())


def test_reward_func_pickles_as_its_path(user_rewards):
    import pickle

    f = RewardFunc("trl_rewards.contains_solution")
    data = pickle.dumps(f)
    assert b"contains_solution" in data and len(data) < 300
    assert pickle.loads(data) == f and pickle.loads(data).fn is f.fn


def test_an_async_reward_past_the_deadline_times_out_and_the_next_call_works(user_rewards):
    stuck, bonus = RewardFunc("trl_rewards.stuck_judge"), RewardFunc("trl_rewards.slow_length_bonus")
    assert stuck.is_async and stuck("x", None, prompt="p", timeout_s=0.2).status == "timeout"
    assert bonus("x", None, prompt="p", timeout_s=5.0).reward == 0.5  # a fresh event loop after the interrupted one
