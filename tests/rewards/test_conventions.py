"""TRL and verl reward functions run unchanged in the killable workers, one completion per call."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap

import pytest

from lit_rlvr.options import ScoringOptions
from lit_rlvr.plugins import load_function
from lit_rlvr.rewards import BatchScorer, RewardFunc, RewardMix, TrainerState
from lit_rlvr.rewards.conventions import as_value, detect_convention, imported_reward

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


def shortest_in_batch(completions, **kwargs):
    """Compares the completions of a batch: 1 for the shortest ones (a reward TRL calls with the whole batch)."""
    shortest = min(len(c) for c in completions)
    return [float(len(c) == shortest) for c in completions]
'''

# verl's built-in scorers, as verl's `default_compute_score` reaches them: neither `data_source` nor
# `extra_info` in the signature, options with defaults (the signature of verl's gsm8k.compute_score).
VERL_BUILTIN_MODULE = '''
import re


def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    """The first `#### N` (strict) or the last number (flexible) against the ground truth."""
    if method == "strict":
        found = re.search(r"#### (-?[0-9.,]+)", solution_str)
        answer = None if found is None else found.group(1).replace(",", "")
    else:
        numbers = [n for n in re.findall(r"-?[0-9.,]+", solution_str) if n not in ("", ".")]
        answer = numbers[-1] if numbers else None
    if answer is None:
        return 0
    return score if answer == ground_truth else format_score


def needs_a_tokenizer(solution_str, ground_truth, tokenizer):
    return 1.0
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
    builtin_file = folder / "verl_gsm8k_builtin.py"
    builtin_file.write_text(textwrap.dedent(VERL_BUILTIN_MODULE))
    sys.path.insert(0, str(folder))
    try:
        importlib.import_module("trl_rewards")
        yield {"trl": "trl_rewards", "verl": str(verl_file), "verl_builtin": str(builtin_file)}
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("trl_rewards", None)


def test_conventions_are_told_apart_by_parameter_names(user_rewards):
    assert detect_convention(load_function("trl_rewards.contains_solution", "reward function")) == "trl"
    assert detect_convention(load_function("trl_rewards:slow_length_bonus", "reward function")) == "trl"
    assert detect_convention(load_function(f"{user_rewards['verl']}:compute_score", "reward function")) == "verl"
    assert detect_convention(load_function("lit_rlvr.demo.countdown.countdown_score", "reward function")) == "native"
    with pytest.raises(ValueError, match="match no known signature; accepted: trl: f"):
        detect_convention(load_function("os.path.join", "reward function"))


@pytest.mark.parametrize(
    ("ref", "match"),
    [
        ("trl_rewards.nope", "module 'trl_rewards' has no attribute 'nope'"),
        ("no_such_module_xyz.f", "No module named 'no_such_module_xyz'"),
        ("missing/file.py:compute_score", "no file"),
        ("trl_rewards", "expected 'package.module.function'"),
    ],
)
def test_a_wrong_import_path_is_a_clear_error(user_rewards, ref, match):
    with pytest.raises(ImportError, match=match):
        load_function(ref, "reward function")


def _echo(f: RewardFunc, *args, **kwargs) -> dict:
    """What ``echo_call`` was called with (it raises it; the scorer would make that an ``error``)."""
    with pytest.raises(ValueError) as info:
        f(*args, **kwargs)
    return eval(str(info.value))  # noqa: S307 (the repr our own test function wrote)


def test_trl_function_gets_trls_arguments_standard_and_conversational(user_rewards):
    f = RewardFunc("trl_rewards.echo_call")
    state = TrainerState(global_step=7, epoch=0, max_steps=10)
    called = _echo(
        f,
        "out",
        "4",
        id="q/0",
        prompt="2+2?",
        solution="4",
        completion_ids=[5, 6],
        trainer_state=state,
        reward="echo_call",
    )
    assert called == {
        "prompts": ["2+2?"],
        "completions": ["out"],
        "completion_ids": [[5, 6]],
        "step": 7,
        "columns": ["answer", "id", "solution"],
    }
    messages = [{"role": "user", "content": "2+2?"}]
    chat = _echo(f, "out", None, id="q/0", prompt=messages, solution="4")
    assert chat["prompts"] == [messages] and chat["completions"] == [[{"role": "assistant", "content": "out"}]]
    assert chat["step"] == 0 and chat["columns"] == ["id", "solution"]  # no gold: no answer column


def test_verl_function_gets_verls_arguments_and_its_dict_or_float(user_rewards):
    row = {
        "id": "g/0",
        "prompt": [{"role": "user", "content": "q"}],
        "data_source": "openai/gsm8k",
        "extra_info": {"split": "train", "index": 0},
    }
    f = RewardFunc(f"{user_rewards['verl']}:compute_score", options={"bonus": 0.5})
    assert f.convention == "verl" and f("so #### 18", "18", **row).reward == 1.5
    with pytest.raises(NotImplementedError):  # in the scorer: that item's `error`
        f("so #### 18", "18", **{**row, "data_source": "other"})
    assert RewardFunc(f"{user_rewards['verl']}:plain_score")("18", "18", **row).reward == 1.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ("not_applicable", 0.0)),
        (True, ("ok", 1.0)),
        (-1, ("ok", -1.0)),
        (2.5, ("ok", 2.5)),
        ("1.0", ("error", 0.0)),
        ([1.0], ("error", 0.0)),
    ],
)
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
        assert (
            "RuntimeError: reward failed" in scores[1].results[0].reason
            and "worker died" in scores[5].results[0].reason
        )
        assert [s.reward for s in mix.score(scorer, ["7"], [row])] == [1.0]  # the pool is whole again


@pytest.mark.timeout(120)
def test_async_and_negative_rewards_in_workers_match_in_process(user_rewards):
    mix = RewardMix.from_config(
        ["trl_rewards.contains_solution", "trl_rewards.slow_length_bonus"], [1.0, 2.0], correctness="contains_solution"
    )
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


VERL_ROW = {
    "id": "gsm8k/0",
    "prompt": [{"role": "user", "content": "q"}],
    "data_source": "openai/gsm8k",
    "answer": "1234",
    "extra_info": {"split": "train", "index": 0},
}


@pytest.mark.timeout(120)
def test_verls_own_scorers_get_only_the_arguments_their_signature_takes(user_rewards):
    """verl's gsm8k.compute_score(solution_str, ground_truth, method, format_score, score) takes no
    data_source or extra_info: it used to raise TypeError on every call (the run trained on zeros)."""
    ref = f"{user_rewards['verl_builtin']}:compute_score"
    mix = RewardMix.from_config([ref])
    mix.check_rows([VERL_ROW])  # the call shape, at start-up
    completions = ["so #### 1,234", "the answer is 1234", "#### 7"]
    with BatchScorer(workers=1, rewards=mix.records) as scorer:
        scores = mix.score(scorer, completions, [VERL_ROW] * 3)
    assert [s.status for s in scores] == ["ok"] * 3 and [s.reward for s in scores] == [1.0, 0.0, 0.0]
    flexible = RewardMix.from_config([ref], options={"compute_score": {"method": "flexible", "format_score": 0.1}})
    with BatchScorer(workers=0, rewards=flexible.records) as scorer:
        assert [s.reward for s in flexible.score(scorer, completions, [VERL_ROW] * 3)] == [
            0.1,
            1.0,
            0.1,
        ]  # "1,234" as verl: kept


@pytest.mark.parametrize(
    ("ref", "row", "match"),
    [
        (
            "verl_builtin:needs_a_tokenizer",
            VERL_ROW,
            r"reward function 'needs_a_tokenizer' \(.*, verl convention\) cannot be called on row 'gsm8k/0': missing a required argument: 'tokenizer'",
        ),
        (
            "verl:compute_score",
            {**VERL_ROW, "extra_info": '{"split": "train"}'},
            r"cannot be called on row 'gsm8k/0': row 'gsm8k/0': extra_info must be a dict, as verl's rows carry it; got a str",
        ),
        (
            "trl_rewards.contains_solution",
            {"id": "t/0", "prompt": "p"},
            r"missing a required argument: 'solution' \(the row gives \['id', 'prompt'",
        ),
    ],
)
def test_a_call_the_function_cannot_take_fails_at_start_up(user_rewards, ref, row, match):
    head, _, name = ref.partition(":")
    ref = f"{user_rewards[head]}:{name}" if head in user_rewards else ref
    mix = RewardMix.from_config([ref])
    with pytest.raises(ValueError, match=match):
        mix.check_rows([row])


def test_the_extra_info_of_every_row_is_checked_not_only_the_first(user_rewards):
    mix = RewardMix.from_config([f"{user_rewards['verl']}:compute_score"])
    with pytest.raises(ValueError, match="row 'gsm8k/1': extra_info must be a dict"):
        mix.check_rows([VERL_ROW, {**VERL_ROW, "id": "gsm8k/1", "extra_info": "split=train"}])


@pytest.mark.timeout(120)
def test_trls_reward_factories_and_their_products_run_as_trl_runs_them():
    """TRL 1.16's (completion_ids, **kwargs) rewards: a factory by import path with its arguments as
    options (YAML), a built reward object in Python; both in the workers, equal to TRL's own call."""
    from trl.rewards import get_repetition_penalty_reward, get_soft_overlong_punishment

    ids = [[1] * 90, [1, 2, 3, 4], [5] * 120, [1, 2, 1, 2, 1, 2], [7] * 81]
    rows = [{"id": f"q/{i}", "prompt": "p"} for i in range(len(ids))]
    scoring = ScoringOptions(
        reward_funcs=["trl.rewards.get_soft_overlong_punishment", get_repetition_penalty_reward(ngram_size=2)],
        options={"get_soft_overlong_punishment": {"max_completion_len": 100, "soft_punish_cache": 20}},
        correctness="soft_overlong_punishment_reward",
        workers=1,
    )
    mix = scoring.mix()
    assert mix.names == ["soft_overlong_punishment_reward", "repetition_penalty_reward"]
    mix.check_rows(rows)
    with scoring.scorer() as scorer:
        assert scorer.local_only == {}  # both reach the workers
        scores = mix.score(scorer, ["x"] * len(ids), rows, completion_ids=ids)
    overlong = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)(ids)
    repetition = get_repetition_penalty_reward(ngram_size=2)(ids)
    assert [s.parts for s in scores] == list(zip(overlong, repetition))
    assert overlong[0] == -0.5 and repetition[1] == 0.0 and repetition[3] < 0  # the cases the data covers
    with pytest.raises(
        ValueError,
        match=r"reward factory 'trl.rewards.get_soft_overlong_punishment' cannot be called with options \{\}",
    ):
        ScoringOptions(reward_funcs=["trl.rewards.get_soft_overlong_punishment"])


