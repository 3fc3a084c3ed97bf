"""The demo's countdown checker: checks report the value and the digits, answers are scored by the countdown reward."""

from __future__ import annotations

import itertools
import random

import pytest

import lit_rlvr.demo  # noqa: F401  (registers the countdown environment)
from lit_rlvr.demo.countdown import countdown_reward, evaluate, solutions
from lit_rlvr.envs import resolve_environment


def test_checks_then_answers_agree_with_the_task_on_random_pairs():
    rng = random.Random(0)
    table = solutions()
    for (digits, target), exprs in rng.sample(sorted(table.items()), 40):
        env = resolve_environment("countdown").make()
        env.reset({"id": "c", "digits": digits, "answer": str(target)}, max_turns=4)
        wrong = next(
            f"{a}{o}{b}{p}{c}"
            for a, b, c in itertools.permutations(digits)
            for o in "+-*"
            for p in "+-*"
            if evaluate(f"{a}{o}{b}{p}{c}") != target
        )
        check = env.step(f"{wrong}?")
        assert (check.observation, check.tool_call, check.done) == (f"={evaluate(wrong)}\n", wrong, False)
        expr = rng.choice(exprs)
        assert env.step(f"{expr}?").observation == f"={target}\n"
        final = env.step(f"{expr};")
        assert (
            (final.done, final.reward)
            == (True, countdown_reward(f"{expr};", str(target), digits=digits))
            == (True, 1.0)
        )


def test_bad_digits_malformed_checks_and_the_last_turn():
    env = resolve_environment("countdown").make()
    env.reset({"id": "c", "digits": "375", "answer": "26"}, max_turns=3)
    assert env.step("3+7*4?").observation == "=31 bad digits\n"
    malformed = env.step("3++7?")
    assert (malformed.observation, malformed.tool_error) == ("=?\n", True)
    last = env.step("3*7+5?")  # a check on the last turn: the episode ends unanswered
    assert (last.done, last.reward) == (True, 0.0)
    env.reset({"id": "c", "digits": "375", "answer": "26"}, max_turns=3)
    assert env.step("5+3*7;").reward == 1.0  # a fresh episode after reset
    with pytest.raises(ValueError, match="row id='bad': malformed gold for countdown"):
        env.reset({"id": "bad", "digits": "37", "answer": "26"}, max_turns=3)
