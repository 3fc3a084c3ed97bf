"""The reward registry, the per-item result type, and the deadline shared by math and SQL scoring.

Every reward is one :class:`Reward` record in :data:`REWARDS`, registered under one name with
everything lit_rlvr needs from it, so that all of it runs inside the killable reward workers:

- ``score(completion, answer, **options, **row) -> ScoreResult | float``: the verdict and *why*
  (:class:`ScoreResult`: ``reward`` in [0, 1], a ``status`` from :data:`STATUSES` and a
  ``reason``); the :class:`~lit_rlvr.rewards.BatchScorer` logs the statuses. A plain TRL-style
  ``fn(completion, answer, **row) -> float`` is a valid scorer.
- ``answer_key(completion, **options, **row) -> str | None``: a canonical final answer for
  majority voting (maj@k) and distinct answers; ``None`` means "no answer". Default: the
  stripped completion.
- ``check_gold(answer, **row)``: parses the gold once at start-up; raises
  :class:`GoldAnswerError` for a malformed gold (default: no check).

``REWARDS[name](completion, answer, **row) -> float`` calls the record, which is the plain
reward in [0, 1] of the cross-part contract.
"""

from __future__ import annotations

import ctypes
import inspect
import math
import numbers
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from lit_rlvr.registry import Registry

STATUS_OK = "ok"  # scored, right or wrong
STATUS_NO_ANSWER = "no_answer"  # nothing extractable
STATUS_TIMEOUT = "timeout"  # the deadline ran out
STATUS_REJECTED = "rejected"  # unsafe to evaluate (a power tower, a DROP statement): 0 without running it
STATUS_ERROR = "error"  # the evaluation failed (a crash in the parser, a worker that died, a malformed gold)
STATUS_NOT_APPLICABLE = (
    "not_applicable"  # the reward returned None: it does not judge this row (TRL's None), left out of the sum
)
STATUSES = (STATUS_OK, STATUS_NO_ANSWER, STATUS_TIMEOUT, STATUS_REJECTED, STATUS_ERROR, STATUS_NOT_APPLICABLE)


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """One scored completion.

    Attributes:
        reward: in the reward's :attr:`Reward.value_range` ([0, 1] unless it says otherwise).
        status: one of :data:`STATUSES` (``ok``, ``no_answer``, ``timeout``, ``rejected``, ``error``,
            ``not_applicable``: the reward returned None for this row; ``reward`` is then 0 and
            :class:`~lit_rlvr.rewards.combine.RewardMix` leaves it out of the sum).
        reason: why, for ``rejected``, ``error`` and ``timeout`` (empty for ``ok``).
        answer: the reward's canonical final answer (``answer_key``), when the scorer was asked
            for it (validation), else None.
        traceback: for an ``error`` that the reward raised, its traceback (the last lines), for
            the log; not compared.

    Example:
        >>> ScoreResult(0.0, "no_answer")
        ScoreResult(reward=0.0, status='no_answer')
        >>> ScoreResult(0.0, "rejected", "power tower").reason
        'power tower'
        >>> ScoreResult(1.0, "fine")
        Traceback (most recent call last):
        ...
        ValueError: ScoreResult.status must be one of ('ok', 'no_answer', 'timeout', 'rejected', 'error', 'not_applicable'); got 'fine'
    """

    reward: float
    status: str = STATUS_OK
    reason: str = ""
    answer: str | None = None
    traceback: str = field(default="", compare=False)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"ScoreResult.status must be one of {STATUSES}; got {self.status!r}")

    def __repr__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in ("reason", "answer") if getattr(self, k))
        return f"ScoreResult(reward={self.reward!r}, status={self.status!r}{extra})"


MAX_TRACEBACK_CHARS = 4000


def error_result(err: BaseException, reason: str | None = None) -> ScoreResult:
    """An ``error`` result for an exception the reward raised: the reason (``Type: message``, 200
    characters of the message) and the traceback's last :data:`MAX_TRACEBACK_CHARS` characters.

    Example:
        >>> try:
        ...     1 / 0
        ... except ZeroDivisionError as e:
        ...     r = error_result(e)
        >>> r, r.traceback.splitlines()[-1]
        (ScoreResult(reward=0.0, status='error', reason='ZeroDivisionError: division by zero'), 'ZeroDivisionError: division by zero')
    """
    text = "".join(traceback.format_exception(err))[-MAX_TRACEBACK_CHARS:]
    return ScoreResult(0.0, STATUS_ERROR, reason or f"{type(err).__name__}: {str(err)[:200]}", traceback=text)


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


