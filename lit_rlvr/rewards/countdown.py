"""The countdown reward of the CPU demo task (:mod:`lit_rlvr.tasks.countdown`), registered beside
``math`` and ``sql`` so the scorer pool, statuses and maj@k treat it like any other reward."""

from __future__ import annotations

from lit_rlvr.rewards.base import ANSWER_KEYS, STATUS_NO_ANSWER, STATUS_OK, ScoreResult, register_reward
from lit_rlvr.tasks.countdown import countdown_reward


@register_reward("countdown")
def countdown(completion: str, answer: str, **row) -> ScoreResult:
    """1.0 for an expression (ending with ``;``) over the row's ``digits`` that equals ``answer``.

    Example:
        >>> countdown("3*7+5;", "26", id="c1", digits="375")
        ScoreResult(reward=1.0, status='ok')
        >>> countdown("3*7+5", "26", id="c1", digits="375")
        ScoreResult(reward=0.0, status='no_answer')
    """
    if ";" not in completion:
        return ScoreResult(0.0, STATUS_NO_ANSWER)
    return ScoreResult(countdown_reward(completion, answer, **row), STATUS_OK)


@ANSWER_KEYS.register("countdown")
def countdown_key(completion: str, **row) -> str | None:
    """The expression itself (distinct correct expressions are the task's diversity).

    Example:
        >>> countdown_key(" 3*7+5;junk"), countdown_key("3*7")
        ('3*7+5', None)
    """
    expr, sep, _ = completion.strip().partition(";")
    return expr if sep else None
