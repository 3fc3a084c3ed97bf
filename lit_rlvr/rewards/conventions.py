"""Reward functions written for TRL or verl, called as they are, one completion at a time, in the workers.

A user moving from TRL or verl names their function by import path in ``model.scoring.reward_funcs``
(``my_pkg.rewards.accuracy_reward``, ``my_pkg/rewards.py:accuracy_reward`` or, verl's
``custom_reward_function.path`` + ``.name``, ``path/to/reward.py:compute_score``), or in Python
passes the function itself, and lit_rlvr calls it with its own signature, told apart by its
parameter names (:data:`CONVENTIONS`):

=========  =====================================================================  ==========================
name       signature                                                              returns
=========  =====================================================================  ==========================
``trl``    ``f(prompts, completions, completion_ids, trainer_state, **columns)``  ``list[float | None]``
``verl``   ``compute_score(data_source, solution_str, ground_truth, extra_info)``  ``float`` or ``{"score": …}``
``native`` ``fn(completion, answer, **row)`` (lit_rlvr's own)                      ``float | ScoreResult | None``
=========  =====================================================================  ==========================

A function gets the arguments of its convention that its signature takes (all of them with
``**kwargs``): TRL's ``get_repetition_penalty_reward`` builds an ``f(completion_ids, **kwargs)``, and
verl's built-in scorers (``gsm8k.compute_score(solution_str, ground_truth, method, format_score,
score)``, which verl's ``default_compute_score`` routes to by ``data_source``) take neither
``data_source`` nor ``extra_info``. At start-up the call is bound to the signature on the first row,
so a function that needs an argument the rows do not give stops the run before any generation. A
factory (annotated ``-> Callable``: TRL's ``get_soft_overlong_punishment(max_completion_len,
soft_punish_cache)``) is called once with its options and the function it returns is the reward.

Either kind may be ``async def``; it is awaited on one event loop per worker (TRL keeps one loop for
the run too). ``None`` means "not applicable to this row" (status ``not_applicable``), left out of
the weighted sum as TRL does (:class:`~lit_rlvr.rewards.combine.RewardMix`). Any finite number is
accepted (:attr:`~lit_rlvr.rewards.base.Reward.value_range`).

Where this departs from TRL and verl, and why:

- **One completion per call.** TRL calls each function once per batch with lists; here each
  completion is its own call with lists of length one (``prompts=[p]``, ``completions=[c]``, each
  column ``[v]``), inside the killable workers under the per-item deadline, so a reward that
  raises, hangs or crashes costs its completion only (status ``error`` / ``timeout``), never the
  step. A function that compares the completions of a batch (normalises or ranks across it) would
  silently see batches of one: name it in ``model.scoring.whole_batch`` and it is called once per
  batch as TRL calls it (:meth:`RewardFunc.score_batch`), in the training process. An async
  function that calls a service runs one call per worker at a time (raise
  ``model.scoring.workers`` for more in flight).
- **Python callables** reach the workers pickled: a module-level function by reference, an object
  (TRL's reward classes) by value. A lambda, a closure or anything of ``__main__`` cannot be, and is
  scored in the training process, with a warning that says why
  (:class:`~lit_rlvr.rewards.BatchScorer`).
- **What TRL passes that cannot cross into a worker**: ``trainer_state`` is a
  :class:`TrainerState` with ``global_step``, ``epoch`` and ``max_steps`` (not transformers'
  object); ``log_extra``, ``log_metric`` and ``environments`` are not passed (TRL's own reward
  functions default them to None).
- **verl**: ``extra_info`` is the row's ``extra_info`` (a copy; a row whose ``extra_info`` is not a
  dict is refused at start-up), without the ``num_turns`` and ``rollout_reward_scores`` that verl's
  reward manager adds for agent loops; a dict result gives its ``score`` (verl logs its other keys,
  lit_rlvr does not).

The function is imported once per process: in the parent at start-up (so a wrong path or an
unknown signature stops the run before any generation) and in each worker when the
:class:`RewardFunc` arrives there, before its first item's deadline starts.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lit_rlvr.plugins import load_function
from lit_rlvr.rewards.base import (
    STATUS_ERROR,
    STATUS_OK,
    STATUS_TIMEOUT,
    Reward,
    RewardTimeout,
    ScoreResult,
    as_result,
    deadline,
    error_result,
)

UNBOUNDED = (-math.inf, math.inf)  # value range of imported functions: any finite number


@dataclass(frozen=True)
class TrainerState:
    """What a TRL reward function may read from ``trainer_state`` (the subset of transformers'
    ``TrainerState`` that describes progress), picklable so it reaches the workers.

    Attributes:
        global_step: optimizer steps taken so far.
        epoch: the current epoch (0-based).
        max_steps: the run's ``trainer.max_steps`` (-1 when bounded by epochs instead).
    """

    global_step: int = 0
    epoch: int = 0
    max_steps: int = -1

    @classmethod
    def of(cls, trainer: Any | None) -> TrainerState:
        """The progress of a Lightning ``trainer`` (None: not attached, the start)."""
        return cls() if trainer is None else cls(trainer.global_step, trainer.current_epoch, trainer.max_steps)


@dataclass(frozen=True)
class Convention:
    """How to call one family of reward functions.

    Attributes:
        name: ``trl``, ``verl`` or ``native``.
        signature: the signature, for messages.
        marks: parameter names of which one identifies the family (``completions`` for TRL).
        arguments: ``arguments(completions, answers, rows) -> (args, kwargs)``: the call for B
            completions (B = 1 unless ``batched``); ``rows`` are the prompt rows less ``answer``.
            Raises ``TypeError`` for a row the family cannot be called with.
        unpack: ``unpack(out, B) -> list``: the function's return value as B raw results.
        batched: whether one call may take several completions (TRL's lists).
    """

    name: str
    signature: str
    marks: tuple[str, ...]
    arguments: Callable[[list[str], list, list[dict]], tuple[tuple, dict]]
    unpack: Callable[[Any, int], list]
    batched: bool = False


def _trl_arguments(completions: list[str], answers: list, rows: list[dict]) -> tuple[tuple, dict]:
    """TRL's ``f(prompts, completions, completion_ids, trainer_state, **columns)`` on B completions.

    A conversational prompt (a list of messages) gets its completion as one assistant message,
    as TRL gives it; every other row field but lit_rlvr's routing key (``reward``) is a column,
    ``answer`` among them where a row has a gold.
    """
    rows = [dict(row) for row in rows]
    prompts = [row.pop("prompt", None) for row in rows]
    completion_ids = [row.pop("completion_ids", None) for row in rows]
    states = [row.pop("trainer_state", None) for row in rows]
    for row, answer in zip(rows, answers):
        row.pop("reward", None)
        if answer is not None:
            row["answer"] = answer
    names = list(dict.fromkeys(k for row in rows for k in row))  # every column, in first-seen order
    columns = {k: [row.get(k) for row in rows] for k in names}
    completions = [
        [{"role": "assistant", "content": c}] if isinstance(p, list) else c for c, p in zip(completions, prompts)
    ]
    state = states[0] if states and states[0] is not None else TrainerState()
    return (), {  # TRL's own arguments over a column of the same name (a column 'completions' is not the completions)
        **columns,
        "prompts": prompts,
        "completions": completions,
        "completion_ids": completion_ids,
        "trainer_state": state,
    }


def _unpack_trl(out, size: int) -> list:
    if not isinstance(out, (list, tuple)) or len(out) != size:
        raise TypeError(
            f"a TRL reward function returns one value per completion; for {size} completion(s) it returned {out!r:.80}"
        )
    return list(out)


def _verl_arguments(completions: list[str], answers: list, rows: list[dict]) -> tuple[tuple, dict]:
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)``, by keyword as verl calls it.

    Raises:
        TypeError: the row's ``extra_info`` is not a mapping (verl's rows carry a dict).
    """
    (completion,), (answer,), (row,) = completions, answers, rows
    extra_info = row.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, Mapping):
        raise TypeError(
            f"row {row.get('id')!r}: extra_info must be a dict, as verl's rows carry it; "
            f"got a {type(extra_info).__name__} {extra_info!r:.60}"
        )
    kwargs = {
        "data_source": row.get("data_source"),
        "solution_str": completion,
        "ground_truth": answer,
        "extra_info": dict(extra_info or {}),
    }
    return (), kwargs