def lambda_free_pid(completions, **kwargs):
    """A module-level (picklable) TRL reward given in Python: the process that scores it."""
    return [float(os.getpid())] * len(completions)


@pytest.mark.timeout(120)
def test_python_callables_are_rewards_picklable_in_workers_the_rest_in_process_with_a_warning():
    """ScoringOptions(reward_funcs=[fn]) used to raise "argument of type 'function' is not iterable"."""
    here = os.getpid()
    scoring = ScoringOptions(
        reward_funcs=[lambda_free_pid, lambda completions, **kw: [float(os.getpid())] * len(completions)],
        correctness="lambda_free_pid",
        workers=1,
    )
    mix = scoring.mix()
    assert mix.names == ["lambda_free_pid", "<lambda>"] and mix.terms[0].source.endswith(":lambda_free_pid")
    with pytest.warns(
        UserWarning, match="'<lambda>' runs in the training process, not in a killable worker: it is not picklable"
    ):
        scorer = scoring.scorer()
    with scorer:
        (score,) = mix.score(scorer, ["x"], [{"id": "q", "prompt": "p"}])
    assert score.parts[0] != here and score.parts[1] == here


@pytest.mark.parametrize("whole_batch", [None, ["shortest_in_batch"]])
def test_a_reward_that_compares_completions_gets_the_whole_batch_when_asked(user_rewards, whole_batch):
    """Called once per completion, a batch-level reward silently sees batches of one (all 1 here);
    `whole_batch` calls it as TRL does."""
    scoring = ScoringOptions(reward_funcs=["trl_rewards.shortest_in_batch"], whole_batch=whole_batch, workers=0)
    mix = scoring.mix()
    with scoring.scorer() as scorer:
        scores = mix.score(scorer, ["ab", "a", "abc", "b"], [{"id": "q", "prompt": "p"}] * 4, with_answers=True)
    assert [s.reward for s in scores] == ([1.0] * 4 if whole_batch is None else [0.0, 1.0, 0.0, 1.0])
    assert [s.answer for s in scores] == ["ab", "a", "abc", "b"]


