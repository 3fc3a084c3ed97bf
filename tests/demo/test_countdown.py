"""Countdown-3 and addition: the verifier against brute force and Python's own arithmetic."""

from __future__ import annotations

import itertools

import pytest

from lit_rlvr.demo.countdown import (
    addition_completion,
    countdown_reward,
    evaluate,
    solutions,
    split_countdown,
)


def _all_expressions():
    for digits in itertools.product("123456789", repeat=3):
        for op1, op2 in itertools.product("+-*", repeat=2):
            yield f"{digits[0]}{op1}{digits[1]}{op2}{digits[2]}"


def test_evaluate_matches_python_precedence():
    for expr in _all_expressions():
        assert evaluate(expr) == eval(expr)  # reference: Python's integer arithmetic


def test_solutions_is_the_brute_force_table():
    ref: dict[tuple[str, int], set[str]] = {}
    for expr in _all_expressions():
        value = eval(expr)
        if 0 <= value <= 999:
            ref.setdefault(("".join(sorted(expr[::2])), value), set()).add(expr)
    assert {k: set(v) for k, v in solutions().items()} == ref
    assert len(ref) == 1418


def test_reward_accepts_every_solution_in_any_digit_order():
    for (digits, target), exprs in solutions().items():
        shown = digits[::-1]
        for expr in exprs:
            assert countdown_reward(f"{expr};", str(target), digits=shown) == 1.0
            assert countdown_reward(f"{expr};", f"{target:03d}", digits=digits) == 1.0


@pytest.mark.parametrize(
    ("completion", "why"),
    [
        ("3*7+5", "no terminating ;"),
        ("3*7+6;", "wrong digit"),
        ("3*7+5+1;", "extra operand"),
        ("7*3;", "missing digit"),
        ("3*5+7;", "right digits, wrong value"),
        ("3/7+5;", "division is not allowed"),
        ("3 * 7 + 5;", "spaces inside the expression"),
        ("(3*7)+5;", "parentheses"),
        ("37+5+0;", "multi-digit number"),
        ("", "empty"),
        (";3*7+5;", "empty expression"),
    ],
)
def test_reward_rejects(completion, why):
    assert countdown_reward(completion, "26", digits="375") == 0.0, why


def test_reward_rejects_every_wrong_target():
    for (digits, target), exprs in list(solutions().items())[::50]:
        for wrong in (target - 1, target + 1):
            if wrong >= 0:
                assert countdown_reward(f"{exprs[0]};", str(wrong), digits=digits) == 0.0


@pytest.mark.parametrize("row", [{"digits": "37"}, {"digits": "370"}, {}])
def test_reward_malformed_gold_raises(row):
    with pytest.raises(ValueError, match="malformed gold"):
        countdown_reward("3*7+5;", "26", id="r1", **row)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_split_is_a_deterministic_partition(seed):
    train, held = split_countdown(seed)
    assert split_countdown(seed) == (train, held)
    assert not set(train) & set(held)
    assert sorted(train + held) == sorted(solutions())
    assert len(held) == round(0.1 * 1418)


def test_splits_differ_across_seeds():
    assert split_countdown(0)[1] != split_countdown(1)[1]


@pytest.mark.parametrize(("a", "b", "width"), [(374, 458, 3), (0, 0, 3), (999, 999, 3), (5, 7, 2), (99, 1, 2)])
def test_addition_completion_is_judged_by_the_math_reward(a, b, width):
    rewards = pytest.importorskip("lit_rlvr.rewards")
    completion = addition_completion(a, b, width)
    assert completion == "\\boxed{" + str(a + b).zfill(width + 1) + "}"
    assert rewards.REWARDS["math"](completion, str(a + b)) == 1.0
    assert rewards.REWARDS["math"](completion, str(a + b + 1)) == 0.0
