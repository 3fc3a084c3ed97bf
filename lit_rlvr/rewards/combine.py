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

Departures from TRL: a completion that no reward applies to scores 0 (TRL ≥ 1.x gives it a zero
advantage instead; here the registered advantage estimators see the 0), and is warned about once;
TRL's ``normalize_then_sum`` aggregation is not offered.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_rlvr.rewards.base import STATUS_NOT_APPLICABLE, Reward, ScoreResult
from lit_rlvr.rewards.conventions import TrainerState, imported_reward, is_import_path, load_function


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
    """

    name: str
    source: str
    weight: float = 1.0
    record: Reward | None = None

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
    """

    reward: float
    correct: float
    results: tuple[ScoreResult, ...]
    correctness: int = 0

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
        reward_funcs: Sequence[str] | None = None,
        reward_weights: Sequence[float] | None = None,
        correctness: str | None = None,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        key: str = "scoring",
    ) -> RewardMix:
        """The mix of ``model.scoring`` (``key``), checked: every name and path resolves, one weight
        per reward, unique names, ``correctness`` names a term (required with several), options fit.

        Raises:
            ValueError: naming the key, the value and what is accepted.
            ImportError: an import path that does not import.
        """
        from lit_rlvr.rewards.scorer import check_reward_options, reward_table

        options = {name: dict(opts) for name, opts in (options or {}).items()}
        if reward_funcs is None:
            for name, value in (("reward_weights", reward_weights), ("correctness", correctness)):
                if value is not None:
                    raise ValueError(f"{key}.{name}={value!r} needs {key}.reward_funcs (without it each row's own reward is the only one)")
            check_reward_options(options, reward_table(), key=f"{key}.options")
            return cls((), "", options)
        funcs = list(reward_funcs)
        if not funcs:
            raise ValueError(f"{key}.reward_funcs must name at least one reward, or be null (each row's own reward)")
        weights = [1.0] * len(funcs) if reward_weights is None else list(reward_weights)
        if len(weights) != len(funcs):
            raise ValueError(f"{key}.reward_weights has {len(weights)} weights for {len(funcs)} reward_funcs; give one per reward")
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                raise ValueError(f"{key}.reward_weights must be finite numbers, got {weights!r}")
        table = reward_table()
        terms = [_term(ref, float(w), table, options, f"{key}.reward_funcs") for ref, w in zip(funcs, weights)]
        names = [t.name for t in terms]
        if len(set(names)) != len(names):
            raise ValueError(f"{key}.reward_funcs: two rewards share a name in {names}; each is logged and chosen by its name")
        imported = {t.name for t in terms if t.record is not None}
        registered = {name: opts for name, opts in options.items() if name not in imported}
        row_rewards = set(table) if any(t.source == ROW for t in terms) else set()  # the rows name any of them
        unused = sorted(set(registered) - {t.source for t in terms} - row_rewards)
        if unused:
            raise ValueError(f"{key}.options names {unused}, which are not in {key}.reward_funcs {names}")
        check_reward_options(registered, table, key=f"{key}.options")
        if correctness is None and len(terms) > 1:
            raise ValueError(f"{key}.correctness must name the reward that decides correctness (Pass@k, pass counts), one of {names}")
        correctness = names[0] if correctness is None else correctness
        if correctness not in names:
            raise ValueError(f"{key}.correctness={correctness!r} is not one of {key}.reward_funcs' names {names}")
        return cls(tuple(terms), correctness, registered)

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
    def _correctness_index(self) -> int:
        return self.names.index(self.correctness) if self.terms else 0

    def correctness_sources(self, rows: Sequence[dict]) -> list[str]:
        """What judges correctness for ``rows``: the correctness term's registered name or import
        path, or the rows' own reward names (no terms, or the :data:`ROW` term; the reference cache
        records them)."""
        if not self.terms or self.terms[self._correctness_index].source == ROW:
            return sorted({str(row.get("reward")) for row in rows})
        return [self.terms[self._correctness_index].source]

    def check_rows(self, rows: Sequence[dict], where: str = "data") -> None:
        """Raise ``ValueError`` at start-up for a row these rewards cannot score: without terms (or
        with the :data:`ROW` term), a row needs ``reward`` and ``answer``; a registered term needs an ``answer``."""
        sources = {t.source for t in self.terms}
        need = (("reward", "answer") if not self.terms or ROW in sources
                else ("answer",) if any(t.record is None for t in self.terms) else ())  # fmt: skip
        for row in rows:
            missing = [k for k in need if row.get(k) is None]
            if missing:
                fix = ("set model.scoring.reward_funcs, or give the adapter a `reward` (and an answer field)" if not self.terms
                       else "give the adapter an answer field, or drop the registered rewards from model.scoring.reward_funcs")  # fmt: skip
                raise ValueError(f"{where}: row {row.get('id')!r} has no {missing} to score it with; {fix}")

    # ------------------------------------------------------------------ scoring
    def item_rows(self, rows: Sequence[dict], completion_ids: Sequence[Sequence[int]] | None = None,
                  trainer_state: TrainerState | None = None) -> list[list[dict]]:  # fmt: skip
        """Per term, the rows routed to it (the scorer's items): ``reward`` names the term, and a
        TRL function also gets ``completion_ids`` and ``trainer_state``.

        Example:
            >>> mix = RewardMix.from_config(["math", "sql"], correctness="math")
            >>> [[r["reward"] for r in term] for term in mix.item_rows([{"id": "a", "answer": "1"}])]
            [['math'], ['sql']]
        """
        if not self.terms:
            return [list(rows)]
        out = []
        for term in self.terms:
            extra = {"trainer_state": trainer_state or TrainerState()} if term.convention == "trl" else {}
            term_rows = []
            for i, row in enumerate(rows):
                item = {**row, "reward": term.scorer_name(row), "answer": row.get("answer"), **extra}
                if extra and completion_ids is not None:
                    item["completion_ids"] = list(completion_ids[i])
                term_rows.append(item)
            out.append(term_rows)
        return out

    def score(self, scorer, completions: Sequence[str], rows: Sequence[dict], *, with_answers: bool = False,
              completion_ids: Sequence[Sequence[int]] | None = None, trainer_state: TrainerState | None = None) -> list[MixedScore]:  # fmt: skip
        """Score every completion with every term in ``scorer``'s workers and combine them.

        Args:
            scorer: a :class:`~lit_rlvr.rewards.BatchScorer` built with ``rewards=self.records``
                and ``options=self.scorer_options``.
            completions: B completion texts.
            rows: B prompt rows (a prompt's row repeated for each of its samples).
            with_answers: also compute the correctness term's canonical answers (maj@k).
            completion_ids: B completion token-id lists (TRL's ``completion_ids``), when known.
            trainer_state: progress for TRL's ``trainer_state``.

        Returns:
            B :class:`MixedScore`.
        """
        per_term = self.item_rows(rows, completion_ids, trainer_state)  # (K, B)
        c = self._correctness_index
        B, K = len(completions), len(per_term)
        if with_answers and K > 1:  # canonical answers only where they are used
            others = [row for k, term_rows in enumerate(per_term) if k != c for row in term_rows]
            judged = scorer.score(list(completions), per_term[c], with_answers=True) if B else []
            rest = scorer.score(list(completions) * (K - 1), others) if B else []
            flat = rest[: c * B] + judged + rest[c * B :]
        else:
            flat = scorer.score(list(completions) * K, [row for term_rows in per_term for row in term_rows],
                                with_answers=with_answers) if B else []  # fmt: skip
        weights = self.weights or [1.0]
        out = []
        for i in range(B):
            results = tuple(flat[k * B + i] for k in range(K))
            out.append(MixedScore(weighted_sum(_parts(results), weights), results[c].reward, results, c))
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


def _term(ref: str, weight: float, table, options: Mapping[str, Mapping], key: str) -> RewardTerm:
    """One ``reward_funcs`` entry: each row's own reward, a registered reward, or an imported function with its options."""
    if ref == ROW or ref in table:
        return RewardTerm(ref, ref, weight)
    if not is_import_path(ref):
        raise ValueError(f"{key}: unknown reward {ref!r}; registered: {sorted(table)}, or give an import path "
                         "(package.module.function, package.module:function or file.py:function)")  # fmt: skip
    fn = load_function(ref)
    name = getattr(fn.func if isinstance(fn, functools.partial) else fn, "__name__", type(fn).__name__)  # TRL's get_callable_name
    opts = dict(options.get(name, {}))
    _check_call_options(fn, opts, f"{key.rsplit('.', 1)[0]}.options.{name}")
    return RewardTerm(name, ref, weight, imported_reward(name, ref, opts))


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
