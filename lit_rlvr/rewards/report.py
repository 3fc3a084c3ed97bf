"""What a batch of rewards came to, for the logs: status shares, each reward's mean, failures.

:class:`RewardReport` is the shell between :meth:`RewardMix.score <lit_rlvr.rewards.RewardMix.score>`
and a LightningModule's logger. For one scored batch it logs

- ``<prefix>/reward_status/<status>``: each status's share over all the rewards' items (every
  status every batch, so every rank logs the same keys; synced means);
- ``train/reward_errors``: the number of failed rewards (status ``error``), summed over ranks;
- ``<prefix>/reward/<name>``: with several rewards, each one's mean over the completions it
  applies to and scored (a failed item, status ``error`` or ``timeout``, is missing from the mean,
  not a 0), across ranks (TRL's ``rewards/<name>/mean``); a reward that applied to none is not
  logged;

and summarises each reward's failures (``error`` and ``timeout``) in the Python log, naming the
reward: items per status and the first reason verbatim at INFO; as a warning, with the first
error's traceback, the first time a reward fails in a run and whenever at least a quarter of its
batch failed (:class:`~lit_rlvr.rewards.scorer.ScoreSummary`). A reward that raises on every
item (status ``error``, on every rank) for ``max_failed_steps`` training batches in a row stops
the run with an error that names it and shows the traceback, rather than train on zeros; a
timeout does not count toward it (a slow service recovers, a bug does not). A completion that no
reward applies to scores 0 and is warned about once (TRL warns too).

:class:`EnvironmentReport` does the same for multi-turn environments: each distinct reason an
environment failed (raised or hung, :attr:`Episode.reason <lit_rlvr.rollout.types.Episode>`) is
warned about once, with how many trajectories of the batch it ended, and a training batch on which
every trajectory of every rank failed is a failed step: ``max_failed_steps`` of them in a row stop
the run with an error naming the reasons, rather than train on nothing with a loss of 0.

Only the training process imports this module (the reward workers never do): it needs torch for
the cross-rank sums.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lit_rlvr.rewards.base import STATUS_ERROR, STATUS_NOT_APPLICABLE, STATUS_TIMEOUT, STATUSES
from lit_rlvr.rewards.combine import MixedScore
from lit_rlvr.rewards.scorer import ScoreSummary, summarize

log = logging.getLogger(__name__)


def term_totals(scores: Sequence[MixedScore], num_terms: int) -> Tensor:
    """``(K, 4)`` float64: per reward, the sum and count of its rewards over the completions it
    applies to and scored (``error`` and ``timeout`` items left out), its ``error`` items, and its items.

    Example:
        >>> from lit_rlvr.rewards.base import ScoreResult
        >>> skip, failed = ScoreResult(0.0, "not_applicable"), ScoreResult(0.0, "error", "KeyError")
        >>> scores = [MixedScore(1.0, 1.0, (ScoreResult(1.0), skip)), MixedScore(0.5, 0.0, (failed, ScoreResult(0.5)))]
        >>> term_totals(scores, 2).tolist()
        [[1.0, 1.0, 1.0, 2.0], [0.5, 1.0, 0.0, 2.0]]
    """
    totals = torch.zeros(num_terms, 4, dtype=torch.float64)
    for s in scores:
        for k, r in enumerate(s.results):
            scored = r.status not in (STATUS_NOT_APPLICABLE, STATUS_ERROR, STATUS_TIMEOUT)
            totals[k] += torch.tensor(
                [r.reward if scored else 0.0, float(scored), float(r.status == STATUS_ERROR), 1.0], dtype=torch.float64
            )
    return totals


class RewardReport:
    """Logs one batch of rewards through a LightningModule, and stops a run whose reward always fails (module docstring).

    Args:
        names: the rewards' names (``RewardMix.names``); empty: each row's own reward, one term.
        max_failed_steps: training batches in a row on which a reward may fail on every item
            before the run stops (``model.scoring.max_failed_steps``); None: never.
    """

    def __init__(self, names: Sequence[str], max_failed_steps: int | None = None):
        self.names = list(names)
        self.max_failed_steps = max_failed_steps
        self._warned_unscored = False
        self._warned: set[str] = set()  # the rewards whose first failure of the run was a warning
        self._failed_steps = [0] * max(
            len(self.names), 1
        )  # per reward: training batches in a row it failed on every item

    def __call__(
        self,
        module: Any,
        scores: Sequence[MixedScore],
        rows: Sequence[dict],
        prefix: str,
        reduce_sum: Callable[[Tensor], Tensor],
    ) -> None:
        """Log ``scores`` of ``rows`` under ``prefix`` with ``module.log``; ``reduce_sum`` sums a tensor over the ranks.

        Raises:
            RuntimeError: a reward failed on every item for ``max_failed_steps`` training batches in a row.

        Completions whose reward an environment gave (:attr:`MixedScore.given`) are left out: no reward scored them.
        """
        kept = [i for i, s in enumerate(scores) if not s.given]
        scores, rows = [scores[i] for i in kept], [rows[i] for i in kept]
        summary = summarize([r for s in scores for r in s.results])
        size = max(summary.total, 1)
        for status in STATUSES:  # every status, every batch: the same keys on every rank (synced means)
            module.log(
                f"{prefix}/reward_status/{status}",
                summary.counts[status] / size,
                batch_size=size,
                add_dataloader_idx=False,
                sync_dist=True,
            )  # the validation set's name is in the prefix
        if prefix == "train":
            module.log("train/reward_errors", float(summary.errors), batch_size=size, reduce_fx="sum", sync_dist=True)
        names = self.names or [_row_rewards(rows)]
        totals = reduce_sum(term_totals(scores, len(names)))  # (K, 4), every rank's
        where = f"{prefix} rewards (step {module.global_step}, rank {module.global_rank})"
        term_summaries = [summarize([s.results[k] for s in scores]) for k in range(len(names))]
        for name, term_summary in zip(names, term_summaries):
            self.report_failures(term_summary, f"{where}: reward {name!r}", name, prefix)
        if self.names:
            self.log_terms(module, totals, scores, rows, prefix)
        if prefix == "train":
            self.check_failing(totals, names, term_summaries)

    def log_terms(
        self, module: Any, totals: Tensor, scores: Sequence[MixedScore], rows: Sequence[dict], prefix: str
    ) -> None:
        """``<prefix>/reward/<name>``: each reward's mean over the completions it applies to and scored, across ranks."""
        for k, name in enumerate(self.names):
            if totals[k, 1] > 0:
                module.log(
                    f"{prefix}/reward/{name}",
                    float(totals[k, 0] / totals[k, 1]),
                    batch_size=int(totals[k, 1]),
                    add_dataloader_idx=False,
                    sync_dist=False,
                )
        unscored = next((i for i, s in enumerate(scores) if all(p is None for p in s.parts)), None)
        if unscored is not None and not self._warned_unscored:  # TRL warns too; once is enough
            self._warned_unscored = True
            from lightning.pytorch.utilities import rank_zero_warn

            rank_zero_warn(
                f"every reward of {self.names} returned None for a completion of row {rows[unscored].get('id')!r}, "
                "so it scores 0; check that some reward judges every row"
            )

    def report_failures(self, summary: ScoreSummary, where: str, name: str, prefix: str) -> None:
        """One reward's failures in the Python log: INFO always, WARNING (with the first traceback)
        the first time in the run and when loud."""
        if not summary.failures:
            return
        log.info("%s: %s", where, summary)
        if summary.loud or name not in self._warned:
            self._warned.add(name)
            counted = "; train/reward_errors counts the errors" if prefix == "train" and summary.errors else ""
            traceback = f"\n{summary.first_traceback.rstrip()}" if summary.first_traceback else ""
            log.warning(
                "%s: %d of %d items failed (status error or timeout), each scored 0%s: %s%s",
                where,
                summary.failures,
                summary.total,
                counted,
                summary,
                traceback,
            )

    def check_failing(self, totals: Tensor, names: Sequence[str], summaries: Sequence[ScoreSummary]) -> None:
        """Count, per reward, the training batches in a row on which it raised on every item of every
        rank (``totals``: summed over the ranks, so every rank decides alike); raise at the limit."""
        for k, name in enumerate(names):
            failed_all = totals[k, 3] > 0 and totals[k, 2] == totals[k, 3]
            self._failed_steps[k] = self._failed_steps[k] + 1 if failed_all else 0
            if self.max_failed_steps is not None and self._failed_steps[k] >= self.max_failed_steps:
                first = summaries[k]
                detail = (
                    f": first error here: {first.first_reason}"
                    + (f"\n{first.first_traceback.rstrip()}" if first.first_traceback else "")
                    if first.first_reason is not None
                    else " (this rank scored none of its items)"
                )
                raise RuntimeError(
                    f"reward {name!r} raised on every item, on every rank, for {self._failed_steps[k]} training batches in a row "
                    f"(model.scoring.max_failed_steps={self.max_failed_steps}), so the run stops rather than train on rewards of "
                    f"0; fix the reward or its data{detail}"
                )


