"""Reward registries, the per-item result type, and the deadline shared by math and SQL scoring.

Every reward exists in two forms built from one function:

- ``SCORERS[name](completion, answer, **row) -> ScoreResult`` says *why* an item scored what it
  did (``ok``, ``no_answer``, ``timeout``, ``error: …``); the :class:`~lit_rlvr.rewards.BatchScorer`
  logs these statuses.
- ``REWARDS[name](completion, answer, **row) -> float`` is the plain reward in [0, 1] of the
  cross-part contract (TRL-style small reward functions), i.e. ``SCORERS[name](...).reward``.

``ANSWER_KEYS[name](completion, **row) -> str | None`` maps a completion to a canonical final
answer for majority voting (maj@k); ``None`` means "no answer".
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps

from lit_rlvr.registry import Registry

REWARDS = Registry("reward")
SCORERS = Registry("reward scorer")
ANSWER_KEYS = Registry("answer key")

STATUS_OK = "ok"
STATUS_NO_ANSWER = "no_answer"
STATUS_TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """One scored completion: ``reward`` in [0, 1] and ``status`` — ``"ok"`` (scored, right or
    wrong), ``"no_answer"`` (nothing extractable), ``"timeout"``, or ``"error: <reason>"``.

    Example:
        >>> ScoreResult(0.0, "no_answer")
        ScoreResult(reward=0.0, status='no_answer')
    """

    reward: float
    status: str


class GoldAnswerError(ValueError):
    """The *gold* side of a row is unusable (malformed answer, missing/broken database): a data
    error, raised rather than scored, and always naming the row's ``id``."""


def gold_error(row: dict, message: str) -> GoldAnswerError:
    """Build a :class:`GoldAnswerError` that names ``row["id"]``.

    Example:
        >>> gold_error({"id": "gsm8k-7"}, "empty answer")
        GoldAnswerError("row id='gsm8k-7': empty answer")
    """
    return GoldAnswerError(f"row id={row.get('id')!r}: {message}")


def sanitize_text(text: str) -> str:
    """Replace lone UTF-16 surrogates (invalid in UTF-8) by ``?`` so regexes, sqlite and logs
    never choke on them; valid text is returned unchanged (same object).

    Example:
        >>> sanitize_text("x\\ud800y")
        'x?y'
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def register_reward(name: str) -> Callable[[Callable[..., ScoreResult]], Callable[..., ScoreResult]]:
    """Register a scorer ``fn(completion, answer, **row) -> ScoreResult`` in ``SCORERS`` and its
    float form in ``REWARDS`` under the same ``name``.

    Example:
        >>> @register_reward("_doc_exact")
        ... def exact(completion, answer, **row):
        ...     return ScoreResult(float(completion.strip() == answer), "ok")
        >>> REWARDS["_doc_exact"]("42 ", "42", id="x")
        1.0
        >>> _ = REWARDS.pop("_doc_exact"), SCORERS.pop("_doc_exact")
    """

    def decorator(scorer: Callable[..., ScoreResult]) -> Callable[..., ScoreResult]:
        SCORERS.register(name)(scorer)

        @wraps(scorer)
        def reward(completion: str, answer: str, **row) -> float:
            return scorer(completion, answer, **row).reward

        reward.__doc__ = f"``SCORERS[{name!r}](...).reward`` — see that scorer for details.\n\n" + (
            scorer.__doc__ or ""
        )
        REWARDS.register(name)(reward)
        return scorer

    return decorator


class RewardTimeout(BaseException):
    """Raised inside a :func:`deadline` block when time runs out. A ``BaseException`` (like
    ``KeyboardInterrupt``) so that library code's ``except Exception`` cannot swallow it."""


@contextmanager
def deadline(timeout_s: float | None) -> Iterator[bool]:
    """Raise :class:`RewardTimeout` in the block after ``timeout_s`` seconds of wall time.

    Uses ``setitimer(ITIMER_REAL)``, so it interrupts pure-Python work (sympy) but only in the main
    thread and only between bytecodes: a single long C call (a huge integer power) finishes first,
    which is why math answers are screened before parsing and why the ``BatchScorer`` also kills
    workers. The timer re-fires every 50 ms until the block exits, in case the first exception is
    swallowed. Off the main thread, with ``timeout_s`` None/<= 0, or when another ``ITIMER_REAL``
    is already armed, it does nothing and yields ``False``.

    Example:
        >>> with deadline(1.0) as armed:
        ...     armed
        True
    """
    usable = (
        timeout_s is not None
        and timeout_s > 0
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )
    if not usable:
        yield False
        return
    state = {"active": True}

    def handler(signum, frame):
        if state["active"]:
            raise RewardTimeout(f"deadline of {timeout_s} s exceeded")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, timeout_s, 0.05)
    try:
        yield True
    finally:
        state["active"] = False
        signal.setitimer(signal.ITIMER_REAL, 0.0, 0.0)
        signal.signal(signal.SIGALRM, previous)
