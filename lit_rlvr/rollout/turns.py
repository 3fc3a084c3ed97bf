"""Multi-turn rollouts on any engine: live trajectories advanced turn by turn, token in, token out.

A batch of P prompts × n samples becomes B trajectories, each with its own environment
(:mod:`lit_rlvr.envs`). Each turn is one ``engine.generate`` call per distinct stop set (the
sampling's stop strings plus the environment's ``stop``: one environment's stops never cut another's
turn; a batch of one environment makes one call) on its live trajectories' token prefixes (prompt +
every earlier turn's tokens), so the loop runs on every engine (``hf``,
colocated ``vllm``, ``vllm_server``; vLLM's prefix caching absorbs the re-prefill); then every
live environment steps on its turn's text, in threads, under a deadline. The trajectory's tokens
are exactly what the engine returned plus what the environment added, tokenized once (SkyRL's
generator, verl's agent loop, TRL after #5224): the model's tokens are never decoded
and re-encoded, so a chat template that would tokenize the text differently cannot change them.
The result is a :class:`~lit_rlvr.rollout.types.Rollouts` whose completion is every turn's tokens,
with ``loss_mask`` (1 on the model's tokens, 0 on the environment's), the sampler's log-probs on
the model's tokens (0.0 on the environment's, which no loss reads) and one
:class:`~lit_rlvr.rollout.types.Episode` per trajectory.

What ends a trajectory (:attr:`Episode.status <lit_rlvr.rollout.types.Episode>`): the environment
(``done``), :attr:`TurnOptions.max_turns`, the token budget or the context (``length``: the
observation that would not fit is dropped, as TRL and SkyRL drop it), or the environment failing
or hanging past :attr:`TurnOptions.step_timeout_s` (``env_error`` / ``env_timeout``), its
observation included (rendering it runs in the same timed call, and an observation the tokenizer
cannot render is the environment's failure): that costs only its own trajectory, which gets reward
0 and an all-zero loss mask, the reason recorded. At the deadline the call's thread is stopped: an
exception is raised in it (``PyThreadState_SetAsyncExc``, func_timeout's method), which lands at
its next Python instruction, so a step spinning in Python stops costing CPU at once. A thread
blocked in one C call (a ``time.sleep``, a database query, a lock) is stopped only when that call
returns, and one whose code swallows the exception keeps running: either is abandoned (a daemon
thread), its reason saying so. A timed-out environment is never called again (not even ``close``).

Observations are rendered (:class:`~lit_rlvr.rollout.observations.ObservationRenderer`): text is tokenized as it is (inside the
model's assistant message, SkyRL's ``use_conversation_multi_turn: false``); chat messages become new
turns of the chat template by the fixed-base method (SkyRL's ``get_obs_ids_from_obs`` for user
messages, TRL's ``_get_tool_suffix_ids`` for tool messages), after the token that closes the
model's turn, which the environment adds (mask 0) when the model's turn ended at a stop string
(SkyRL's ``append_eos_token_after_stop_str_in_multi_turn``). An observation longer than
:attr:`TurnOptions.max_observation_chars` characters (text, or chat messages' contents together) is
cut, saying so (verl's ``max_tool_response_length``; :meth:`ObservationRenderer.bound`), and chat
messages past :data:`~lit_rlvr.rollout.observations.MAX_OBSERVATION_MESSAGES` are left out.
Unlike SkyRL, a trajectory's last turn is not closed with an added token (nothing follows it), and
no end-of-sequence token is appended to a text-format trajectory (SkyRL appends one and trains on
it: a token the model did not sample).

The first turn of trajectories whose environments add nothing to the prompt is one call with
``n`` samples per prompt and the sampling's own seed, exactly the single-turn call: with
``max_turns=1`` and environments that add no text the rollouts are the single-turn ones bit for bit.
Later turns are one call with one sample per live trajectory, seeded per turn. A turn's calls for
several stop sets take consecutive, disjoint seeds (the first call the turn's seed, the next one
that seed plus the samples before it).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from lit_rlvr.envs.base import Environment, EnvSpec, Observation, Step, check_observation, resolve_environment
from lit_rlvr.rollout.observations import ObservationRenderer
from lit_rlvr.rollout.types import Episode, Rollouts, SamplingParams

TURN_SEED_STRIDE = 1_000_003  # turn t samples with seed + t · stride
MAX_TURNS_LIMIT = 100
"""The most ``max_turns`` a run may set: each turn is a generate call and an environment step per live
trajectory, so a mistyped limit (``1e8``) would otherwise run until memory is gone."""
MAX_TOKENS_LIMIT = 1 << 20
"""The most ``max_turn_tokens`` / ``max_total_tokens`` a run may set (1,048,576: beyond any model's context)."""
MAX_OBSERVATION_CHARS_LIMIT = 1 << 20
"""The most ``max_observation_chars`` a run may set (1 MiB of text in one observation)."""
STOP_WAIT_S = 0.5
"""How long, at most, :class:`TurnLoop` waits for the threads of environment calls past their deadline to
stop (the exception raised in them again and again); a thread still running after it is abandoned."""


@dataclass(frozen=True, kw_only=True)
class TurnOptions:
    """The multi-turn rollout loop's limits, set as :class:`EnvironmentOptions`' keys (``model.environment.max_turns``, …).

    Args:
        max_turns: model turns per trajectory, 1 to 100 (SkyRL's ``generator.max_turns``, verl's
            ``multi_turn.max_assistant_turns``, TRL's ``max_tool_calling_iterations`` + 1).
        max_turn_tokens: tokens one model turn may generate, at most 1,048,576 (None:
            ``sampling.max_new_tokens``).
        max_total_tokens: tokens of the whole trajectory after the prompt, the model's and the
            environment's, at most 1,048,576 and at least one turn's (None: ``max_turns ×
            max_turn_tokens``); Dr. GRPO's normaliser.
        max_observation_chars: characters of one observation in total (its text, or all its chat
            messages' contents together), 16 to 1,048,576 (past it the observation is cut, saying so;
            verl's ``max_tool_response_length``).
        step_timeout_s: the deadline of one environment call (``reset``, ``step``, ``close``), its
            observation's rendering included; None: no limit. A hung or failing environment costs
            only its trajectory (reward 0, not trained on); a call past the deadline is stopped.
    """

    max_turns: int = 5
    max_turn_tokens: int | None = None
    max_total_tokens: int | None = None
    max_observation_chars: int = 4000
    step_timeout_s: float | None = 30.0

    def __post_init__(self):
        if not 1 <= self.max_turns <= MAX_TURNS_LIMIT:
            raise ValueError(
                f"model.environment.max_turns must be in [1, {MAX_TURNS_LIMIT}] (MAX_TURNS_LIMIT), got {self.max_turns}"
            )
        for name in ("max_turn_tokens", "max_total_tokens"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_TOKENS_LIMIT:
                raise ValueError(
                    f"model.environment.{name} must be in [1, {MAX_TOKENS_LIMIT}] (MAX_TOKENS_LIMIT) or None, got {value}"
                )
        if self.max_turn_tokens is not None and self.max_total_tokens is not None:
            self.check_budget(self.max_turn_tokens, "model.environment.max_turn_tokens")
        if not 16 <= self.max_observation_chars <= MAX_OBSERVATION_CHARS_LIMIT:
            raise ValueError(
                f"model.environment.max_observation_chars must be in [16, {MAX_OBSERVATION_CHARS_LIMIT}], "
                f"got {self.max_observation_chars}"
            )
        if self.step_timeout_s is not None and not self.step_timeout_s > 0:
            raise ValueError(f"model.environment.step_timeout_s must be > 0 seconds or None, got {self.step_timeout_s}")

    def turn_tokens(self, sampling: SamplingParams) -> int:
        return self.max_turn_tokens or sampling.max_new_tokens

    def check_budget(self, turn_tokens: int, where: str) -> None:
        """Refuse a ``max_total_tokens`` smaller than one turn's ``turn_tokens`` (set by ``where``): no
        turn could be generated whole, and every trajectory would end cut at ``length``.

        Example:
            >>> TurnOptions(max_total_tokens=100).check_budget(256, "model.sampling.max_new_tokens")  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: model.environment.max_total_tokens=100 is smaller than one turn's 256 tokens ...
        """
        if self.max_total_tokens is not None and self.max_total_tokens < turn_tokens:
            raise ValueError(
                f"model.environment.max_total_tokens={self.max_total_tokens} is smaller than one turn's {turn_tokens} "
                f"tokens ({where}): raise it to >= {turn_tokens}, or lower {where}"
            )

    def total_tokens(self, sampling: SamplingParams) -> int:
        return self.max_total_tokens or self.max_turns * self.turn_tokens(sampling)


ROW_ENVIRONMENT = "environment"  # the row field naming a row's own environment


@dataclass(frozen=True)
class EnvironmentOptions(TurnOptions):
    """Multi-turn rollouts: the environment each trajectory runs in and the turn loop's limits.

    The ``environment`` group of training (``model.environment``, read by the rollout callback for
    training and validation alike) and of ``lit-rlvr cache`` (a multi-turn reference cache); absent
    (None), rollouts are single-turn. The limits are :class:`TurnOptions`' (this group is one, with
    the environments added; :attr:`turns` is the limits alone).

    Args:
        name: the environment (:data:`~lit_rlvr.envs.ENVIRONMENTS`: ``sql``, ``calculator``,
            ``countdown``, ``skyrl``, ``trl``, a plug-in's, or an import path of a lit_rlvr, skyrl-gym
            or TRL class). A row's own ``environment`` field, when it has one, names its environment
            instead; None: every row must name its own.
        options: ``{environment name: {option: value}}``, as ``model.scoring.options`` (e.g.
            ``{sql: {max_rows: 20}}``); checked at start-up.

    Example:
        >>> import lit_rlvr.demo  # registers the countdown environment
        >>> env = EnvironmentOptions("countdown", max_turns=3)
        >>> [s.identity for s in env.specs([{"id": "a"}, {"id": "b", "environment": "calculator"}])], env.turns.max_turns
        (['countdown@1', 'calculator@1'], 3)
        >>> EnvironmentOptions("countdown", options={"countdown": {"level": 2}})
        Traceback (most recent call last):
        ...
        ValueError: model.environment.options: unknown option(s) ['level'] of environment 'countdown'; accepted: []
    """

    name: str | None = None
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self):
        super().__post_init__()  # the limits checked now
        object.__setattr__(self, "_specs", {})
        for name in dict.fromkeys([*([self.name] if self.name is not None else []), *self.options]):
            self.spec(name)  # every configured environment and its options checked now

    @property
    def turns(self) -> TurnOptions:
        """The turn loop's limits alone (what a reference cache records beside the environments)."""
        return TurnOptions(**{f.name: getattr(self, f.name) for f in fields(TurnOptions)})

    def __getstate__(self) -> dict[str, Any]:
        """Pickling: the fields (the resolved environments are made again)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def spec(self, name: str) -> EnvSpec:
        """The :class:`~lit_rlvr.envs.EnvSpec` of environment ``name`` with its options (resolved once)."""
        specs = self._specs  # type: ignore[attr-defined]
        if name not in specs:
            specs[name] = resolve_environment(
                name, self.options.get(name), "model.environment.name", "model.environment.options"
            )
        return specs[name]

    def specs(self, rows: Sequence[Mapping[str, Any]]) -> list[EnvSpec]:
        """Each row's environment: its own ``environment`` field, else :attr:`name`.

        Raises:
            ValueError: a row names none and no default is configured, or names an unknown one.
        """
        out = []
        for row in rows:
            name = row.get(ROW_ENVIRONMENT) or self.name
            if name is None:
                raise ValueError(
                    f"row {row.get('id')!r} has no {ROW_ENVIRONMENT!r} field and model.environment.name is null: "
                    "name an environment for every row, or configure one"
                )
            out.append(self.spec(str(name)))
        return out

    def identity(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """What a multi-turn reference cache of ``rows`` records and a run compares: the environments'
        ``name@version`` (:attr:`EnvSpec.identity <lit_rlvr.envs.EnvSpec.identity>`), the turn limits,
        and, for environments given options, their checked options as configured (an option set to its
        default still differs from one left out)."""
        turns = {
            k: v for k, v in asdict(self.turns).items() if k != "step_timeout_s"
        }  # a deadline does not change what is sampled
        specs = self.specs(rows)
        identity = {"environments": sorted({s.identity for s in specs}), "turns": turns}
        options = {s.identity: dict(s.options) for s in specs if s.options}  # what each answers depends on them
        if options:  # absent without options, so a cache built before options were recorded still matches
            identity["options"] = json.loads(json.dumps(options, sort_keys=True, default=repr))  # as the manifest reads
        return identity

    def check_tokenizer(
        self, rows: Sequence[Mapping[str, Any]], tokenizer: Any, key: str = "model.environment"
    ) -> None:
        """Raise ``ValueError`` if an environment of ``rows`` cannot work with the policy's ``tokenizer``
        (:meth:`EnvSpec.check_tokenizer <lit_rlvr.envs.EnvSpec.check_tokenizer>`), before any generation;
        ``key`` is where the command reads these options (``environment`` in ``lit-rlvr cache``)."""
        for spec in {id(s): s for s in self.specs(rows)}.values():
            spec.check_tokenizer(tokenizer, key)

    def loop(self, tokenizer: Any, context: int | None = None) -> TurnLoop:
        """A :class:`TurnLoop` with these limits."""
        return TurnLoop(tokenizer, self.turns, context)


def rows_scored_by_rewards(
    rows: Sequence[Mapping[str, Any]], environment: EnvironmentOptions | None
) -> list[Mapping[str, Any]]:
    """The rows whose trajectories the reward functions score, so that need a ``reward`` (or
    ``model.scoring.reward_funcs``) and an ``answer``: every row of a single-turn run (``environment``
    None); in a multi-turn run, the rows whose environment does not score its trajectories itself
    (:attr:`EnvSpec.scores <lit_rlvr.envs.EnvSpec>`). The start-up row checks and the reference cache's
    record of its rewards both ask this.

    Raises:
        ValueError: a row has no environment (:meth:`EnvironmentOptions.specs`).

    Example:
        >>> import lit_rlvr.demo  # registers the countdown checker, which scores its episodes
        >>> rows = [{"id": "a"}, {"id": "b", "environment": "_doc_unscored"}]
        >>> from lit_rlvr.envs import ENVIRONMENTS, EnvironmentBase, register_environment
        >>> _ = register_environment("_doc_unscored")(type("Unscored", (EnvironmentBase,), {}))
        >>> [r["id"] for r in rows_scored_by_rewards(rows, EnvironmentOptions("countdown"))]
        ['b']
        >>> len(rows_scored_by_rewards(rows, None)), ENVIRONMENTS.pop("_doc_unscored").__name__
        (2, 'Unscored')
    """
    if environment is None:
        return list(rows)
    return [row for row, spec in zip(rows, environment.specs(rows)) if not spec.scores]


@dataclass
class _Trajectory:
    """One live trajectory: its environment, its tokens so far and what happened."""

    prompt: list[int]
    row: Mapping[str, Any]
    env: Environment | None = None
    env_name: str = ""  # the configured name or import path, for errors
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish: str = "stop"
    turns: int = 0
    tool_calls: list[str] = field(default_factory=list)
    tool_errors: int = 0
    reward: float | None = None
    status: str | None = None  # None while live
    reason: str = ""
    final_text: str = ""
    turn_start: int = 0  # where the model's last turn starts in ``ids``

    @property
    def live(self) -> bool:
        return self.status is None

    def add(self, ids: list[int], logprobs: list[float] | None, text: str, model: bool) -> None:
        self.ids += ids
        self.mask += [int(model)] * len(ids)
        self.logprobs += list(logprobs) if model else [0.0] * len(ids)
        self.texts.append(text)

    def end(self, status: str, reward: float | None = None, reason: str = "") -> None:
        self.status, self.reward, self.reason = status, reward, reason
        if status in ("env_error", "env_timeout"):
            self.reward, self.mask = 0.0, [0] * len(self.ids)  # not trained on: the failure is not the policy's

    def episode(self) -> Episode:
        return Episode(
            self.reward,
            self.status or "length",
            self.reason,
            self.turns,
            tuple(self.tool_calls),
            self.tool_errors,
            self.final_text,
        )


@dataclass
class TurnStats:
    """Where one :meth:`TurnLoop.generate` spent its time (seconds) and how many engine calls it made."""

    generate_s: float = 0.0
    environment_s: float = 0.0
    calls: int = 0


class TurnLoop:
    """Runs multi-turn rollouts (module docstring).

    Args:
        tokenizer: the policy's tokenizer (renders observations, decodes turns an engine left untexted).
        options: the loop's limits.
        context: the longest prompt + completion the engine takes (None: unbounded); a trajectory
            ends (``length``) when its next turn would not have room for a token.
    """

    def __init__(self, tokenizer: Any, options: TurnOptions | None = None, context: int | None = None):
        self.tokenizer = tokenizer
        self.options = options or TurnOptions()
        self.context = context
        self.renderer = ObservationRenderer(tokenizer, self.options.max_observation_chars)
        self.stats = TurnStats()
        self._caps = (1, 1)  # (turn, total) token caps of the call in progress

    def generate(
        self,
        engine: Any,
        prompt_ids: Sequence[Sequence[int]],
        rows: Sequence[Mapping[str, Any]],
        params: SamplingParams,
        envs: EnvSpec | Sequence[EnvSpec],
    ) -> Rollouts:
        """``params.n`` trajectories for each prompt, prompt-major.

        Args:
            engine: any :class:`~lit_rlvr.rollout.engine.RolloutEngine`.
            prompt_ids: P prompts' token ids.
            rows: the P prompt rows (what each environment is reset with).
            params: the sampling (``n``, temperature, …, ``max_new_tokens`` the default per-turn cap).
            envs: the environment of every prompt (one :class:`~lit_rlvr.envs.EnvSpec`, or P of them).
        """
        if len(rows) != len(prompt_ids):
            raise ValueError(f"TurnLoop.generate: {len(prompt_ids)} prompts but {len(rows)} rows")
        specs = [envs] * len(prompt_ids) if isinstance(envs, EnvSpec) else list(envs)
        if len(specs) != len(prompt_ids):
            raise ValueError(f"TurnLoop.generate: {len(prompt_ids)} prompts but {len(specs)} environments")
        self.stats = TurnStats()
        self._caps = (self.options.turn_tokens(params), self.options.total_tokens(params))
        trajectories = [
            _Trajectory(list(prompt_ids[b // params.n]), rows[b // params.n]) for b in range(len(prompt_ids) * params.n)
        ]
        reuse = getattr(engine, "prefix_reuse", contextlib.nullcontext)  # hf: turns prefill only their new tokens
        try:
            with reuse():
                self._reset(trajectories, [specs[b // params.n] for b in range(len(trajectories))])
                for turn in range(self.options.max_turns):
                    live = [t for t in trajectories if t.live]
                    if not live:
                        break
                    grouped = turn == 0 and len(live) == len(trajectories) and not any(t.ids for t in trajectories)
                    self._model_turn(engine, live, params, turn, prompt_ids if grouped else None)
                    self._environment_turn([t for t in live if t.live], last=turn + 1 == self.options.max_turns)
        finally:
            self._close(trajectories)
        return Rollouts(
            [list(p) for p in prompt_ids],
            [t.ids for t in trajectories],
            [t.logprobs for t in trajectories],
            [t.finish for t in trajectories],
            params.n,
            texts=["".join(t.texts) for t in trajectories],
            loss_mask=[t.mask for t in trajectories],
            episodes=[t.episode() for t in trajectories],
        )

    # ------------------------------------------------------------------ the phases
    def _reset(self, trajectories: list[_Trajectory], specs: list[EnvSpec]) -> None:
        def start(t: _Trajectory, spec: EnvSpec) -> Callable[[], tuple[list[int], str]]:
            def call():
                t.env, t.env_name = spec.make(self.tokenizer), spec.name
                out = t.env.reset(t.row, self.options.max_turns)
                if out is not None:
                    check_observation(out, f"environment {spec.name!r}: reset's return value")
                return self._render(t, out or "", t.prompt[-1] if t.prompt else None)  # under the deadline too

            return call

        for t, out in zip(trajectories, self._run([start(t, s) for t, s in zip(trajectories, specs)], "reset")):
            if self._failed(t, out):
                continue
            ids, text = out
            if ids:
                t.add(ids, None, text, model=False)

    def _model_turn(
        self,
        engine: Any,
        live: list[_Trajectory],
        params: SamplingParams,
        turn: int,
        grouped_prompts: Sequence[Sequence[int]] | None,
    ) -> None:
        budgets = [self._budget(t, params) for t in live]
        for t, budget in zip(live, budgets):
            if budget < 1:
                t.finish = "length"
                t.end("length", t.reward, "no room for another turn")
        pairs = [(t, b) for t, b in zip(live, budgets) if b >= 1]
        if not pairs:
            return
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, (t, _) in enumerate(pairs):  # one call per stop set: an environment's stops never cut another's turn
            groups.setdefault(tuple(dict.fromkeys([*params.stop, *t.env.stop])), []).append(i)
        turn_seed = None if params.seed is None else params.seed + turn * TURN_SEED_STRIDE
        n, first = params.n, grouped_prompts is not None and len(pairs) == len(live)
        offset = 0  # samples of the turn's earlier calls: the calls' seeds are disjoint, the first call's unchanged
        for stops, rows in groups.items():
            members = [pairs[i] for i in rows]
            turn_params = replace(
                params,
                max_new_tokens=max(b for _, b in members),
                stop=stops,
                seed=None if turn_seed is None else turn_seed + offset,
            )
            t0 = time.perf_counter()
            if first and _whole_prompts(rows, n):  # the first turn: n samples of each of the call's prompts
                out = engine.generate([list(grouped_prompts[i // n]) for i in rows[::n]], turn_params)
            else:
                out = engine.generate([t.prompt + t.ids for t, _ in members], replace(turn_params, n=1))
            self.stats.generate_s += time.perf_counter() - t0
            self.stats.calls += 1
            offset += len(members)
            self._take(out, members)

    def _take(self, out: Rollouts, members: list[tuple[_Trajectory, int]]) -> None:
        """One engine call's turns appended to its trajectories (``members``, in the call's order, with their budgets)."""
        for i, (t, budget) in enumerate(members):
            ids, logprobs, finish = list(out.completion_ids[i]), list(out.sampler_logprobs[i]), out.finish_reasons[i]
            text = out.texts[i] if out.texts else self.tokenizer.decode(ids, skip_special_tokens=True)
            if len(ids) > budget:  # the call's cap is the largest budget: keep this trajectory's share
                ids, logprobs, finish = ids[:budget], logprobs[:budget], "length"
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
            t.turn_start = len(t.ids)
            t.add(ids, logprobs, text, model=True)
            t.turns += 1
            t.finish, t.final_text = finish, text

    def _environment_turn(self, live: list[_Trajectory], last: bool) -> None:
        def step(t: _Trajectory) -> Callable[[], tuple[Step, list[int], str]]:
            def call():
                out = t.env.step_tokens(t.final_text, t.ids[t.turn_start :], t.prompt + t.ids[: t.turn_start])
                if not isinstance(out, Step):
                    raise TypeError(
                        f"environment {t.env_name!r}: step returned {type(out).__name__}, not a lit_rlvr.envs.Step"
                    )
                if out.done or last:  # the episode ends here: its observation is never shown
                    return out, [], ""
                return (out, *self._render(t, out.observation, t.ids[-1] if t.ids else None))  # under the deadline

            return call

        for t, result in zip(live, self._run([step(t) for t in live], "step")):
            if self._failed(t, result):
                continue
            out, ids, text = result
            if out.tool_call is not None:
                t.tool_calls.append(out.tool_call)
            t.tool_errors += int(out.tool_error)  # a failed call, or a turn the environment rejected as invalid
            t.reward = out.reward
            if out.done or last:
                t.end("done" if out.done else "max_turns", out.reward)
                continue
            if self._room(t) - len(ids) < 1:  # no room left for a model token after it: TRL and SkyRL drop it too
                t.finish = "length"
                t.end("length", out.reward, "the observation does not fit the token budget")
                continue
            t.add(ids, None, text, model=False)

    def _close(self, trajectories: list[_Trajectory]) -> None:
        """Close every environment that is not hung (errors while closing are ignored: the episode is over)."""

        def close(t: _Trajectory) -> Callable[[], None]:
            return t.env.close

        open_ = [t for t in trajectories if t.env is not None and t.status != "env_timeout"]
        self._run([close(t) for t in open_], "close")

    # ------------------------------------------------------------------ helpers
    def _room(self, t: _Trajectory) -> int:
        """Tokens ``t`` may still add: to the total budget, and to the context."""
        room = self._caps[1] - len(t.ids)
        return room if self.context is None else min(room, self.context - len(t.prompt) - len(t.ids))

    def _budget(self, t: _Trajectory, params: SamplingParams) -> int:
        return min(self._caps[0], self._room(t))

    def _run(self, calls: list[Callable[[], Any]], what: str) -> list[Any]:
        """Each call in its own daemon thread, all under one deadline: its result, or the exception it raised
        (a ``TimeoutError`` for one still running at the deadline, whose thread is then stopped, :meth:`_stop`)."""
        t0 = time.perf_counter()
        running = [_EnvCall(fn, f"lit-rlvr-env-{what}") for fn in calls]
        for call in running:
            call.thread.start()
        timeout = self.options.step_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        results: list[Any] = []
        late: list[int] = []
        for i, call in enumerate(running):
            if call.done.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                results.append(call.result)
            else:
                results.append(None)
                late.append(i)
        if late:
            alive = self._stop([running[i] for i in late])
            for i in late:
                fate = (
                    "its thread could not be stopped (blocked in a C call, or it swallowed the exception) and is abandoned"
                    if running[i] in alive
                    else "it was stopped"
                )
                results[i] = TimeoutError(
                    f"the environment's {what} did not return within {timeout:g} s "
                    f"(model.environment.step_timeout_s); {fate}"
                )
        self.stats.environment_s += time.perf_counter() - t0
        return results

    @staticmethod
    def _stop(calls: list[_EnvCall]) -> list[_EnvCall]:
        """Stop the threads of ``calls`` (past their deadline): raise :class:`_Stopped` in each still
        running, again every few milliseconds (doubling) until every thread has ended or
        :data:`STOP_WAIT_S` has passed; the calls whose threads still run (abandoned)."""
        end, wait = time.monotonic() + STOP_WAIT_S, 0.005
        while True:
            alive = [c for c in calls if c.thread.is_alive()]
            if not alive or time.monotonic() >= end:
                return alive
            for call in alive:
                call.stop()
            round_end = min(end, time.monotonic() + wait)
            for call in alive:
                call.thread.join(max(0.0, round_end - time.monotonic()))
            wait *= 2

    @staticmethod
    def _failed(t: _Trajectory, out: Any) -> bool:
        """End ``t`` if its environment call failed; whether it did."""
        if isinstance(out, TimeoutError):
            t.end("env_timeout", reason=str(out))
            return True
        if isinstance(out, BaseException):
            t.end("env_error", reason=f"{type(out).__name__}: {out}")
            return True
        return False

    def _render(self, t: _Trajectory, observation: Observation, last_id: int | None) -> tuple[list[int], str]:
        """``observation``'s token ids and text (run inside the environment's timed call).

        Raises:
            ValueError: the tokenizer cannot render it (no chat template, one that does not continue a
                conversation, …), naming the environment: its trajectory ends ``env_error``.
        """
        try:
            ids = self.renderer.render(observation, last_id)
        except Exception as err:
            kind = "text" if isinstance(observation, str) else "chat-message"
            raise ValueError(
                f"environment {t.env_name!r}: its {kind} observation cannot be rendered with the policy's tokenizer "
                f"({type(err).__name__}: {err})"
            ) from err
        if isinstance(observation, str):
            return ids, self.renderer.cut(observation)
        return ids, self.tokenizer.decode(ids, skip_special_tokens=True)


class _Stopped(BaseException):
    """Raised in the thread of an environment call past its deadline, to stop it. A ``BaseException``
    (like ``KeyboardInterrupt``) so that an environment's ``except Exception`` does not swallow it."""


