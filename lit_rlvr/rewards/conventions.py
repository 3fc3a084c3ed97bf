"""Reward functions written for TRL or verl, called as they are, one completion at a time, in the workers.

A user moving from TRL or verl names their function by import path in ``model.scoring.reward_funcs``
(``my_pkg.rewards.accuracy_reward``, ``my_pkg/rewards.py:accuracy_reward`` or, verl's
``custom_reward_function.path`` + ``.name``, ``path/to/reward.py:compute_score``) and lit_rlvr calls
it with its own signature, told apart by its parameter names (:data:`CONVENTIONS`):

=========  =====================================================================  ==========================
name       signature                                                              returns
=========  =====================================================================  ==========================
``trl``    ``f(prompts, completions, completion_ids, trainer_state, **columns)``  ``list[float | None]``
``verl``   ``compute_score(data_source, solution_str, ground_truth, extra_info)``  ``float`` or ``{"score": …}``
``native`` ``fn(completion, answer, **row)`` (lit_rlvr's own)                      ``float | ScoreResult | None``
=========  =====================================================================  ==========================

Either kind may be ``async def``; it is awaited on one event loop per worker (TRL keeps one loop for
the run too). ``None`` means "not applicable to this row" (status ``not_applicable``), left out of
the weighted sum as TRL does (:class:`~lit_rlvr.rewards.combine.RewardMix`). Any finite number is
accepted (:attr:`~lit_rlvr.rewards.base.Reward.value_range`).

Where this departs from TRL and verl, and why:

- **One completion per call.** TRL calls each function once per batch with lists; here each
  completion is its own call with lists of length one (``prompts=[p]``, ``completions=[c]``, each
  column ``[v]``), inside the killable workers under the per-item deadline, so a reward that
  raises, hangs or crashes costs its completion only (status ``error`` / ``timeout``), never the
  step. A function that needs the whole batch at once (normalising across it) does not fit; an
  async function that calls a service runs one call per worker at a time (raise
  ``model.scoring.workers`` for more in flight).
- **What TRL passes that cannot cross into a worker**: ``trainer_state`` is a
  :class:`TrainerState` with ``global_step``, ``epoch`` and ``max_steps`` (not transformers'
  object); ``log_extra``, ``log_metric`` and ``environments`` are not passed (TRL's own reward
  functions default them to None).
- **verl**: ``extra_info`` is the row's ``extra_info`` (a copy), without the ``num_turns`` and
  ``rollout_reward_scores`` that verl's reward manager adds for agent loops; a dict result gives
  its ``score`` (verl logs its other keys, lit_rlvr does not).

The function is imported once per process: in the parent at start-up (so a wrong path or an
unknown signature stops the run before any generation) and in each worker when the
:class:`RewardFunc` arrives there, before its first item's deadline starts.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_rlvr.rewards.base import (
    STATUS_ERROR,
    STATUS_OK,
    STATUS_TIMEOUT,
    Reward,
    RewardTimeout,
    ScoreResult,
    as_result,
    deadline,
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
        call: ``call(fn, completion, answer, row, options) -> result`` (maybe awaitable); ``row``
            is the prompt row less ``answer`` (a copy the call may change).
        unpack: the function's return value as one item's raw result (TRL: the list's only item).
    """

    name: str
    signature: str
    marks: tuple[str, ...]
    call: Callable[..., Any]
    unpack: Callable[[Any], Any]


def _call_trl(fn, completion: str, answer, row: dict, options: Mapping[str, Any]):
    """TRL's ``f(prompts, completions, completion_ids, trainer_state, **columns)`` on one completion.

    A conversational prompt (a list of messages) gets its completion as one assistant message,
    as TRL gives it; every other row field but lit_rlvr's routing key (``reward``) is a column.
    """
    prompt = row.pop("prompt", None)
    completion_ids = row.pop("completion_ids", None)
    state = row.pop("trainer_state", None) or TrainerState()
    row.pop("reward", None)
    if answer is not None:
        row["answer"] = answer
    completions = [[{"role": "assistant", "content": completion}]] if isinstance(prompt, list) else [completion]
    columns = {k: [v] for k, v in row.items()}
    return fn(prompts=[prompt], completions=completions, completion_ids=[completion_ids], trainer_state=state, **columns, **options)