def _unpack_verl(out, size: int) -> list:
    if isinstance(out, Mapping):
        if "score" not in out:
            raise TypeError(f"a verl compute_score that returns a dict must give 'score'; got keys {sorted(out)}")
        return [out["score"]]
    return [out]


def _native_arguments(completions: list[str], answers: list, rows: list[dict]) -> tuple[tuple, dict]:
    (completion,), (answer,), (row,) = completions, answers, rows
    return (completion, answer), dict(row)


def _unpack_one(out, size: int) -> list:
    return [out]


CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in (
        Convention(
            "verl",
            "compute_score(data_source, solution_str, ground_truth, extra_info)",
            ("solution_str",),
            _verl_arguments,
            _unpack_verl,
        ),
        Convention(
            "trl",
            "f(prompts, completions, completion_ids, trainer_state, **columns)",
            ("completions", "completion_ids", "prompts"),
            _trl_arguments,
            _unpack_trl,
            batched=True,
        ),
        Convention("native", "fn(completion, answer, **row)", ("completion",), _native_arguments, _unpack_one),
    )
}
"""The calling conventions, tried in this order: the first whose mark is a parameter name wins."""


def _parameters(fn: Callable) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def detect_convention(fn: Callable, ref: str = "") -> str:
    """The :data:`CONVENTIONS` name of ``fn`` from its parameter names (a callable object's are its ``__call__``'s).

    Example:
        >>> def accuracy(completions, solution, **kwargs): ...
        >>> def compute_score(data_source, solution_str, ground_truth, extra_info=None): ...
        >>> def overlong(completion_ids, **kwargs): ...
        >>> detect_convention(accuracy), detect_convention(compute_score), detect_convention(overlong)
        ('trl', 'verl', 'trl')
        >>> detect_convention(lambda text, gold: 1.0, "my.reward")
        Traceback (most recent call last):
        ...
        ValueError: reward function 'my.reward' has parameters ['text', 'gold'], which match no known signature; accepted: trl: f(prompts, completions, completion_ids, trainer_state, **columns); verl: compute_score(data_source, solution_str, ground_truth, extra_info); native: fn(completion, answer, **row); or a factory annotated `-> Callable` that builds one from the options
    """
    params = _parameters(fn)
    for convention in CONVENTIONS.values():
        if any(mark in params for mark in convention.marks):
            return convention.name
    accepted = "; ".join(
        f"{c.name}: {c.signature}" for c in (CONVENTIONS["trl"], CONVENTIONS["verl"], CONVENTIONS["native"])
    )
    raise ValueError(
        f"reward function {ref or callable_name(fn)!r} has parameters {params}, which match no known signature; "
        f"accepted: {accepted}; or a factory annotated `-> Callable` that builds one from the options"
    )


