"""Countdown-3 and fixed-width addition: tiny verifiable tasks on which diversity collapse shows on CPU.

Countdown-3 (docs/demo.md): the prompt gives three digits 1–9 and a target
0–999, e.g. ``C375=026:``; a correct answer is an expression that uses each digit exactly once
with ``+ - *`` (normal precedence) and evaluates to the target, ending with ``;`` (``3*7+5;``).
Many targets have several valid expressions, which is what makes diversity measurable.

Addition (the out-of-domain companion, never trained on with RL): ``A374+458=`` → ``0832;``, or,
in the form the library's math reward judges, ``\\boxed{0832}`` (:func:`addition_completion`;
math-verify reads ``0832`` as 832).

Everything is deterministic given a seed; no file or network access. Importing this module
(or :mod:`lit_rlvr.demo`) registers the ``countdown`` reward beside ``math`` and ``sql``, so the
scorer pool, statuses and maj@k treat it like any other reward (the demo configs list
``imports: [lit_rlvr.demo]``).
"""

from __future__ import annotations

import itertools
import random
import re
from functools import lru_cache

from lit_rlvr.rewards.base import STATUS_NO_ANSWER, STATUS_OK, ScoreResult, gold_error, register_reward

OPS = "+-*"
_COUNTDOWN_PROMPT = re.compile(r"^C([1-9]{3})=(\d{3}):$")
_EXPRESSION = re.compile(r"^([1-9])([+\-*])([1-9])([+\-*])([1-9])$")


def evaluate(expr: str) -> int | None:
    """Value of a ``d op d op d`` expression with normal precedence, or None if malformed.

    Example:
        >>> evaluate("3*7+5"), evaluate("3+7*5"), evaluate("3+7"), evaluate("3/7+5")
        (26, 38, None, None)
    """
    m = _EXPRESSION.match(expr)
    if m is None:
        return None
    a, op1, b, op2, c = int(m[1]), m[2], int(m[3]), m[4], int(m[5])
    if op2 == "*" and op1 != "*":  # b*c binds first
        return _apply(a, op1, b * c)
    return _apply(_apply(a, op1, b), op2, c)


def _apply(x: int, op: str, y: int) -> int:
    return x + y if op == "+" else x - y if op == "-" else x * y


@lru_cache(maxsize=1)
def solutions() -> dict[tuple[str, int], tuple[str, ...]]:
    """Every reachable (sorted digits, target 0–999) pair and all its valid expressions."""
    table: dict[tuple[str, int], set[str]] = {}
    for digits in itertools.combinations_with_replacement("123456789", 3):
        for perm in set(itertools.permutations(digits)):
            for op1, op2 in itertools.product(OPS, repeat=2):
                expr = f"{perm[0]}{op1}{perm[1]}{op2}{perm[2]}"
                value = evaluate(expr)
                if 0 <= value <= 999:
                    table.setdefault(("".join(digits), value), set()).add(expr)
    return {key: tuple(sorted(v)) for key, v in sorted(table.items())}


def countdown_prompt(digits: str, target: int) -> str:
    """``C{digits}={target:03d}:`` (digits in the given order)."""
    return f"C{digits}={target:03d}:"


def countdown_reward(completion: str, answer: str, **row) -> float:
    """1.0 if the completion's expression (up to the first ``;``) uses the row's digits once each
    and evaluates to the target ``answer``; else 0.0.

    Args:
        completion: model output, e.g. ``"3*7+5;"``.
        answer: the target as a string (``"26"`` or ``"026"``).
        row: must carry ``digits`` (the three digits, any order).

    Raises:
        GoldAnswerError: if the gold row is malformed (data error), naming the row id.

    Example:
        >>> countdown_reward("3*7+5;", "26", digits="375"), countdown_reward("3*7+5;", "27", digits="375")
        (1.0, 0.0)
        >>> countdown_reward("5+3*7;junk", "26", digits="735"), countdown_reward("3*7+5", "26", digits="375")
        (1.0, 0.0)
    """
    check_countdown_gold(answer, **row)
    digits = str(row["digits"])
    expr, sep, _ = completion.strip().partition(";")
    if not sep:
        return 0.0
    value = evaluate(expr)
    if value is None or sorted(expr[::2]) != sorted(digits):
        return 0.0
    return float(value == int(answer))


def check_countdown_gold(answer, **row) -> None:
    """Raise :class:`~lit_rlvr.rewards.GoldAnswerError` unless the row has 3 digits 1–9 and an integer target.

    Example:
        >>> check_countdown_gold("26", id="c1", digits="375")
        >>> check_countdown_gold("x", id="c2", digits="375")
        Traceback (most recent call last):
        ...
        lit_rlvr.rewards.base.GoldAnswerError: row id='c2': malformed gold for countdown (digits='375', answer='x')
    """
    digits = str(row.get("digits", ""))
    if not re.fullmatch(r"[1-9]{3}", digits) or not str(answer).strip().isdigit():
        raise gold_error(row, f"malformed gold for countdown (digits={digits!r}, answer={answer!r})")


def countdown_score(completion: str, answer: str, **row) -> ScoreResult:
    """The ``countdown`` reward: :func:`countdown_reward` with a status (``no_answer`` without ``;``).

    Example:
        >>> countdown_score("3*7+5;", "26", id="c1", digits="375")
        ScoreResult(reward=1.0, status='ok')
        >>> countdown_score("3*7+5", "26", id="c1", digits="375")
        ScoreResult(reward=0.0, status='no_answer')
    """
    if ";" not in completion:
        check_countdown_gold(answer, **row)
        return ScoreResult(0.0, STATUS_NO_ANSWER)
    return ScoreResult(countdown_reward(completion, answer, **row), STATUS_OK)


def countdown_answer_key(completion: str, **row) -> str | None:
    """The expression itself (distinct correct expressions are the task's diversity).

    Example:
        >>> countdown_answer_key(" 3*7+5;junk"), countdown_answer_key("3*7")
        ('3*7+5', None)
    """
    expr, sep, _ = completion.strip().partition(";")
    return expr if sep else None


register_reward("countdown", answer_key=countdown_answer_key, check_gold=check_countdown_gold)(countdown_score)


def addition_prompt(a: int, b: int, width: int = 3) -> str:
    """``A{a}+{b}=`` with zero-padded operands."""
    return f"A{a:0{width}d}+{b:0{width}d}="


def addition_answer(a: int, b: int, width: int = 3) -> str:
    """The sum, zero-padded to ``width + 1`` digits, ending with ``;``."""
    return f"{a + b:0{width + 1}d};"


def addition_completion(a: int, b: int, width: int = 3) -> str:
    """The sum, zero-padded to ``width + 1`` digits, in ``\\boxed{}`` so ``REWARDS["math"]`` judges it.

    Example:
        >>> addition_completion(374, 458), addition_completion(3, 4, width=2)
        ('\\\\boxed{0832}', '\\\\boxed{007}')
    """
    return f"\\boxed{{{a + b:0{width + 1}d}}}"


def split_countdown(seed: int = 0, holdout: float = 0.1) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Deterministic train / held-out split of the reachable (digits, target) pairs."""
    pairs = list(solutions())
    random.Random(seed).shuffle(pairs)
    n_hold = max(1, round(holdout * len(pairs)))
    return sorted(pairs[n_hold:]), sorted(pairs[:n_hold])
