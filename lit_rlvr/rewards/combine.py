"""Several rewards per completion, weighted into the training reward; one of them decides correctness.

TRL's ``GRPOTrainer(reward_funcs=[accuracy, format], args=GRPOConfig(reward_weights=[1.0, 0.2]))``
is, here::

    model:
      scoring:
        reward_funcs: [my_pkg.rewards.accuracy, my_pkg.rewards.format]   # or registered names: math, sql
        reward_weights: [1.0, 0.2]
        correctness: accuracy          # Pass@k, maj@k, pass counts and the reference cache judge by it

Every term is scored for every completion in the killable reward workers (one item per term and
completion, each under the per-item deadline), then (docs/methods.md §1.9)

    r = Σ_k w_k · r_k     over the terms k whose reward applies (r_k not None),

TRL's ``sum_then_normalize`` with its None rule (``nansum``): a reward that returns None for a
completion is left out of its sum. Each term is logged on its own (``train/reward/<name>``: its
mean over the completions it applies to, TRL's ``rewards/<name>/mean``), next to ``train/reward``.

Correctness is not the sum: a format bonus must not turn a wrong answer into a pass. The term
named by ``correctness`` alone gives validation's Pass@k / maj@k (correct when its reward is
> 0.5), the per-prompt pass counts and the reference cache's rewards and pass counts.

Without ``reward_funcs`` (:class:`RewardMix` with no terms) each row is scored by its own
``reward`` field, as it always was: one term that is also the correctness. With them, the entry
``row`` (:data:`ROW`) is that per-row reward as one term among others, so a dataset that mixes
rewards by row (math and SQL rows) can add rewards for every row.

A reward registered with ``trajectory=True`` (the tool-call bonus ``tool_call``,
:mod:`~lit_rlvr.rewards.tools`) reads a multi-turn trajectory's behaviour: its rows get the
trajectory's ``tool_calls``, and it is scored beside an environment's own reward as well, which it
is added to with its weight (the environment's reward itself is kept unweighted, as before).

Departures from TRL: a completion that no reward applies to scores 0 (TRL ≥ 1.x gives it a zero
advantage instead; here the registered advantage estimators see the 0), and is warned about once;
TRL's ``normalize_then_sum`` aggregation is not offered.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lit_rlvr.plugins import is_import_path, load_function
from lit_rlvr.rewards.base import REWARDS, STATUS_NOT_APPLICABLE, STATUS_OK, Reward, ScoreResult, in_range
from lit_rlvr.rewards.conventions import (
    PYTHON_ONLY,
    RewardFunc,
    TrainerState,
    callable_name,
    callable_source,
    imported_reward,
)

ROW = "row"
"""The ``reward_funcs`` entry that stands for each row's own ``reward`` field (a dataset mixing
math and SQL rows, plus a format bonus for all: ``reward_funcs: [row, my_pkg.format_bonus]``)."""


def weighted_sum(parts: Sequence[float | None], weights: Sequence[float]) -> float:
    """Σ w_k r_k over the parts that apply (None = not applicable, skipped as TRL's ``nansum``); 0.0 if none does.

    Args:
        parts: K rewards of one completion, None where a reward does not apply.
        weights: K weights.

    Example:
        >>> weighted_sum([1.0, 0.5], [1.0, 0.2]), weighted_sum([None, 0.5], [1.0, 0.2]), weighted_sum([None, None], [1.0, 1.0])
        (1.1, 0.1, 0.0)
    """
    return math.fsum(w * r for r, w in zip(parts, weights, strict=True) if r is not None)


@dataclass(frozen=True)
class RewardTerm:
    """One weighted reward of a :class:`RewardMix`.

    Attributes:
        name: how logs and ``correctness`` call it: a registered reward's name, or an imported
            function's ``__name__`` (TRL's ``reward_func_names``).
        source: the registered name or the import path (what the cache manifest records).
        weight: w_k.
        record: the imported function's :class:`~lit_rlvr.rewards.base.Reward` record (None: the
            registered reward ``source``).
        whole_batch: called once per batch with every completion (TRL's way), in the training
            process, instead of once per completion in the workers (``whole_batch``).
    """

    name: str
    source: str
    weight: float = 1.0
    record: Reward | None = None
    whole_batch: bool = False

    def scorer_name(self, row: dict) -> str:
        """The name the scorer's table knows it by for ``row`` (items are routed by it): the row's
        own ``reward`` for the :data:`ROW` term."""
        if self.source == ROW:
            return row.get("reward")
        return self.source if self.record is None else self.name

    @property
    def convention(self) -> str:
        """``native`` for a registered reward, else the imported function's convention."""
        return "native" if self.record is None else self.record.score.convention


@dataclass(frozen=True)
class MixedScore:
    """One completion scored by every term of a :class:`RewardMix`.

    Attributes:
        reward: the training reward Σ w_k r_k over the terms that apply.
        correct: the correctness term's reward (0 when it does not apply).
        results: per term, its :class:`~lit_rlvr.rewards.base.ScoreResult` (status, reason, the
            canonical answer when asked for).
        correctness: the index of the correctness term in ``results``.
        given: the reward was given by a multi-turn environment, not computed by the rewards
            (:meth:`RewardMix.score`'s ``given``): its correctness term holds it, the other terms are
            not applicable, and the reward logs leave it out.
    """

    reward: float
    correct: float
    results: tuple[ScoreResult, ...]
    correctness: int = 0
    given: bool = False

    @property
    def parts(self) -> tuple[float | None, ...]:
        """Per term, its reward, or None where it does not apply."""
        return _parts(self.results)

    @property
    def status(self) -> str:
        return self.results[self.correctness].status

    @property
    def answer(self) -> str | None:
        """The correctness term's canonical answer (maj@k), when answers were asked for."""
        return self.results[self.correctness].answer


@dataclass(frozen=True)
class RewardMix:
    """The rewards a run scores each completion with, their weights, and which one is correctness.

    Build it with :meth:`from_config` (``model.scoring``: ``reward_funcs``, ``reward_weights``,
    ``correctness``, ``options``), which checks everything at start-up.

    Attributes:
        terms: the weighted terms; empty: each row's own ``reward`` field, weight 1.
        correctness: the name of the term that decides correctness (empty with no terms).
        scorer_options: ``{registered reward: options}`` for the
            :class:`~lit_rlvr.rewards.BatchScorer` (imported functions carry their own).

    Example:
        >>> mix = RewardMix.from_config(["math", "lit_rlvr.rewards.conventions._doc_trl_reward"], [1.0, 0.5], "math")
        >>> mix.names, mix.weights, mix.correctness, sorted(mix.records)
        (['math', '_doc_trl_reward'], [1.0, 0.5], 'math', ['_doc_trl_reward'])
        >>> rows = [{"id": "g", "prompt": "9 + 9?", "answer": "18"}]
        >>> from lit_rlvr.rewards import BatchScorer
        >>> with BatchScorer(workers=0, rewards=mix.records) as scorer:
        ...     [(s.reward, s.correct, s.parts) for s in mix.score(scorer, ["\\\\boxed{18}", "17"], rows * 2)]
        [(1.5, 1.0, (1.0, 1.0)), (0.0, 0.0, (0.0, 0.0))]
    """

    terms: tuple[RewardTerm, ...] = ()
    correctness: str = ""
    scorer_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_config(
        cls,
        reward_funcs: Sequence[str | Callable] | None = None,
        reward_weights: Sequence[float] | None = None,
        correctness: str | None = None,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        key: str = "scoring",
        whole_batch: Sequence[str] | None = None,
    ) -> RewardMix:
        """The mix of ``model.scoring`` (``key``), checked: every name, path and callable resolves,
        one weight per reward (not all 0), unique names, ``correctness`` names a term (required
        with several) that can exceed 0.5, options fit, ``whole_batch`` names TRL functions.

        Raises:
            ValueError: naming the key, the value and what is accepted.
            ImportError: an import path that does not import.
        """
        from lit_rlvr.rewards.scorer import check_reward_options, reward_table

        options = {name: dict(opts) for name, opts in (options or {}).items()}
        if reward_funcs is None:
            for name, value in (
                ("reward_weights", reward_weights),
                ("correctness", correctness),
                ("whole_batch", whole_batch),
            ):
                if value is not None:
                    raise ValueError(
                        f"{key}.{name}={value!r} needs {key}.reward_funcs (without it each row's own reward is the only one)"
                    )
            check_reward_options(options, reward_table(), key=f"{key}.options")
            return cls((), "", options)
        funcs = list(reward_funcs)
        if not funcs:
            raise ValueError(f"{key}.reward_funcs must name at least one reward, or be null (each row's own reward)")
        weights = _checked_weights(reward_weights, len(funcs), f"{key}.reward_weights")
        table = reward_table()
        built = [_term(ref, w, table, options, f"{key}.reward_funcs") for ref, w in zip(funcs, weights)]
        terms = [term for term, _ in built]
        names = [t.name for t in terms]
        if len(set(names)) != len(names):
            raise ValueError(
                f"{key}.reward_funcs: two rewards share a name in {names}; each is logged and chosen by its name"
            )
        terms = _with_whole_batch(terms, whole_batch, f"{key}.whole_batch")
        imported = {
            options_name for term, options_name in built if term.record is not None
        }  # their options are call arguments
        registered = {name: opts for name, opts in options.items() if name not in imported}
        row_rewards = set(table) if any(t.source == ROW for t in terms) else set()  # the rows name any of them
        unused = sorted(set(registered) - {t.source for t in terms} - row_rewards)
        if unused:
            raise ValueError(f"{key}.options names {unused}, which are not in {key}.reward_funcs {names}")
        check_reward_options(registered, table, key=f"{key}.options")
        if correctness is None and len(terms) > 1:
            raise ValueError(
                f"{key}.correctness must name the reward that decides correctness (Pass@k, pass counts), one of {names}"
            )
        correctness = names[0] if correctness is None else correctness
        if correctness not in names:
            raise ValueError(f"{key}.correctness={correctness!r} is not one of {key}.reward_funcs' names {names}")
        mix = cls(tuple(terms), correctness, registered)
        mix.check_correctness(f"{key}.correctness")
        return mix

    # ------------------------------------------------------------------ what it is
    @property
    def names(self) -> list[str]:
        """The terms' names (what ``train/reward/<name>`` logs); empty: each row's own reward."""
        return [t.name for t in self.terms]

    @property
    def weights(self) -> list[float]:
        return [t.weight for t in self.terms]

    @property
    def records(self) -> dict[str, Reward]:
        """The imported functions' records by name: the :class:`~lit_rlvr.rewards.BatchScorer`'s ``rewards``."""
        return {t.name: t.record for t in self.terms if t.record is not None}

    @property
    def trajectory_terms(self) -> list[int]:
        """Indices of the terms that read a multi-turn trajectory (registered with ``trajectory=True``:
        ``tool_call``)."""
        return [
            k
            for k, t in enumerate(self.terms)
            if t.record is None and t.source in REWARDS and REWARDS.trait(t.source, "trajectory", default=False)
        ]

    @property
    def _correctness_index(self) -> int:
        return self.names.index(self.correctness) if self.terms else 0

    def correctness_sources(self, rows: Sequence[dict]) -> list[str]:
        """What judges correctness for ``rows``: the correctness term's registered name or import
        path, or the rows' own reward names (no terms, or the :data:`ROW` term; the reference cache
        records them)."""
        if not self.terms or self.terms[self._correctness_index].source == ROW:
            return sorted({str(row.get("reward")) for row in rows})
        return [self.terms[self._correctness_index].source]

    def reward_values(self, rows: Sequence[dict] | None = None) -> frozenset[float] | None:
        """Every value the training reward Σ_k w_k r_k can take, when every reward in it declares its
        own (:attr:`~lit_rlvr.rewards.base.Reward.values`; a failed item's 0 included); None when
        some reward's are unknown (an imported function), or depend on ``rows`` not given (each
        row's own reward).

        Example:
            >>> RewardMix.from_config(["math"]).reward_values(), RewardMix.from_config(["math"], [2.0]).reward_values()
            (frozenset({0.0, 1.0}), frozenset({0.0, 2.0}))
            >>> RewardMix().reward_values() is None, RewardMix().reward_values([{"reward": "sql"}])
            (True, frozenset({0.0, 1.0}))
        """
        total = {0.0}
        for term in self.terms or (RewardTerm(ROW, ROW),):
            names = (
                [term.source]
                if term.source != ROW
                else None
                if rows is None
                else sorted({str(r.get("reward")) for r in rows})
            )
            values = None if term.record is not None or names is None else _declared_values(names)
            if values is None:
                return None
            total = {a + term.weight * v for a in total for v in values}
            if len(total) > 4096:  # too many to be of use to a check
                return None
        return frozenset(total)

    def require_binary(self, where: str, rows: Sequence[dict] | None = None) -> None:
        """Raise ``ValueError`` naming ``where`` when the training reward is known to take values
        other than 0 and 1 (:meth:`reward_values`): at start-up, for an advantage that needs binary
        rewards (``passk``); with unknown values the estimator checks each batch itself.

        Example:
            >>> RewardMix.from_config(["math", "sql"], [1.0, 1.0], "math").require_binary("model.loss.advantage='passk'")
            Traceback (most recent call last):
            ...
            ValueError: model.loss.advantage='passk' needs binary rewards in {0, 1}, but the configured rewards (math×1, sql×1) give [0.0, 1.0, 2.0]; use one 0/1 reward (model.scoring.reward_funcs, reward_weights) or another advantage
        """
        values = self.reward_values(rows)
        if values is not None and not values <= {0.0, 1.0}:
            terms = ", ".join(f"{t.name}×{t.weight:g}" for t in self.terms) or "each row's own reward"
            raise ValueError(
                f"{where} needs binary rewards in {{0, 1}}, but the configured rewards ({terms}) give "
                f"{sorted(values)}; use one 0/1 reward (model.scoring.reward_funcs, reward_weights) or another advantage"
            )

    def check_correctness(self, key: str, rows: Sequence[dict] | None = None) -> None:
        """Raise ``ValueError`` when the correctness reward is known never to exceed 0.5, the mark a
        completion must pass to count as correct (Pass@k, maj@k, pass counts, the reference cache).

        Example:
            >>> from lit_rlvr.rewards.base import REWARDS, register_reward
            >>> _ = register_reward("_doc_half", values=(0.0, 0.5))(lambda completion, answer, **row: 0.5)
            >>> RewardMix.from_config(["_doc_half"])
            Traceback (most recent call last):
            ...
            ValueError: scoring.correctness: a completion counts as correct when its correctness reward is > 0.5, but '_doc_half' only gives [0.0, 0.5]
            >>> _ = REWARDS.pop("_doc_half")
        """
        term = self.terms[self._correctness_index] if self.terms else RewardTerm(ROW, ROW)
        if term.record is not None:
            return  # an imported function: any value
        names = (
            [term.source]
            if term.source != ROW
            else []
            if rows is None
            else sorted({str(r.get("reward")) for r in rows})
        )
        for name in names:
            values = _declared_values([name])
            if values is not None and max(values) <= 0.5:
                raise ValueError(
                    f"{key}: a completion counts as correct when its correctness reward is > 0.5, but {name!r} "
                    f"only gives {sorted(values)}"
                )

    def check_rows(self, rows: Sequence[dict], where: str = "data") -> None:
        """Raise ``ValueError`` at start-up for a row these rewards cannot score: without terms (or
        with the :data:`ROW` term), a row needs ``reward`` and ``answer``; a registered term needs an ``answer``.
        ``rows`` are those the rewards score (a multi-turn environment may score its own:
        :func:`~lit_rlvr.rollout.turns.rows_scored_by_rewards`).

        Example:
            >>> RewardMix().check_rows([{"id": "q1", "prompt": "p", "answer": "1"}])
            Traceback (most recent call last):
            ...
            ValueError: data: row 'q1' has no ['reward'] to score it with; name its reward (a `reward` field, or the adapter's `reward` option: a registered reward such as 'math'), set model.scoring.reward_funcs, or run it in an environment that scores its trajectories (model.environment: sql, calculator, skyrl, a TRL class with get_reward, ...)
        """
        sources = {t.source for t in self.terms}
        need = (
            ("reward", "answer")
            if not self.terms or ROW in sources
            else ("answer",)
            if any(t.record is None for t in self.terms)
            else ()
        )
        for row in rows:
            missing = [k for k in need if row.get(k) is None]
            if missing:
                fix = (
                    (
                        "name its reward (a `reward` field, or the adapter's `reward` option: a registered reward "
                        "such as 'math'), set model.scoring.reward_funcs, or run it in an environment that scores "
                        "its trajectories (model.environment: sql, calculator, skyrl, a TRL class with get_reward, ...)"
                    )
                    if "reward" in missing
                    else "give the adapter an answer field"
                    if not self.terms
                    else "give the adapter an answer field, or drop the registered rewards from model.scoring.reward_funcs"
                )
                raise ValueError(f"{where}: row {row.get('id')!r} has no {missing} to score it with; {fix}")
        for k, term in enumerate(self.terms):
            if term.record is not None and rows:
                _check_calls(term, rows, self.item_rows(rows[:1])[k][0], where)
        self.check_correctness(where, rows)

    # ------------------------------------------------------------------ scoring
    def item_rows(
        self,
        rows: Sequence[dict],
        completion_ids: Sequence[Sequence[int]] | None = None,
        trainer_state: TrainerState | None = None,
        tool_calls: Sequence[Sequence[str]] | None = None,
    ) -> list[list[dict]]:
        """Per term, the rows routed to it (the scorer's items): ``reward`` names the term, a TRL
        function also gets ``completion_ids`` and ``trainer_state``, and a trajectory term
        (:attr:`trajectory_terms`) each trajectory's ``tool_calls`` (multi-turn rollouts only).

        Example:
            >>> mix = RewardMix.from_config(["math", "sql"], correctness="math")
            >>> [[r["reward"] for r in term] for term in mix.item_rows([{"id": "a", "answer": "1"}])]
            [['math'], ['sql']]
        """
        if not self.terms:
            return [list(rows)]
        out, trajectory = [], set(self.trajectory_terms) if tool_calls is not None else set()
        for k, term in enumerate(self.terms):
            extra = {"trainer_state": trainer_state or TrainerState()} if term.convention == "trl" else {}
            term_rows = []
            for i, row in enumerate(rows):
                item = {**row, "reward": term.scorer_name(row), "answer": row.get("answer"), **extra}
                if extra and completion_ids is not None:
                    item["completion_ids"] = list(completion_ids[i])
                if k in trajectory:
                    item["tool_calls"] = tuple(tool_calls[i])
                term_rows.append(item)
            out.append(term_rows)
        return out

    def score(
        self,
        scorer,
        completions: Sequence[str],
        rows: Sequence[dict],
        *,
        with_answers: bool = False,
        completion_ids: Sequence[Sequence[int]] | None = None,
        trainer_state: TrainerState | None = None,
        given: Sequence[float | None] | None = None,
        tool_calls: Sequence[Sequence[str]] | None = None,
    ) -> list[MixedScore]:
        """Score every completion with every term in ``scorer``'s workers and combine them.

        A completion whose reward is ``given`` (a multi-turn environment's, docs/agents.md) is not
        scored: that reward is its reward and its correctness (correct when > 0.5, as a correctness
        reward's), and its answer (maj@k, distinct answers) is its text, stripped; only the
        trajectory terms (:attr:`trajectory_terms`) are scored, and added with their weights.

        Args:
            scorer: a :class:`~lit_rlvr.rewards.BatchScorer` built with ``rewards=self.records``
                and ``options=self.scorer_options``.
            completions: B completion texts.
            rows: B prompt rows (a prompt's row repeated for each of its samples).
            with_answers: also compute the correctness term's canonical answers (maj@k).
            completion_ids: B completion token-id lists (TRL's ``completion_ids``), when known.
            trainer_state: progress for TRL's ``trainer_state``.
            given: B rewards given by the environments (None where the rewards score the completion).
            tool_calls: multi-turn rollouts: B trajectories' tool calls, for the trajectory terms.

        Returns:
            B :class:`MixedScore`.
        """
        if given is not None and any(g is not None for g in given):
            todo = [i for i, g in enumerate(given) if g is None]
            pick = lambda values: None if values is None else [values[i] for i in todo]  # noqa: E731
            scored = iter(
                self.score(
                    scorer,
                    pick(completions),
                    pick(rows),
                    with_answers=with_answers,
                    completion_ids=pick(completion_ids),
                    trainer_state=trainer_state,
                    tool_calls=pick(tool_calls),
                )
                if todo
                else []
            )
            extra = self._trajectory_results(scorer, completions, rows, tool_calls, given)
            return [
                next(scored) if g is None else self.given_score(g, completions[i] if with_answers else None, extra[i])
                for i, g in enumerate(given)
            ]
        per_term = self.item_rows(rows, completion_ids, trainer_state, tool_calls)  # (K, B)
        c = self._correctness_index
        B, K = len(completions), len(per_term)
        by_term: list[list[ScoreResult]] = [[] for _ in range(K)]
        pooled = [k for k in range(K) if not (self.terms and self.terms[k].whole_batch)]
        plain = [k for k in pooled if not (with_answers and k == c)]  # canonical answers only where they are used
        if B and with_answers and c in pooled:
            by_term[c] = scorer.score(list(completions), per_term[c], with_answers=True)
        if B and plain:
            flat = scorer.score(list(completions) * len(plain), [row for k in plain for row in per_term[k]])
            for j, k in enumerate(plain):
                by_term[k] = flat[j * B : (j + 1) * B]
        for k in set(range(K)) - set(pooled):
            by_term[k] = _score_whole_batch(
                self.terms[k].record, completions, per_term[k], scorer.timeout_s, with_answers and k == c
            )
        weights = self.weights or [1.0]
        out = []
        for i in range(B):
            results = tuple(by_term[k][i] for k in range(K))
            out.append(MixedScore(weighted_sum(_parts(results), weights), results[c].reward, results, c))
        return out

    def score_rollouts(
        self,
        scorer,
        rollouts: Any,
        prompts: Sequence[dict],
        trainer_state: TrainerState | None = None,
        with_answers: bool = False,
    ) -> tuple[list[MixedScore], list[dict]]:
        """:meth:`score` on ``rollouts`` (``Rollouts``, ``n`` samples of each of ``prompts``): P·n scores,
        prompt-major, of each trajectory's final turn (an environment's own reward is kept), and
        their P·n rows. Nothing is scored without a prompt (a rank with only padding prompts)."""
        texts, ids = rollouts.final_turns()  # multi-turn: each trajectory's last turn
        rows = [row for row in prompts for _ in range(rollouts.n)]  # (P·n,)
        given, scores = rollouts.environment_rewards(), []
        if rows:  # none: only padding prompts on this rank
            scores = self.score(
                scorer,
                texts,
                rows,
                with_answers=with_answers,
                completion_ids=ids,
                trainer_state=trainer_state,
                given=given,
                tool_calls=None if rollouts.episodes is None else [e.tool_calls for e in rollouts.episodes],
            )
        return scores, rows

    def given_score(
        self, reward: float, text: str | None = None, trajectory: Mapping[int, ScoreResult] | None = None
    ) -> MixedScore:
        """The score of a completion whose reward a multi-turn environment gave (:meth:`score`'s ``given``):
        that reward, plus the trajectory terms' results (``trajectory``, by term index) times their weights.

        Example:
            >>> s = RewardMix.from_config(["math"]).given_score(1.0, " 3*7+5; ")
            >>> s.reward, s.correct, s.answer, s.given
            (1.0, 1.0, '3*7+5;', True)
            >>> mix = RewardMix.from_config(["math", "tool_call"], [1.0, 0.1], "math")
            >>> s = mix.given_score(1.0, trajectory={1: ScoreResult(1.0)})
            >>> s.reward, s.correct, s.parts
            (1.1, 1.0, (1.0, 1.0))
        """
        c, K, trajectory = self._correctness_index, max(len(self.terms), 1), trajectory or {}
        answer = text.strip() or None if text is not None else None
        results = tuple(
            ScoreResult(reward, STATUS_OK, answer=answer)
            if k == c
            else trajectory.get(k, ScoreResult(0.0, STATUS_NOT_APPLICABLE))
            for k in range(K)
        )
        parts = _parts(results)
        bonus = weighted_sum([parts[k] for k in trajectory], [self.terms[k].weight for k in trajectory])
        return MixedScore(math.fsum([float(reward), bonus]), float(reward), results, c, given=True)

    def _trajectory_results(
        self,
        scorer,
        completions: Sequence[str],
        rows: Sequence[dict],
        tool_calls: Sequence[Sequence[str]] | None,
        given: Sequence[float | None],
    ) -> list[dict[int, ScoreResult]]:
        """Per completion, ``{term index: result}`` of the trajectory terms, scored for the completions
        whose reward an environment gave (empty for the others, and without ``tool_calls``)."""
        out: list[dict[int, ScoreResult]] = [{} for _ in completions]
        ks, todo = self.trajectory_terms, [i for i, g in enumerate(given) if g is not None]
        if not ks or not todo or tool_calls is None:
            return out
        per_term = self.item_rows([rows[i] for i in todo], tool_calls=[tool_calls[i] for i in todo])
        texts = [completions[i] for i in todo]
        flat = scorer.score(texts * len(ks), [row for k in ks for row in per_term[k]])
        for j, k in enumerate(ks):
            for i, result in zip(todo, flat[j * len(todo) : (j + 1) * len(todo)]):
                out[i][k] = result
        return out

    def correctness_scorer(self, scorer) -> CorrectnessScorer:
        """``scorer`` seen through the correctness term only (the reference cache's rewards and pass counts)."""
        return CorrectnessScorer(self, scorer)


@dataclass(frozen=True)
class CorrectnessScorer:
    """``score(completions, rows) -> list[ScoreResult]`` of a :class:`RewardMix`'s correctness term
    alone, what :func:`~lit_rlvr.cache.builder.build_reference_cache` takes as its scorer."""

    mix: RewardMix
    scorer: Any

    def score(self, completions: Sequence[str], rows: Sequence[dict], with_answers: bool = False) -> list[ScoreResult]:
        rows_for_term = self.mix.item_rows(rows)[self.mix._correctness_index]
        return self.scorer.score(list(completions), rows_for_term, with_answers=with_answers)


def _parts(results: Sequence[ScoreResult]) -> tuple[float | None, ...]:
    return tuple(None if r.status == STATUS_NOT_APPLICABLE else r.reward for r in results)


def _term(
    entry: str | Callable, weight: float, table, options: Mapping[str, Mapping], key: str
) -> tuple[RewardTerm, str]:
    """One ``reward_funcs`` entry (each row's own reward, a registered reward, or a function by
    import path or as a callable, with its options) and the name its options go by."""
    if isinstance(entry, str) and (entry == ROW or entry in table):
        return RewardTerm(entry, entry, weight), entry
    if isinstance(entry, str) and entry.startswith(PYTHON_ONLY.split("{", 1)[0]):
        raise ValueError(
            f"{key}: {entry!r} was given as a Python object, which a checkpoint or a config cannot hold; "
            "pass the rewards again (RLVRModule.load_from_checkpoint(..., scoring=ScoringOptions(reward_funcs=[...])))"
        )
    if isinstance(entry, str) and not is_import_path(entry):
        raise ValueError(
            f"{key}: unknown reward {entry!r}; registered: {sorted(table)}, or give an import path "
            "(package.module.function, package.module:function or file.py:function)"
        )
    if not isinstance(entry, str) and not callable(entry):
        raise ValueError(
            f"{key}: {entry!r:.60} is not a reward: give a registered reward's name, an import path or (in "
            "Python) a function"
        )
    fn = load_function(entry, "reward function") if isinstance(entry, str) else entry
    options_name = callable_name(fn)  # a factory's options are its arguments, under the factory's name
    opts = dict(options.get(options_name, {}))
    options_key = f"{key.rsplit('.', 1)[0]}.options.{options_name}"
    _check_call_options(fn, opts, options_key)
    try:
        func = RewardFunc(entry, options=opts)
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from None
    source = entry if isinstance(entry, str) else callable_source(fn)
    return RewardTerm(func.name, source, weight, imported_reward(func.name, func)), options_name


def _declared_values(names: Sequence[str]) -> frozenset[float] | None:
    """The values the registered rewards ``names`` declare, with a failed item's 0; None if one declares none."""
    from lit_rlvr.rewards.scorer import reward_table

    table, out = reward_table(), {0.0}
    for name in names:
        values = table[name].values if name in table else None
        if values is None:
            return None
        out.update(values)
    return frozenset(out)


def _check_calls(term: RewardTerm, rows: Sequence[dict], first: dict, where: str) -> None:
    """Raise ``ValueError`` unless ``term``'s function takes every row's fields its convention reads
    (verl's ``extra_info`` a dict) and can be called on the first row (``first``, its item row)."""
    func = term.record.score
    row = first
    try:
        for row in rows:
            func.check_row(row)
        row = first
        func.check_call(first)
    except TypeError as err:
        columns = sorted(
            k for k in row if k not in ("trainer_state", "reward") and not (k == "answer" and row[k] is None)
        )
        raise ValueError(
            f"{where}: reward function {term.name!r} ({term.source}, {func.convention} convention) cannot be "
            f"called on row {row.get('id')!r}: {err} (the row gives {columns})"
        ) from None


def _score_whole_batch(
    record: Reward, completions: Sequence[str], rows: list[dict], item_timeout_s: float, with_answers: bool
) -> list[ScoreResult]:
    """One call of a TRL function on every completion, in this process, under ``item_timeout_s`` per completion."""
    results = record.score.score_batch(list(completions), rows, item_timeout_s * max(len(completions), 1))
    results = [in_range(r, record.value_range) for r in results]
    if with_answers:
        results = [replace(r, answer=record.answer_key(c)) for r, c in zip(results, completions)]
    return results


def _checked_weights(weights: Sequence[float] | None, count: int, key: str) -> list[float]:
    """One finite weight per reward (all 1 when None), not all 0.

    Example:
        >>> _checked_weights(None, 2, "w"), _checked_weights([1, 0], 2, "w")
        ([1.0, 1.0], [1.0, 0.0])
        >>> _checked_weights([0, 0.0], 2, "scoring.reward_weights")
        Traceback (most recent call last):
        ...
        ValueError: scoring.reward_weights=[0, 0.0]: every weight is 0, so every completion's reward would be 0 and nothing is learnt; give the rewards to train on a non-zero weight (a weight of 0 only logs a reward)
    """
    if weights is None:
        return [1.0] * count
    weights = list(weights)
    if len(weights) != count:
        raise ValueError(f"{key} has {len(weights)} weights for {count} reward_funcs; give one per reward")
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise ValueError(f"{key} must be finite numbers, got {weights!r}")
    if all(w == 0 for w in weights):
        raise ValueError(
            f"{key}={weights!r}: every weight is 0, so every completion's reward would be 0 and nothing is "
            "learnt; give the rewards to train on a non-zero weight (a weight of 0 only logs a reward)"
        )
    return [float(w) for w in weights]


def _with_whole_batch(terms: list[RewardTerm], names: Sequence[str] | None, key: str) -> list[RewardTerm]:
    """``terms`` with the ones ``names`` lists called once per batch; each must be a TRL function's."""
    if not names:
        return terms
    known = {t.name: t for t in terms}
    for name in names:
        term = known.get(name)
        if term is None:
            raise ValueError(f"{key} names {name!r}, which is not one of the reward_funcs' names {list(known)}")
        if term.convention != "trl":
            raise ValueError(
                f"{key}: {name!r} is a {term.convention} function, called once per completion by design; only "
                "TRL functions (lists of completions) can take the whole batch"
            )
    return [replace(t, whole_batch=t.name in set(names)) for t in terms]


def _check_call_options(fn, options: Mapping[str, Any], key: str) -> None:
    """Raise ``ValueError`` unless ``fn`` takes every option (a named parameter, or ``**kwargs``)."""
    if not options:
        return
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise ValueError(f"{key}: {sorted(params)} are the parameters of the function; it takes no {unknown}")