def _unpack_trl(out):
    if not isinstance(out, (list, tuple)) or len(out) != 1:
        raise TypeError(f"a TRL reward function returns one value per completion; for one completion it returned {out!r:.80}")
    return out[0]


def _call_verl(fn, completion: str, answer, row: dict, options: Mapping[str, Any]):
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)``, by keyword as verl calls it."""
    extra_info = dict(row.get("extra_info") or {})
    return fn(data_source=row.get("data_source"), solution_str=completion, ground_truth=answer, extra_info=extra_info, **options)


def _unpack_verl(out):
    if isinstance(out, Mapping):
        if "score" not in out:
            raise TypeError(f"a verl compute_score that returns a dict must give 'score'; got keys {sorted(out)}")
        return out["score"]
    return out


def _call_native(fn, completion: str, answer, row: dict, options: Mapping[str, Any]):
    return fn(completion, answer, **row, **options)


def _same(out):
    return out


CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in (
        Convention("verl", "compute_score(data_source, solution_str, ground_truth, extra_info)", ("solution_str",), _call_verl, _unpack_verl),
        Convention("trl", "f(prompts, completions, completion_ids, trainer_state, **columns)", ("completions",), _call_trl, _unpack_trl),
        Convention("native", "fn(completion, answer, **row)", ("completion",), _call_native, _same),
    )
}
"""The calling conventions, tried in this order: the first whose mark is a parameter name wins."""


def detect_convention(fn: Callable, ref: str = "") -> str:
    """The :data:`CONVENTIONS` name of ``fn`` from its parameter names.

    Example:
        >>> def accuracy(completions, solution, **kwargs): ...
        >>> def compute_score(data_source, solution_str, ground_truth, extra_info=None): ...
        >>> detect_convention(accuracy), detect_convention(compute_score)
        ('trl', 'verl')
        >>> detect_convention(lambda text, gold: 1.0, "my.reward")
        Traceback (most recent call last):
        ...
        ValueError: reward function 'my.reward' has parameters ['text', 'gold'], which match no known signature; accepted: trl: f(prompts, completions, completion_ids, trainer_state, **columns); verl: compute_score(data_source, solution_str, ground_truth, extra_info); native: fn(completion, answer, **row)
    """
    target = fn.func if isinstance(fn, functools.partial) else fn
    try:
        params = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        params = []
    for convention in CONVENTIONS.values():
        if any(mark in params for mark in convention.marks):
            return convention.name
    accepted = "; ".join(f"{c.name}: {c.signature}" for c in (CONVENTIONS["trl"], CONVENTIONS["verl"], CONVENTIONS["native"]))
    raise ValueError(f"reward function {ref or fn!r} has parameters {params}, which match no known signature; accepted: {accepted}")


def is_import_path(ref: str) -> bool:
    """Whether a ``reward_funcs`` entry is an import path (``pkg.mod.fn``, ``file.py:fn``) rather
    than a registered reward's name (``math``).

    Example:
        >>> is_import_path("math"), is_import_path("my_pkg.rewards.accuracy"), is_import_path("r.py:compute_score")
        (False, True, True)
    """
    return "." in ref or ":" in ref


_LOADED: dict[str, Callable] = {}  # import path -> function, once per process


def load_function(ref: str, what: str = "reward function") -> Callable:
    """The function (or class) an import path names: ``pkg.mod.fn``, ``pkg.mod:fn`` or ``path/to/file.py:fn``.

    A ``.py`` file is imported by path (relative to the working directory), as verl's
    ``custom_reward_function.path`` is; every other form by module name (``imports``-style).
    ``what`` names it in errors (``"environment"`` for :mod:`lit_rlvr.envs`).

    Raises:
        ImportError: the module cannot be imported or has no such attribute, naming ``ref``.
        TypeError: what it names is not callable.

    Example:
        >>> load_function("operator.add")(2, 3)
        5
        >>> load_function("operator:nope")
        Traceback (most recent call last):
        ...
        ImportError: reward function 'operator:nope': module 'operator' has no attribute 'nope'
    """
    if ref in _LOADED:
        return _LOADED[ref]
    module_ref, sep, attr = ref.rpartition(":") if ":" in ref else ref.rpartition(".")
    if not module_ref or not attr:
        raise ImportError(f"{what} {ref!r}: expected 'package.module.function', 'package.module:function' or 'file.py:function'")
    try:
        module = _import_file(module_ref) if module_ref.endswith(".py") else importlib.import_module(module_ref)
    except ImportError as err:
        raise ImportError(f"{what} {ref!r}: {err}") from err
    except Exception as err:  # the module itself failing
        raise ImportError(f"{what} {ref!r}: importing {module_ref!r} raised {type(err).__name__}: {err}") from err
    if not hasattr(module, attr):
        raise ImportError(f"{what} {ref!r}: module {module_ref!r} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise TypeError(f"{what} {ref!r} is a {type(fn).__name__}, not a function")
    _LOADED[ref] = fn
    return fn


def _import_file(path: str):
    """Import a ``.py`` file as a module (once per resolved path), like verl's ``load_extern_object``."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ImportError(f"no file {str(file)!r}")
    name = f"lit_rlvr_user_reward_{hashlib.sha256(str(file).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, so its own functions pickle and dataclasses resolve
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def is_async(fn: Callable) -> bool:
    """Whether calling ``fn`` returns a coroutine (functions, partials and callable objects; TRL's test).

    Example:
        >>> async def judge(completions, **kwargs): ...
        >>> is_async(judge), is_async(len)
        (True, False)
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


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
    """The ``score`` of a :class:`~lit_rlvr.rewards.base.Reward` record that calls an imported
    function in its own convention, one completion at a time (module docstring).

    Pickles as its import path (the worker imports the function when the record arrives).

    Args:
        ref: the import path (``pkg.mod.fn``, ``pkg.mod:fn``, ``file.py:fn``).
        convention: a :data:`CONVENTIONS` name (None: detected from the parameter names).
        options: keyword arguments added to every call (verl's ``custom_reward_function.reward_kwargs``;
            ``model.scoring.options.<name>``).

    Example:
        >>> f = RewardFunc("lit_rlvr.rewards.conventions._doc_trl_reward")
        >>> f.convention, f("the answer is 4", "4", id="q", prompt="2+2?")
        ('trl', ScoreResult(reward=1.0, status='ok'))
        >>> f("I cannot tell", None, id="q", prompt="2+2?")
        ScoreResult(reward=0.0, status='not_applicable', reason='the reward returned None')
    """

    def __init__(self, ref: str, convention: str | None = None, options: Mapping[str, Any] | None = None):
        self.ref, self.options = ref, dict(options or {})
        self.fn = load_function(ref)
        self.convention = convention or detect_convention(self.fn, ref)
        if self.convention not in CONVENTIONS:
            raise ValueError(f"reward function {ref!r}: unknown convention {self.convention!r}; accepted: {sorted(CONVENTIONS)}")
        self.is_async = is_async(self.fn)

    def __getstate__(self) -> dict:
        return {"ref": self.ref, "convention": self.convention, "options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["ref"], state["convention"], state["options"])

    def __eq__(self, other) -> bool:
        return isinstance(other, RewardFunc) and self.__getstate__() == other.__getstate__()

    def __hash__(self) -> int:
        return hash((self.ref, self.convention))

    def __repr__(self) -> str:
        return f"RewardFunc({self.ref!r}, {self.convention!r})"

    def __call__(self, completion: str, answer: Any, *, timeout_s: float | None = None, **row) -> ScoreResult:
        convention = CONVENTIONS[self.convention]
        try:
            with deadline(timeout_s):
                out = convention.call(self.fn, completion, answer, dict(row), self.options)
                if inspect.isawaitable(out):
                    out = _await(out)
        except RewardTimeout as e:
            return ScoreResult(0.0, STATUS_TIMEOUT, str(e))
        return as_value(convention.unpack(out))


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


def imported_reward(name: str, ref: str, options: Mapping[str, Any] | None = None) -> Reward:
    """A :class:`~lit_rlvr.rewards.base.Reward` record named ``name`` that calls the function at
    ``ref`` in its own convention, any finite value accepted.

    Example:
        >>> imported_reward("acc", "lit_rlvr.rewards.conventions._doc_trl_reward").value_range
        (-inf, inf)
    """
    return Reward(name, RewardFunc(ref, options=options), takes_timeout=True, value_range=UNBOUNDED)


def _doc_trl_reward(prompts, completions, completion_ids, trainer_state, answer=None, **kwargs):
    """A TRL-style reward for this module's doctests: 1 if the gold is in the completion, None without a gold."""
    return [None if a is None else float(a in c) for c, a in zip(completions, answer or [None] * len(completions))]