def callable_name(fn: Callable) -> str:
    """A reward function's name, as TRL's ``get_callable_name`` gives it (what logs and ``correctness`` use).

    Example:
        >>> import functools, operator
        >>> callable_name(operator.add), callable_name(functools.partial(operator.add, 1)), callable_name(lambda: 0)
        ('add', 'add', '<lambda>')
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def callable_source(fn: Callable) -> str:
    """Where a callable comes from, ``module:qualified name`` (of its class, for a callable object):
    what records and messages name a reward given in Python by.

    Example:
        >>> import operator
        >>> callable_source(operator.add), callable_source(lambda: 0)
        ('_operator:add', 'lit_rlvr.rewards.conventions:<lambda>')
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', None) or '?'}:{target.__qualname__}"


PYTHON_ONLY = "<python object, not importable: {}>"
"""How :func:`reward_reference` writes a reward that only existed in the Python process (a lambda,
a closure, an object): plain data a checkpoint can hold, refused with advice if configured again."""


def reward_reference(fn: Callable) -> str:
    """A ``reward_funcs`` entry as plain data: the import path of a module-level function (or of a
    ``__main__`` one, importable again by the same script), else :data:`PYTHON_ONLY`.

    Example:
        >>> import operator
        >>> reward_reference(operator.add), reward_reference(lambda c, a: 1.0)
        ('_operator:add', '<python object, not importable: lit_rlvr.rewards.conventions:<lambda>>')
    """
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and qualname and "<" not in qualname and not isinstance(fn, functools.partial):
        target = sys.modules.get(module)
        for part in qualname.split("."):
            target = getattr(target, part, None)
        if target is fn:
            return f"{module}:{qualname}"
    return PYTHON_ONLY.format(callable_source(fn))


