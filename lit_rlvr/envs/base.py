"""The environment protocol, its step record, and the registry a config names environments from.

An environment is the model's counterpart for one trajectory (one episode): the multi-turn
rollout loop (:mod:`lit_rlvr.rollout.turns`) makes one per trajectory, calls :meth:`~Environment.reset`
with the prompt's row, then alternates a model turn (one engine call, token in, token out) with
:meth:`~Environment.step` on that turn's text, until the environment says ``done`` or a limit
of the loop is reached. The protocol is the peers' common core:

- SkyRL's ``BaseTextEnv`` (``init(prompt)`` / ``step(action) -> {observations, reward, done,
  metadata}``): adapted as it is by :class:`~lit_rlvr.envs.skyrl.SkyRLEnvironment`;
- TRL's ``environment_factory`` (``reset(**row) -> str | None``, public methods as tools,
  ``get_reward()``): adapted by :class:`~lit_rlvr.envs.trl.TRLEnvironment`;
- verl's ``ToolAgentLoop`` tools (a tool call in, a tool response out).

Where it departs from them, and why:

- ``reset`` also gets the loop's ``max_turns`` (SkyRL passes it in the row's extras), so an
  environment can say how many turns are left and score the last one.
- The turn-ending strings of the protocol (``</sql>``) belong to the environment (:attr:`~Environment.stop`),
  not to a sampling config that must be kept in step with it.
- A step's observation is either text, appended to the trajectory as it is (SkyRL's
  ``use_conversation_multi_turn: false``), or chat messages, rendered with the tokenizer's chat
  template as a new turn (SkyRL's conversation format, TRL's tool messages): the type says which.
- The tool call a step made and whether it failed are typed fields (:class:`Step`), so the
  behaviour metrics (tool calls per trajectory, distinct call sequences) need no convention of
  ``info`` keys.
- :attr:`~Environment.version` is part of a multi-turn reference cache's identity: a cache
  sampled with another environment, or another version of it, is refused.
- An environment that reads the model's turn as tokens (a tool-call parser that needs the prompt
  before it, as TRL's ``parse_response``) defines ``step_tokens(action, ids, prefix)``, which the
  loop calls (with the turn's token ids and the trajectory's ids before it) instead of ``step``.

:class:`Environment` is every member the loop uses; :class:`EnvironmentBase` gives each optional
one its default (no stop strings, version ``"1"``, ``step_tokens`` → ``step``, nothing to close)
and keeps the episode's bookkeeping (the row, the turn count). An object that has only ``reset``
and ``step`` (a user's class not derived from :class:`EnvironmentBase`) is completed with the same
defaults once, when :meth:`EnvSpec.make` makes it (:class:`ForeignEnvironment`), so the loop calls
every member directly.

Environments are chosen by name like rewards are (:func:`resolve_environment`): a name registered
with :func:`register_environment` (by lit_rlvr, or by a plug-in module that ``imports:`` or a
``lit_rlvr.plugins`` entry point loads), or an import path ``package.module:Class`` /
``path/to/file.py:Class`` of a class written for lit_rlvr, skyrl-gym or TRL (recognised by its
methods).
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from lit_rlvr.plugins import is_import_path, load_function
from lit_rlvr.registry import Registry

Message = Mapping[str, Any]
Observation = str | list[Message]


@dataclass(frozen=True)
class Step:
    """What an environment answers to one model turn.

    Attributes:
        observation: appended to the trajectory before the next model turn (ignored when ``done``):
            text, tokenized as it is, or chat messages (``{"role": ..., "content": ...}``), rendered
            as a new turn with the chat template. ``""`` / ``[]``: nothing.
        reward: the trajectory's reward if the episode ends after this step: when ``done``, and
            also when the loop ends it here (the last turn, the token budget or the context), so a
            step that is not ``done`` gives what the episode has earned so far (SkyRL's running sum,
            TRL's ``get_reward()``, a format penalty for an episode cut before its answer). The
            latest step's reward is the trajectory's; None: the environment does not score, the
            reward functions score the trajectory's text.
        done: the episode is over.
        tool_call: the call this turn made, in a canonical form (e.g. the SQL query), or None when
            the turn called no tool; its sequence over a trajectory is its behaviour.
        tool_error: the call failed (an error, a refusal, a timeout), or the turn was an action the
            environment rejects as invalid (no well-formed call: ``tool_call`` None): counted as a
            tool error, and only a ``tool_call`` as a tool call.
        info: anything else, for logs.

    Example:
        >>> Step("<observation>3 rows</observation>", tool_call="SELECT name FROM singer")
        Step(observation='<observation>3 rows</observation>', reward=None, done=False, tool_call='SELECT name FROM singer', tool_error=False, info={})
        >>> Step(reward=float("nan"), done=True)
        Traceback (most recent call last):
        ...
        ValueError: Step.reward must be a finite number or None; got nan
    """

    observation: Observation = ""
    reward: float | None = None
    done: bool = False
    tool_call: str | None = None
    tool_error: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.reward is not None and (
            isinstance(self.reward, bool) or not isinstance(self.reward, (int, float)) or not math.isfinite(self.reward)
        ):
            raise ValueError(f"Step.reward must be a finite number or None; got {self.reward!r}")
        check_observation(self.observation, "Step.observation")


def check_observation(observation: Any, what: str) -> None:
    """Raise ``TypeError`` unless ``observation`` is text or a list of chat messages with a string role and content.

    Example:
        >>> check_observation([{"role": "tool", "content": "42"}], "obs")
        >>> check_observation(42, "obs")
        Traceback (most recent call last):
        ...
        TypeError: obs must be text or a list of chat messages ({'role': ..., 'content': ...}); got int 42
    """
    if isinstance(observation, str):
        return
    if isinstance(observation, list) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in observation
    ):
        return
    raise TypeError(
        f"{what} must be text or a list of chat messages ({{'role': ..., 'content': ...}}); got "
        f"{type(observation).__name__} {observation!r:.80}"
    )


@runtime_checkable
class Environment(Protocol):
    """One trajectory's environment: every member the multi-turn loop uses (module docstring).

    The loop calls ``reset`` once, then ``step_tokens`` after each model turn until a step is ``done``
    or a limit ends the episode, then ``close``; ``stop`` is read before each model turn and
    ``version`` identifies what the environment answers. :class:`EnvironmentBase` has a default for
    every member but ``step``.

    Attributes:
        stop: strings that end a model turn (added to the sampling's stop strings; kept in the text).
        version: changes whenever what the environment answers changes (a reference cache records it).
    """

    stop: tuple[str, ...]
    version: str

    def reset(self, row: Mapping[str, Any], max_turns: int) -> Observation | None:
        """Start an episode for the prompt ``row``; what it returns is appended to the prompt (None: nothing)."""
        ...

    def step(self, action: str) -> Step:
        """Answer the model's turn ``action`` (its text, stop string included)."""
        ...

    def step_tokens(self, action: str, ids: Sequence[int], prefix: Sequence[int]) -> Step:
        """Answer the model's turn from its text, its token ids ``ids`` and the trajectory's ids before it
        (``prefix``: the prompt and every earlier turn); what the loop calls. Default: ``step(action)``."""
        ...

    def close(self) -> None:
        """Release what the episode holds (idempotent)."""
        ...


class EnvironmentBase:
    """Defaults for an environment written for lit_rlvr, and the episode's bookkeeping.

    Defaults: no stop strings, version ``"1"``, :meth:`step_tokens` answers with :meth:`step`,
    nothing to close. Bookkeeping: :meth:`reset` checks the row (:meth:`check_row`) and keeps it
    (:attr:`row`, :attr:`scoring_row`), with the turn limit (:attr:`max_turns`) and a turn count
    (:attr:`turn`) that :meth:`next_turn` advances; a subclass's ``step`` calls it first. A subclass
    that returns text from ``reset`` calls ``super().reset(row, max_turns)`` first.

    Example:
        >>> class Echo(EnvironmentBase):
        ...     def step(self, action):
        ...         last = self.next_turn()
        ...         return Step(f"{action} ({self.turns_left} left)", reward=0.0, done=last)
        >>> env = Echo()
        >>> env.reset({"id": "e", "answer": "4", "level": 2, "completion": "x"}, max_turns=2), env.scoring_row
        (None, {'id': 'e', 'level': 2})
        >>> env.step_tokens("hi", [1, 2], []).observation, env.step("bye").done
        ('hi (1 left)', True)
    """

    stop: tuple[str, ...] = ()
    version: str = "1"
    row: Mapping[str, Any] = MappingProxyType({})
    turn: int = 0
    max_turns: int = 1

    def reset(self, row: Mapping[str, Any], max_turns: int) -> Observation | None:
        """Check and keep ``row``, start counting turns; nothing is appended to the prompt."""
        self.check_row(row)
        self.row, self.turn, self.max_turns = dict(row), 0, max_turns
        return None

    def check_row(self, row: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` for a row this environment cannot run, naming its id (default: any row runs)."""

    def next_turn(self) -> bool:
        """Count the model's turn being answered; whether it is the last one the loop allows."""
        self.turn += 1
        return self.turn >= self.max_turns

    @property
    def turns_left(self) -> int:
        """Model turns the loop still allows after the one being answered."""
        return self.max_turns - self.turn

    @property
    def scoring_row(self) -> dict[str, Any]:
        """The row's fields but ``answer`` and ``completion``: the ``**row`` a reward function
        ``reward(completion, answer, **row)`` takes beside its two arguments (a row column named
        either would collide with them)."""
        return {k: v for k, v in self.row.items() if k not in ("answer", "completion")}

    def step(self, action: str) -> Step:
        raise NotImplementedError

    def step_tokens(self, action: str, ids: Sequence[int], prefix: Sequence[int]) -> Step:
        return self.step(action)

    def close(self) -> None:
        pass


class ForeignEnvironment(EnvironmentBase):
    """An object with ``reset`` and ``step`` (and any of the protocol's other members), completed with
    :class:`EnvironmentBase`'s defaults for those it lacks; made once per trajectory by :meth:`EnvSpec.make`.

    Args:
        env: the user's environment.
        version: its version (:func:`declared_version` of its class, when it declares none).

    Example:
        >>> class Mine:  # no stop, version, step_tokens or close
        ...     def reset(self, row, max_turns):
        ...         return "go"
        ...     def step(self, action):
        ...         return Step(reward=1.0, done=True)
        >>> env = ForeignEnvironment(Mine(), "1")
        >>> isinstance(env, Environment), env.stop, env.reset({}, 3), env.step_tokens("x", [7], []).reward, env.close()
        (True, (), 'go', 1.0, None)
    """

    def __init__(self, env: Any, version: str):
        self.env, self.version = env, version
        self._step_tokens = getattr(env, "step_tokens", None) if callable(getattr(env, "step_tokens", None)) else None
        self._close = env.close if callable(getattr(env, "close", None)) else None

    @property
    def stop(self) -> tuple[str, ...]:  # read each turn: an environment may set its stop strings in reset
        return tuple(getattr(self.env, "stop", ()) or ())

    def reset(self, row: Mapping[str, Any], max_turns: int) -> Observation | None:
        return self.env.reset(row, max_turns)

    def step(self, action: str) -> Step:
        return self.env.step(action)

    def step_tokens(self, action: str, ids: Sequence[int], prefix: Sequence[int]) -> Step:
        if self._step_tokens is not None:
            return self._step_tokens(action, ids, prefix)
        return self.env.step(action)

    def close(self) -> None:
        if self._close is not None:
            self._close()

    def __repr__(self) -> str:
        return f"ForeignEnvironment({self.env!r})"


ENVIRONMENTS = Registry("environment", injected=("tokenizer",))
"""Name → environment class (or factory) whose keyword-only ``__init__`` parameters are its options
(``environment_options``); ``tokenizer`` is injected by the loop to those that take it (the TRL
adapter parses tool calls with the chat template's format). Filled by :mod:`lit_rlvr.envs`
(``sql``, ``calculator``, ``skyrl``, ``trl``), :mod:`lit_rlvr.demo` (``countdown``) and plug-ins."""


def register_environment(
    name: str,
    *,
    check: Callable[..., None] | None = None,
    version: Callable[..., str] | None = None,
    scores: bool | Callable[..., bool] | None = None,
):
    """Register an environment class under ``name`` (its keyword-only ``__init__`` parameters are the options).

    Args:
        name: the name configs use.
        check: ``check(**options)`` raising ``ValueError`` for option values the environment refuses
            (called at start-up with the configured options over the defaults).
        version: ``version(**options) -> str`` when the version depends on the options (an adapter's
            is the adapted environment's); default: the class's ``version`` (:func:`declared_version`).
        scores: the environment scores every trajectory (each :class:`Step` it returns carries the
            reward so far), so its rows need no ``reward`` for the reward functions
            (:func:`~lit_rlvr.rollout.turns.rows_scored_by_rewards`); ``scores(**options) -> bool`` when
            it depends on the options; default: the class's ``scores`` attribute, else False.

    Example:
        >>> @register_environment("_doc_echo")
        ... class Echo(EnvironmentBase):
        ...     def __init__(self, *, prefix: str = "> "):
        ...         self.prefix = prefix
        ...     def step(self, action):
        ...         return Step(self.prefix + action, done=action == "bye")
        >>> spec = resolve_environment("_doc_echo", {"prefix": "< "})
        >>> spec.make().step("hi").observation, ENVIRONMENTS.options("_doc_echo")
        ('< hi', ['prefix'])
        >>> _ = ENVIRONMENTS.pop("_doc_echo")
    """

    def decorator(cls):
        missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
        if missing:
            raise TypeError(
                f"environment {name!r}: {getattr(cls, '__name__', cls)!r} has no {', '.join(missing)} method"
            )
        traits = {"version": version} if version is not None else {}
        traits["scores"] = scores if scores is not None else _declared_scores(cls)
        return ENVIRONMENTS.register(name, check=check, **traits)(cls)

    return decorator


@dataclass(frozen=True)
class EnvSpec:
    """A configured environment: what makes one instance per trajectory, and its identity.

    Attributes:
        name: the registered name or import path it was configured with.
        options: the checked options.
        factory: ``factory(**options[, tokenizer=...]) -> Environment``.
        version: the environment's version (a reference cache records ``name`` and ``version``).
        scores: it scores every trajectory itself (:func:`register_environment`'s ``scores``): its
            rows need no ``reward``.
    """

    name: str
    options: Mapping[str, Any]
    factory: Callable[..., Any]
    version: str
    scores: bool = False

    @property
    def identity(self) -> str:
        """``name@version``, what a reference cache of trajectories records and compares."""
        return f"{self.name}@{self.version}"

    def make(self, tokenizer: Any = None) -> Environment:
        """A fresh environment for one trajectory (``tokenizer`` given to a factory that takes one); an
        object that does not have every member of :class:`Environment` is completed by :class:`ForeignEnvironment`."""
        kwargs = dict(self.options)
        if _takes(self.factory, "tokenizer"):
            kwargs["tokenizer"] = tokenizer
        env = self.factory(**kwargs)
        missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
        if missing:
            raise TypeError(
                f"environment {self.name!r} made a {type(env).__name__}, which has no {', '.join(missing)} method"
            )
        return env if isinstance(env, Environment) else ForeignEnvironment(env, self.version)

    def check_tokenizer(self, tokenizer: Any, key: str = "model.environment") -> None:
        """Raise ``ValueError`` at start-up if this environment cannot work with the policy's ``tokenizer``:
        one that takes the tokenizer (the ``trl`` adapter, which parses tool calls with it) is made once
        with it and closed, so a failure that would end every trajectory (``env_error``) ends the run
        before its first step instead. An environment that does not take the tokenizer is not made."""
        if not _takes(self.factory, "tokenizer"):
            return
        try:
            env = self.make(tokenizer)
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"{key}: environment {self.name!r} cannot work with the policy's tokenizer: {err}"
            ) from err
        close = getattr(env, "close", None)
        if callable(close):
            close()


def resolve_environment(
    name: str, options: Mapping[str, Any] | None = None, key: str = "environment", options_key: str | None = None
) -> EnvSpec:
    """The :class:`EnvSpec` a config names, its options checked at start-up.

    Args:
        name: a registered name (:data:`ENVIRONMENTS`), or an import path (``pkg.mod:Class``,
            ``file.py:Class``) of a lit_rlvr environment (``reset`` and ``step``), a skyrl-gym
            ``BaseTextEnv`` (run through :class:`~lit_rlvr.envs.skyrl.SkyRLEnvironment`, the options
            are its ``env_config``) or a TRL environment class (``reset`` and tools, no ``step``;
            run through :class:`~lit_rlvr.envs.trl.TRLEnvironment`).
        options: the environment's options (None: none).
        key: the config key, for errors.
        options_key: the options' config key, for errors (default ``<key>_options``).

    Raises:
        ValueError: an unknown name (listing the registered ones), an option the environment
            does not take, or a value it refuses.
        ImportError: an import path that cannot be imported.
    """
    options = dict(options or {})
    options_key = options_key or f"{key}_options"
    if name in ENVIRONMENTS or not is_import_path(name):
        cls = ENVIRONMENTS.get_checked(name, key, options, options_key)
        version = ENVIRONMENTS.trait(name, "version", options) or declared_version(cls)
        return EnvSpec(name, options, cls, version, bool(ENVIRONMENTS.trait(name, "scores", options, default=False)))
    cls = load_function(name, "environment")
    adapter = _adapter_for(cls)
    if adapter is not None:
        return resolve_environment(adapter[0], {adapter[1]: name, **adapter[2](options)}, key, options_key)
    single = Registry("environment", injected=ENVIRONMENTS.injected)
    single.register(name)(cls)
    single.get_checked(name, key, options, options_key)
    return EnvSpec(name, options, cls, declared_version(cls), _declared_scores(cls))


def _adapter_for(cls: Any) -> tuple[str, str, Callable[[dict], dict]] | None:
    """For a foreign environment class: (the adapter's name, its option naming the class, options → its
    options); None for a class written for lit_rlvr (it has ``step``) or anything else."""
    if not isinstance(cls, type):
        return None
    if _is_skyrl(cls):
        return "skyrl", "env", lambda options: {"env_config": options} if options else {}
    if callable(getattr(cls, "step", None)) or not callable(getattr(cls, "reset", None)):
        return None
    return "trl", "factory", lambda options: options


def _is_skyrl(cls: type) -> bool:
    try:
        from skyrl_gym.envs.base_text_env import BaseTextEnv
    except ImportError:
        return False
    return issubclass(cls, BaseTextEnv)


def _declared_scores(cls: Any) -> bool:
    """Whether ``cls`` declares that it scores every trajectory (a ``scores = True`` class attribute)."""
    return getattr(cls, "scores", False) is True


def declared_version(cls: Any) -> str:
    """``cls.version`` when it declares one, else a digest of its source (so an edit changes it).

    Example:
        >>> class Mine:
        ...     version = "2"
        >>> declared_version(Mine)
        '2'
    """
    version = getattr(cls, "version", None)
    if isinstance(version, str) and version:
        return version
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return "unversioned"
    return "src-" + hashlib.sha256(source.encode()).hexdigest()[:12]


def _takes(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