ENV_FAILED = ("env_error", "env_timeout")  # the episode statuses of an environment that raised or hung
MAX_WARNED_REASONS = 20  # distinct failure reasons warned about in a run; later ones go to the INFO log


class EnvironmentReport:
    """Shows why environments failed, and stops a run whose environments fail on every trajectory (module docstring).

    Args:
        max_failed_steps: training batches in a row on which every trajectory's environment may fail
            (on every rank) before the run stops (``model.scoring.max_failed_steps``); None: never.

    Example:
        >>> from types import SimpleNamespace as E
        >>> report = EnvironmentReport(max_failed_steps=2)
        >>> failed = [E(status="env_error", reason="ValueError: no tool-call parser")] * 4
        >>> report(failed, "step 0, rank 0", lambda t: t)
        >>> report(failed, "step 1, rank 0", lambda t: t)
        Traceback (most recent call last):
        ...
        RuntimeError: the environment failed on every trajectory, on every rank, for 2 training batches in a row (model.scoring.max_failed_steps=2), so the run stops rather than train on nothing; reasons here (step 1, rank 0): 4x ValueError: no tool-call parser
    """

    def __init__(self, max_failed_steps: int | None = None):
        self.max_failed_steps = max_failed_steps
        self.failed_steps = 0  # training batches in a row on which every trajectory's environment failed
        self._warned: set[str] = set()

    def __call__(self, episodes: Sequence[Any], where: str, reduce_sum: Callable[[Tensor], Tensor]) -> None:
        """Warn about each new reason among ``episodes`` (a training batch's :class:`Episode` list), count
        the batch as failed when every rank's every trajectory failed; ``reduce_sum`` sums over the ranks.

        Raises:
            RuntimeError: ``max_failed_steps`` failed batches in a row.
        """
        reasons = Counter(e.reason or e.status for e in episodes if e.status in ENV_FAILED)
        for reason, count in reasons.most_common():
            if reason in self._warned or len(self._warned) >= MAX_WARNED_REASONS:
                log.info("%s: %d of %d trajectories' environments failed: %s", where, count, len(episodes), reason)
            else:
                self._warned.add(reason)
                log.warning(
                    "%s: the environment failed on %d of %d trajectories (reward 0, not trained on; "
                    "train/env_failed is their share): %s",
                    where,
                    count,
                    len(episodes),
                    reason,
                )
        totals = reduce_sum(torch.tensor([sum(reasons.values()), len(episodes)], dtype=torch.float64))
        failed_all = totals[1] > 0 and totals[0] == totals[1]
        self.failed_steps = self.failed_steps + 1 if failed_all else 0
        if self.max_failed_steps is not None and self.failed_steps >= self.max_failed_steps:
            shown = "; ".join(f"{n}x {r}" for r, n in reasons.most_common(3)) or "none on this rank"
            raise RuntimeError(
                f"the environment failed on every trajectory, on every rank, for {self.failed_steps} training batches "
                f"in a row (model.scoring.max_failed_steps={self.max_failed_steps}), so the run stops rather than train "
                f"on nothing; reasons here ({where}): {shown}"
            )


def _row_rewards(rows: Sequence[dict]) -> str:
    """The name of the one term of a mix without ``reward_funcs``: the rows' own rewards."""
    return "/".join(sorted({str(row.get("reward")) for row in rows})) or "row"