def is_factory(fn: Callable) -> bool:
    """Whether ``fn`` builds a reward function rather than being one: annotated to return a
    ``Callable`` (TRL's ``get_soft_overlong_punishment(max_completion_len, soft_punish_cache) -> Callable``).

    Example:
        >>> from collections.abc import Callable
        >>> def make(scale: float) -> Callable: ...
        >>> is_factory(make), is_factory(len)
        (True, False)
    """
    try:
        annotation = inspect.signature(fn).return_annotation
    except (TypeError, ValueError):
        return False
    if isinstance(annotation, str):
        return annotation.split("[", 1)[0].rsplit(".", 1)[-1] == "Callable"
    return annotation is Callable or getattr(annotation, "__origin__", None) is Callable  # also typing.Callable[...]


def is_async(fn: Callable) -> bool:
    """Whether calling ``fn`` returns a coroutine (functions, partials and callable objects; TRL's test).

    Example:
        >>> async def judge(completions, **kwargs): ...
        >>> is_async(judge), is_async(len)
        (True, False)
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 (an async __call__)


_LOOP: list[asyncio.AbstractEventLoop] = []  # this process's event loop for async reward functions


def _await(awaitable):
    """Run ``awaitable`` to completion on this process's loop (a fresh one if the last was interrupted)."""
    if not _LOOP or _LOOP[0].is_closed():
        _LOOP[:] = [asyncio.new_event_loop()]
    loop = _LOOP[0]
    try:
        return loop.run_until_complete(awaitable)
    except BaseException:  # a deadline or an error inside: the loop may hold a half-run task; start afresh next time
        _LOOP.clear()
        loop.close()
        raise


