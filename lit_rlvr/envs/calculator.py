"""A calculator tool for math problems: exact arithmetic on the model's expressions, never ``eval``.

The model may compute with ``<calc>…</calc>`` turns (the result comes back as
``<result>…</result>``) and answers with ``<answer>…</answer>``, which the ``math`` reward (or
another registered reward) scores against the row's answer, as it scores a single-turn answer.

Expressions are parsed with :func:`ast.parse` and evaluated by walking the tree over
:class:`fractions.Fraction`: numbers, ``+ - * / // % **`` and parentheses only, so text from the
model is never executed, ``0.1 + 0.2`` is exactly ``3/10`` and huge powers are refused before they
are computed (:func:`calculate`).
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

from lit_rlvr.envs.base import EnvironmentBase, Step, register_environment
from lit_rlvr.rewards.base import REWARDS, as_result

MAX_EXPRESSION_CHARS = 200
MAX_RESULT_BITS = 4096  # numerator and denominator of every intermediate value
MAX_EXPONENT = 1024

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate (the message says why)."""


def calculate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression (module docstring).

    Raises:
        CalculatorError: anything but numbers, ``+ - * / // % **`` and parentheses; more than
            :data:`MAX_EXPRESSION_CHARS` characters; division by zero; a non-integer or too large
            exponent; a value beyond :data:`MAX_RESULT_BITS` bits.

    Example:
        >>> calculate("0.1 + 0.2"), calculate("2 ** 10 - (3 - 5) * 7 // 2")
        (Fraction(3, 10), Fraction(1031, 1))
        >>> calculate("__import__('os').system('ls')")
        Traceback (most recent call last):
        ...
        lit_rlvr.envs.calculator.CalculatorError: only numbers, + - * / // % ** and parentheses are allowed; got a Call
        >>> calculate("9 ** 9 ** 9")
        Traceback (most recent call last):
        ...
        lit_rlvr.envs.calculator.CalculatorError: the exponent 387420489 is beyond 1024
    """
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression has {len(text)} characters (at most {MAX_EXPRESSION_CHARS})")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise CalculatorError(f"cannot parse {text!r}: {type(err).__name__}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _bounded(Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_value(node.left), _value(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if right == 0 and not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            raise CalculatorError("division by zero")
        return _bounded(_OPERATORS[type(node.op)](left, right))
    raise CalculatorError(f"only numbers, + - * / // % ** and parentheses are allowed; got a {type(node).__name__}")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise CalculatorError(f"the exponent {exponent} is not an integer")
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"the exponent {exponent} is beyond {MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length()) * abs(int(exponent))
    if bits > MAX_RESULT_BITS:
        raise CalculatorError(f"the result would have about {bits} bits (at most {MAX_RESULT_BITS})")
    return base ** int(exponent)


def _bounded(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_RESULT_BITS:
        raise CalculatorError(f"a value has more than {MAX_RESULT_BITS} bits")
    return value


def show(value: Fraction) -> str:
    """A value as the model reads it: an integer, or the fraction and a decimal.

    Example:
        >>> show(Fraction(12)), show(Fraction(-7, 3))
        ('12', '-7/3 = -2.33333')
    """
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value} = {float(value):.6g}" if abs(value) < 1e15 else str(value)


def _check(calc_tag: str, answer_tag: str, reward: str) -> None:
    for name, tag in (("calc_tag", calc_tag), ("answer_tag", answer_tag)):
        if not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
            raise ValueError(f"{name} must be a tag name such as 'calc'; got {tag!r}")
    if calc_tag == answer_tag:
        raise ValueError(f"calc_tag and answer_tag must differ; both are {calc_tag!r}")
    if reward not in REWARDS:
        raise ValueError(f"reward must be a registered reward; got {reward!r}, registered: {sorted(REWARDS)}")


@register_environment("calculator", check=_check, scores=True)
class CalculatorEnvironment(EnvironmentBase):
    """A math problem with a calculator (module docstring); the row's ``answer`` is the gold.

    Args:
        calc_tag: the tag of an expression to compute (``<calc>…</calc>``).
        answer_tag: the tag of the final answer (``<answer>…</answer>``).
        reward: the registered reward that scores the final answer (given as ``\\boxed{answer}``).

    Example:
        >>> env = CalculatorEnvironment()
        >>> env.reset({"id": "m1", "answer": "391"}, max_turns=3)
        >>> env.step("<calc>17 * 23</calc>").observation
        '<result>391</result>'
        >>> env.step("<answer>391</answer>").reward
        1.0
    """

    version = "1"

    def __init__(self, *, calc_tag: str = "calc", answer_tag: str = "answer", reward: str = "math"):
        _check(calc_tag, answer_tag, reward)
        self.reward = reward
        self.stop = (f"</{calc_tag}>", f"</{answer_tag}>")
        self._calc = re.compile(rf"<{calc_tag}>(.*?)</{calc_tag}>", re.DOTALL)
        self._answer = re.compile(rf"<{answer_tag}>(.*?)</{answer_tag}>", re.DOTALL)
        self.invalid = (
            f"write <{calc_tag}>expression</{calc_tag}> to compute, or <{answer_tag}>…</{answer_tag}> to answer"
        )

    def step(self, action: str) -> Step:
        last = self.next_turn()
        answers = self._answer.findall(action)
        if answers:
            score = as_result(
                REWARDS[self.reward].score(
                    f"\\boxed{{{answers[-1].strip()}}}", self.row.get("answer"), **self.scoring_row
                )
            )
            return Step(reward=score.reward, done=True, info={"status": score.status, "reason": score.reason})
        calls = self._calc.findall(action)
        if last:
            return Step(reward=0.0, done=True, info={"status": "no_answer"})
        if not calls:
            return Step(f"<result>{self.invalid}</result>", reward=0.0, tool_error=True, info={"status": "invalid"})
        expression = calls[-1].strip()
        try:
            text, error = show(calculate(expression)), False
        except CalculatorError as err:
            text, error = f"error: {err}", True
        return Step(f"<result>{text}</result>", reward=0.0, tool_call=" ".join(expression.split()), tool_error=error)