_set_async_exc = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)  # CPython's


class _EnvCall:
    """One environment call in its own daemon thread, stoppable (:meth:`stop`) while it runs.

    ``result`` is the call's return value or the exception it raised, set before ``done``. A stop is
    raised only while the call's work is not over (under ``_lock``), and one raised but not yet
    delivered when it ends is dropped, so no stop ever lands outside the call's own code.
    """

    def __init__(self, fn: Callable[[], Any], name: str):
        self.fn = fn
        self.result: Any = None
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._over = False
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        try:
            try:
                self.result = self.fn()
            except BaseException as err:  # the environment's failure is its trajectory's outcome
                self.result = err
            self.done.set()
        except _Stopped:  # stopped between the call and its result: the loop has given up on it already
            pass
        while True:  # no stop after this, and none left pending
            try:
                with self._lock:
                    self._over = True
                    if _set_async_exc is not None:
                        _set_async_exc(ctypes.c_ulong(threading.get_ident()), None)
                return
            except _Stopped:
                continue

    def stop(self) -> None:
        """Raise :class:`_Stopped` in the call's thread (at its next Python instruction), unless it is over."""
        with self._lock:
            if not self._over and _set_async_exc is not None and self.thread.ident is not None:
                _set_async_exc(ctypes.c_ulong(self.thread.ident), ctypes.py_object(_Stopped))