def test_a_whole_batch_failure_scores_the_batch_as_errors_and_only_trl_functions_may_ask(user_rewards):
    mix = RewardMix.from_config(["trl_rewards.contains_solution"], whole_batch=["contains_solution"])
    with BatchScorer(workers=0, rewards=mix.records) as scorer:
        scores = mix.score(scorer, ["7", "raise"], [{"id": "q", "prompt": "p", "solution": "7"}] * 2)
    assert [s.status for s in scores] == ["error", "error"] and "RuntimeError: reward failed" in scores[0].results[
        0
    ].reason
    with pytest.raises(ValueError, match="scoring.whole_batch: 'compute_score' is a verl function"):
        RewardMix.from_config([f"{user_rewards['verl']}:compute_score"], whole_batch=["compute_score"])
    with pytest.raises(ValueError, match=r"scoring.whole_batch names 'nope', which is not one of"):
        RewardMix.from_config(["trl_rewards.contains_solution"], whole_batch=["nope"])


def test_a_row_column_named_like_an_argument_or_an_option_of_the_function_does_not_collide():
    def native(completion, answer, scale=1.0, **row):
        return scale * float(completion == answer)

    def trl(completions, solution, **kw):
        return [float(c == s) for c, s in zip(completions, solution)]

    scaled = RewardFunc(native, options={"scale": 0.5})  # the configured option, not the row's column
    assert scaled("4", "4", id="q", scale="a column").reward == 0.5
    assert RewardFunc(trl)("4", None, id="q", solution="4", completions="a column").reward == 1.0