class RewardFunc:
    """The ``score`` of a :class:`~lit_rlvr.rewards.base.Reward` record that calls a TRL, verl or
    native function in its own convention, one completion at a time (module docstring), or a
    whole batch at once (:meth:`score_batch`, TRL's functions).

    The function is given by import path (YAML) or as a Python callable (a function, a callable
    object, a ``functools.partial``). A factory (annotated ``-> Callable``, as TRL's
    ``get_soft_overlong_punishment``) is called once with ``options`` and the function it builds
    is the reward. Only the arguments the function's signature accepts are passed (all of them
    when it takes ``**kwargs``): verl's own scorers (``gsm8k.compute_score(solution_str,
    ground_truth, method, format_score, score)``) take neither ``data_source`` nor ``extra_info``.

    Pickles as its import path, or as the callable itself (a module-level function by
    reference, an object by value): the worker rebuilds it when the record arrives.

    Args:
        source: the import path (``pkg.mod.fn``, ``pkg.mod:fn``, ``file.py:fn``) or the callable.
        convention: a :data:`CONVENTIONS` name (None: detected from the parameter names).
        options: keyword arguments added to every call (verl's ``custom_reward_function.reward_kwargs``;
            ``model.scoring.options.<name>``), or a factory's arguments.

    Example:
        >>> f = RewardFunc("lit_rlvr.rewards.conventions._doc_trl_reward")
        >>> f.convention, f("the answer is 4", "4", id="q", prompt="2+2?")
        ('trl', ScoreResult(reward=1.0, status='ok'))
        >>> f("I cannot tell", None, id="q", prompt="2+2?")
        ScoreResult(reward=0.0, status='not_applicable', reason='the reward returned None')
    """

    def __init__(self, source: str | Callable, convention: str | None = None, options: Mapping[str, Any] | None = None):
        self.source, self.options = source, dict(options or {})
        self.ref = source if isinstance(source, str) else None
        fn = load_function(source, "reward function") if self.ref is not None else source
        if not callable(fn):
            raise TypeError(f"a reward function must be callable; got a {type(fn).__name__} {fn!r:.60}")
        label = self.ref or callable_name(fn)
        self.factory = is_factory(fn) and not _matches_a_convention(fn)
        if self.factory:  # TRL's get_soft_overlong_punishment(max_completion_len, soft_punish_cache) -> Callable
            try:
                fn = fn(**self.options)
            except TypeError as err:
                raise ValueError(
                    f"reward factory {label!r} cannot be called with options {self.options}: {err}"
                ) from err
        self.fn = fn
        self.call_options = {} if self.factory else self.options
        self.convention = convention or detect_convention(self.fn, label)
        if self.convention not in CONVENTIONS:
            raise ValueError(
                f"reward function {label!r}: unknown convention {self.convention!r}; accepted: {sorted(CONVENTIONS)}"
            )
        self.is_async = is_async(self.fn)
        params = inspect.signature(self.fn).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._accepted = None if takes_any else frozenset(params)  # None: every argument
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self._positional = [name for name, p in params.items() if p.kind in positional]

    @property
    def name(self) -> str:
        """What logs and ``correctness`` call it: TRL's name for the function (a factory's product's)."""
        return callable_name(self.fn)

    def __getstate__(self) -> dict:
        return {"source": self.source, "convention": self.convention, "options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["source"], state["convention"], state["options"])

    def __eq__(self, other) -> bool:
        return isinstance(other, RewardFunc) and self.__getstate__() == other.__getstate__()

    def __hash__(self) -> int:
        return hash((self.ref or id(self.source), self.convention))

    def __repr__(self) -> str:
        return f"RewardFunc({self.ref or self.source!r}, {self.convention!r})"

    def _call(self, completions: list[str], answers: list, rows: list[dict]):
        """The function on these items (its raw return value, awaited)."""
        args, kwargs = CONVENTIONS[self.convention].arguments(completions, answers, rows)
        kwargs = self._without_collisions(args, kwargs)
        out = self.fn(*args, **kwargs, **self.call_options)
        return _await(out) if inspect.isawaitable(out) else out

    def _without_collisions(self, args: tuple, kwargs: dict) -> dict:
        """The keyword arguments the function accepts, less a row field named like an argument the
        call already gives: one of ``args``' parameters or a configured option (``call_options``)."""
        taken = {*self._positional[: len(args)], *self.call_options}
        return {k: v for k, v in kwargs.items() if k not in taken and (self._accepted is None or k in self._accepted)}

    def __call__(self, completion: str, answer: Any, *, timeout_s: float | None = None, **row) -> ScoreResult:
        try:
            with deadline(timeout_s):
                out = self._call([completion], [answer], [row])
        except RewardTimeout as e:
            return ScoreResult(0.0, STATUS_TIMEOUT, str(e))
        return as_value(CONVENTIONS[self.convention].unpack(out, 1)[0])

    def score_batch(
        self, completions: list[str], rows: list[dict], timeout_s: float | None = None
    ) -> list[ScoreResult]:
        """Every completion in one call, as TRL calls its reward functions (a function that compares
        the completions of a batch); a failure or the deadline costs the whole batch.

        Args:
            completions: B completion texts.
            rows: B prompt rows (with ``answer``, ``completion_ids``, ``trainer_state``).
            timeout_s: the deadline of the whole call (interrupts Python code only).

        Returns:
            B results; all ``error`` (with the exception) or all ``timeout`` when the call fails.
        """
        if not CONVENTIONS[self.convention].batched:
            raise ValueError(
                f"reward function {self.ref or self.name!r} ({self.convention}) takes one completion per call"
            )
        if not completions:
            return []
        answers = [row.get("answer") for row in rows]
        try:
            with deadline(timeout_s):
                out = self._call(
                    list(completions), answers, [{k: v for k, v in row.items() if k != "answer"} for row in rows]
                )
            values = CONVENTIONS[self.convention].unpack(out, len(completions))
        except RewardTimeout as e:
            return [ScoreResult(0.0, STATUS_TIMEOUT, str(e))] * len(completions)
        except Exception as e:
            return [error_result(e)] * len(completions)
        return [as_value(v) for v in values]

    def check_call(self, row: dict) -> None:
        """Raise ``TypeError`` unless the function can be called on ``row`` (an item row: the
        prompt row with ``answer`` and what the mix adds): the arguments its convention builds
        bind to its signature. Nothing is called; run at start-up on the first row.

        Example:
            >>> def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0): ...
            >>> RewardFunc(compute_score).check_call({"id": "g/0", "answer": "4", "data_source": "openai/gsm8k"})
            >>> def needs_tests(completions, tests): ...
            >>> RewardFunc(needs_tests).check_call({"id": "g/0", "prompt": "p"})
            Traceback (most recent call last):
            ...
            TypeError: missing a required argument: 'tests'
        """
        rest = {k: v for k, v in row.items() if k != "answer"}
        args, kwargs = CONVENTIONS[self.convention].arguments([""], [row.get("answer")], [rest])
        kwargs = self._without_collisions(args, kwargs)
        inspect.signature(self.fn).bind(*args, **kwargs, **self.call_options)

    def check_row(self, row: dict) -> None:
        """Raise ``TypeError`` for a row whose fields the convention refuses (verl: an ``extra_info``
        that is not a dict); cheap enough for every row at start-up."""
        CONVENTIONS[self.convention].arguments([""], [None], [row])


def _matches_a_convention(fn: Callable) -> bool:
    params = _parameters(fn)
    return any(mark in params for c in CONVENTIONS.values() for mark in c.marks)


def as_value(out: Any) -> ScoreResult:
    """One imported function's value as a :class:`ScoreResult`: None → ``not_applicable``, a number
    → ``ok`` (bools count as 0/1), a ``ScoreResult`` as it is; anything else is an ``error`` that says what came.

    Example:
        >>> as_value(None).status, as_value(True), as_value("1.0").reason
        ('not_applicable', ScoreResult(reward=1.0, status='ok'), "returned a str ('1.0'), not a number or None")
    """
    if out is None or isinstance(out, ScoreResult):
        return as_result(out)
    if isinstance(out, numbers.Real):  # also numpy scalars
        return ScoreResult(float(out), STATUS_OK)
    if hasattr(out, "item") and getattr(out, "ndim", None) == 0:  # a 0-d tensor or array, a numpy bool
        return ScoreResult(float(out.item()), STATUS_OK)
    return ScoreResult(0.0, STATUS_ERROR, f"returned a {type(out).__name__} ({out!r:.40}), not a number or None")


def imported_reward(name: str, source: str | Callable | RewardFunc, options: Mapping[str, Any] | None = None) -> Reward:
    """A :class:`~lit_rlvr.rewards.base.Reward` record named ``name`` that calls the function at
    ``source`` (an import path, a callable, or a :class:`RewardFunc` already built) in its own
    convention, any finite value accepted.

    Example:
        >>> imported_reward("acc", "lit_rlvr.rewards.conventions._doc_trl_reward").value_range
        (-inf, inf)
    """
    func = source if isinstance(source, RewardFunc) else RewardFunc(source, options=options)
    return Reward(name, func, takes_timeout=True, value_range=UNBOUNDED)


def _doc_trl_reward(prompts, completions, completion_ids, trainer_state, answer=None, **kwargs):
    """A TRL-style reward for this module's doctests: 1 if the gold is in the completion, None without a gold."""
    return [None if a is None else float(a in c) for c, a in zip(completions, answer or [None] * len(completions))]
