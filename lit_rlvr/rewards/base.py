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

import ctypes
import signal
import threading
import time
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

    In the main thread it uses ``setitimer(ITIMER_REAL)``; an interval timer that was already
    armed (e.g. pytest-timeout's) is suspended and re-armed afterwards with its remaining time
    (at once if it fell due meanwhile), its handler restored. In any other thread a watchdog
    thread raises the exception asynchronously in this one (``PyThreadState_SetAsyncExc``).
    Either way the exception arrives between bytecodes: it interrupts pure-Python work (sympy),
    but a single long C call (a huge integer power) finishes first — which is why math answers
    are screened before parsing and why the ``BatchScorer`` also kills workers. Regular
    expression searches check for signals, so the main-thread form also interrupts them; the
    watchdog cannot. The exception is re-raised every 50 ms until the block exits, in case the
    first one is swallowed. With ``timeout_s`` None or <= 0 it does nothing and yields ``False``.

    Example:
        >>> with deadline(1.0) as armed:
        ...     armed
        True
    """
    if timeout_s is None or timeout_s <= 0:
        yield False
        return
    if threading.current_thread() is not threading.main_thread():
        with _watchdog(timeout_s):
            yield True
        return
    state = {"active": True}

    def handler(signum, frame):
        if state["active"]:
            raise RewardTimeout(f"deadline of {timeout_s} s exceeded")

    previous = signal.signal(signal.SIGALRM, handler)
    other_delay, other_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s, 0.05)
    start = time.monotonic()
    try:
        yield True
    finally:
        state["active"] = False
        signal.setitimer(signal.ITIMER_REAL, 0.0, 0.0)
        signal.signal(signal.SIGALRM, previous)
        if other_delay > 0:
            signal.setitimer(signal.ITIMER_REAL, max(other_delay - (time.monotonic() - start), 1e-6), other_interval)


@contextmanager
def _watchdog(timeout_s: float) -> Iterator[None]:
    """:func:`deadline` without signals: a thread raises :class:`RewardTimeout` in this one."""
    target, lock, stop = threading.get_ident(), threading.Lock(), threading.Event()
    state = {"active": True}
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc

    def watch():
        wait = timeout_s
        while not stop.wait(wait):
            with lock:  # never raise once the block has exited
                if not state["active"]:
                    return
                set_async_exc(ctypes.c_ulong(target), ctypes.py_object(RewardTimeout))
            wait = 0.05

    threading.Thread(target=watch, name="reward-deadline", daemon=True).start()
    try:
        yield
    finally:
        with lock:
            state["active"] = False
            set_async_exc(ctypes.c_ulong(target), None)  # drop one raised but not yet delivered
        stop.set()
