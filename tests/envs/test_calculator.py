"""The calculator: exact values against expressions built with their values, refusals without evaluation."""

from __future__ import annotations

import random
import time
from fractions import Fraction

import pytest

from lit_rlvr.envs import resolve_environment
from lit_rlvr.envs.calculator import CalculatorError, calculate


def random_expression(rng: random.Random, depth: int) -> tuple[str, Fraction]:
    """An expression over small numbers and + - * / (and its exact value), built together."""
    if depth == 0 or rng.random() < 0.3:
        value = Fraction(rng.randint(0, 20)) if rng.random() < 0.8 else Fraction(rng.randint(1, 99), 10)
        text = str(value.numerator) if value.denominator == 1 else f"{float(value)}"
        return (f"-{text}", -value) if rng.random() < 0.1 else (text, value)
    (a, x), (b, y) = random_expression(rng, depth - 1), random_expression(rng, depth - 1)
    op = rng.choice("+-*/")
    if op == "/" and y == 0:
        op = "+"
    value = {"+": x + y, "-": x - y, "*": x * y, "/": x / y if y else None}[op]
    return f"({a} {op} {b})", value


@pytest.mark.parametrize("seed", range(5))
def test_values_are_exact(seed):
    rng = random.Random(seed)
    for _ in range(200):
        text, value = random_expression(rng, depth=4)
        assert calculate(text) == value, text


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('touch /tmp/pwned')", "got a Call"),
        ("x + 1", "got a Name"),
        ("(1).real", "got a Attribute"),
        ("[1, 2]", "got a List"),
        ("1 if 1 else 2", "got a IfExp"),
        ("lambda: 1", "got a Lambda"),
        ("'a' * 3", "got a Constant"),
        ("True + 1", "got a Constant"),
        ("1 / 0", "division by zero"),
        ("5 % (2 - 2)", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ** 0.5", "is not an integer"),
        ("10 ** 100000", "beyond 1024"),
        ("99999 ** 1000", "bits"),
        ("1 +", "cannot parse"),
        ("1" * 300, "characters"),
        ("(((1 + 2)", "cannot parse"),
    ],
)
def test_anything_but_arithmetic_is_refused_before_it_runs(expression, message, tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(CalculatorError, match=message):
        calculate(expression)
    assert time.perf_counter() - t0 < 1.0


def test_the_environment_computes_and_scores_the_final_answer_with_the_math_reward():
    env = resolve_environment("calculator").make()
    assert env.reset({"id": "m", "answer": "\\frac{7}{3}"}, max_turns=4) is None
    step = env.step("First <calc>(3 + 4) / 3</calc>")
    assert (step.observation, step.tool_call, step.tool_error, step.done) == (
        "<result>7/3 = 2.33333</result>",
        "(3 + 4) / 3",
        False,
        False,
    )
    bad = env.step("<calc>import os</calc>")
    assert bad.tool_error and bad.observation.startswith("<result>error: cannot parse")
    assert env.step("<answer>7/3</answer>").reward == 1.0
    env.reset({"id": "m", "answer": "5"}, max_turns=2)
    invalid = env.step("no tags")
    assert "write <calc>expression</calc>" in invalid.observation
    assert invalid.tool_call is None and invalid.tool_error  # an invalid turn: a tool error, not a call
    last = env.step("<calc>1+1</calc>")
    assert (last.done, last.reward) == (True, 0.0)