def _whole_prompts(rows: list[int], n: int) -> bool:
    """Whether trajectory indices ``rows`` (ascending) are every sample of each prompt they touch (prompt-major).

    Example:
        >>> _whole_prompts([0, 1, 4, 5], 2), _whole_prompts([1, 2], 2)
        (True, False)
    """
    return len(rows) % n == 0 and all(
        rows[k] == rows[k - k % n] + k % n and rows[k - k % n] % n == 0 for k in range(len(rows))
    )


class RolloutSampler:
    """A batch's rollouts on an engine: single-turn (``engine.generate``), or multi-turn in each row's
    environment (:class:`TurnLoop`): what the rollout callback and the reference cache sample with.

    Args:
        tokenizer: the policy's tokenizer.
        environment: the multi-turn environment and limits (None: single-turn).
        context: the longest prompt + completion the engine takes (None: unbounded).
    """

    def __init__(self, tokenizer: Any, environment: EnvironmentOptions | None = None, context: int | None = None):
        self.environment = environment
        self.loop = None if environment is None else environment.loop(tokenizer, context)

    def __call__(
        self,
        engine: Any,
        prompt_ids: Sequence[Sequence[int]],
        rows: Sequence[Mapping[str, Any]],
        params: SamplingParams,
    ) -> Rollouts:
        """``params.n`` rollouts of each of the P prompts (their ``rows`` reset the environments), prompt-major."""
        if self.loop is None:
            return engine.generate(prompt_ids, params)
        return self.loop.generate(engine, prompt_ids, rows, params, self.environment.specs(rows))

    def turn_tokens(self, params: SamplingParams) -> int:
        """The most tokens one engine call may generate: ``max_new_tokens``, or one turn's cap."""
        return params.max_new_tokens if self.environment is None else self.environment.turns.turn_tokens(params)