def stripped_completion(completion: str, **row) -> str | None:
    """The default answer key: the completion without surrounding whitespace (None when empty).

    Example:
        >>> stripped_completion("  42 "), stripped_completion("   ")
        ('42', None)
    """
    return completion.strip() or None


@dataclass(frozen=True)
class Reward:
    """Everything lit_rlvr needs from one verifiable reward (module docstring).

    Calling the record is the plain reward: ``REWARDS["math"](completion, answer, **row) -> float``.
    Its options (what ``model.scoring.options.<name>`` may set) are the keyword-only parameters of
    ``score`` other than ``timeout_s``: ``REWARDS.options(name)``, checked by
    :meth:`~lit_rlvr.registry.Registry.get_checked` like every registry's.

    Attributes:
        name: the registry name (rows name it in their ``reward`` field).
        score: ``(completion, answer, **options, **row) -> ScoreResult | float``.
        answer_key: ``(completion, **options, **row) -> str | None``.
        check_gold: ``(answer, **row) -> None``, raising :class:`GoldAnswerError`; None = no check.
        takes_timeout: ``score`` accepts ``timeout_s`` (the scorer passes its deadline).
        value_range: the rewards ``score`` may return; a value outside (or not finite) is scored
            0 with status ``error``. [0, 1] for lit_rlvr's rewards; a TRL or verl function
            imported as it is (:class:`~lit_rlvr.rewards.conventions.RewardFunc`) may return any
            finite number (a format bonus of 0.5, verl DAPO's -1/+1).
        values: every value ``score`` returns, when they are few and known (``(0.0, 1.0)`` for
            ``math`` and ``sql``); None: any in ``value_range``. What start-up checks read: an
            advantage that needs binary rewards (``passk``), a correctness reward that can
            exceed 0.5.
    """

    name: str
    score: Callable[..., Any]
    answer_key: Callable[..., str | None] = stripped_completion
    check_gold: Callable[..., None] | None = None
    takes_timeout: bool = False
    value_range: tuple[float, float] = (0.0, 1.0)
    values: tuple[float, ...] | None = None

    def __call__(self, completion: str, answer: Any, **row) -> float:
        return as_result(self.score(completion, answer, **row)).reward


def not_a_reward(value: Any) -> str | None:
    """Why ``value`` is not a reward value (None when it is a real number: int, float, numpy scalar).

    Only real numbers are rewards: ``True`` and ``"1"`` are not 1.0 and a tensor is not a float,
    so each is refused with what it was rather than converted. The range ([0, 1], which also
    refuses NaN and inf) is checked by the scorer. A bare ``None`` never gets here
    (:func:`as_result`: not applicable); a ``ScoreResult`` whose reward is None is refused.

    Example:
        >>> [not_a_reward(v) for v in (1, 0.5, True, "1", None)]
        [None, None, 'a bool (True); return a float such as 1.0 or 0.0', "a str ('1'); return a float", 'None (no score)']
    """
    if value is None:
        return "None (no score)"
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):  # Python's and numpy's bool
        return f"a bool ({value!r}); return a float such as 1.0 or 0.0"
    if isinstance(value, numbers.Real):
        return None
    if type(value).__name__ == "Tensor":
        return f"a tensor ({value!r:.60}); return a float (tensor.item())"
    return f"a {type(value).__name__} ({value!r:.60}); return a float"


def as_result(out: Any) -> ScoreResult:
    """A scorer's return value as a :class:`ScoreResult`: a real number is an ``ok`` verdict; None,
    TRL's "this reward does not apply here", is ``not_applicable`` (left out of a weighted sum,
    counted in the step's status summary); anything else (:func:`not_a_reward`) is an ``error``
    naming what was returned.

    Example:
        >>> as_result(1.0), as_result(ScoreResult(0.0, "timeout"))
        (ScoreResult(reward=1.0, status='ok'), ScoreResult(reward=0.0, status='timeout'))
        >>> as_result(None).status
        'not_applicable'
        >>> as_result("1")
        ScoreResult(reward=0.0, status='error', reason="the reward returned a str ('1'); return a float")
    """
    if out is None:
        return ScoreResult(0.0, STATUS_NOT_APPLICABLE, "the reward returned None")
    value = out.reward if isinstance(out, ScoreResult) else out
    problem = not_a_reward(value)
    if problem is not None:
        return ScoreResult(0.0, STATUS_ERROR, f"the reward returned {problem}")
    return out if isinstance(out, ScoreResult) else ScoreResult(float(out), STATUS_OK)


def in_range(result: ScoreResult, value_range: tuple[float, float]) -> ScoreResult:
    """``result``, or an ``error`` when its reward is not finite or outside ``value_range``.

    Example:
        >>> in_range(ScoreResult(1.0), (0.0, 1.0)), in_range(ScoreResult(2.0), (0.0, 1.0)).reason
        (ScoreResult(reward=1.0, status='ok'), 'reward 2.0 outside [0, 1]')
    """
    lo, hi = value_range
    if math.isfinite(result.reward) and lo <= result.reward <= hi:  # also catches NaN
        return result
    return ScoreResult(0.0, STATUS_ERROR, f"reward {result.reward!r} outside [{lo:g}, {hi:g}]")


class RewardRegistry(Registry):
    """:class:`~lit_rlvr.registry.Registry` of :class:`Reward` records; ``timeout_s`` is injected.

    ``REWARDS.register(name, answer_key=..., check_gold=..., check=...)(fn)`` wraps a scorer (or a
    plain float reward function) in a record and returns ``fn`` unchanged, so TRL-style reward
    functions register as they are; the options are ``fn``'s keyword-only parameters.
    """

    kwargs_are_options = False  # a reward's **row is the prompt row, not options

    def __init__(self, kind: str = "reward", *, injected=("timeout_s",)):
        super().__init__(kind, injected=injected)

    def register(
        self,
        name: str,
        *,
        answer_key: Callable | None = None,
        check_gold: Callable | None = None,
        check: Callable[..., None] | None = None,
        values: Iterable[float] | None = None,
        trajectory: bool = False,
    ):
        def decorator(fn: Callable) -> Callable:
            if not callable(fn):
                raise TypeError(f"reward {name!r} must be callable; got {type(fn).__name__}")
            takes_timeout = "timeout_s" in inspect.signature(fn).parameters
            declared = None if values is None else tuple(sorted(float(v) for v in values))
            record = Reward(name, fn, answer_key or stripped_completion, check_gold, takes_timeout, values=declared)
            traits = {"trajectory": True} if trajectory else {}
            super(RewardRegistry, self).register(name, check=check, signature=fn, **traits)(record)
            return fn

        return decorator

    def add(self, record: Reward) -> Reward:
        """Add a whole :class:`Reward` record under its name (one built elsewhere, e.g. a
        :class:`~lit_rlvr.rewards.conventions.RewardFunc`'s); raises ``ValueError`` if the name is taken."""
        super().register(record.name, signature=record.score)(record)
        return record


REWARDS = RewardRegistry()


def register_reward(
    name: str,
    *,
    answer_key: Callable | None = None,
    check_gold: Callable | None = None,
    check: Callable[..., None] | None = None,
    values: Iterable[float] | None = None,
    trajectory: bool = False,
):
    """Register ``fn(completion, answer, **row) -> ScoreResult | float`` as reward ``name``.

    Args:
        name: the name rows give in their ``reward`` field.
        answer_key: canonical final answer for maj@k (default: the stripped completion).
        check_gold: gold parser run once per row at start-up; raises :class:`GoldAnswerError`.
        check: ``check(**options)`` raising ``ValueError`` for option values the reward refuses
            (called at start-up with the configured options over the defaults).
        values: every value the reward returns, when few and known (``(0, 1)`` for a pass/fail
            check): lets start-up refuse settings that cannot work with them (:attr:`Reward.values`).
        trajectory: the reward reads a multi-turn trajectory's behaviour: its rows get the
            trajectory's ``tool_calls`` (none for a single-turn completion), and it is scored beside
            an environment's own reward too (:mod:`~lit_rlvr.rewards.tools`).

    Example:
        >>> @register_reward("_doc_exact")
        ... def exact(completion, answer, *, strip: bool = True, **row):
        ...     return ScoreResult(float((completion.strip() if strip else completion) == answer), "ok")
        >>> REWARDS["_doc_exact"]("42 ", "42", id="x"), REWARDS["_doc_exact"].answer_key(" 42 "), REWARDS.options("_doc_exact")
        (1.0, '42', ['strip'])
        >>> _ = REWARDS.pop("_doc_exact")
    """
    return REWARDS.register(
        name, answer_key=answer_key, check_gold=check_gold, check=check, values=values, trajectory=trajectory
    )


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
