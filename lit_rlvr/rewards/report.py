"""What a batch of rewards came to, for the logs: status shares, each reward's mean, failures.

:class:`RewardReport` is the shell between :meth:`RewardMix.score <lit_rlvr.rewards.RewardMix.score>`
and a LightningModule's logger. For one scored batch it logs

- ``<prefix>/reward_status/<status>``: each status's share over all the rewards' items (every
  status every batch, so every rank logs the same keys; synced means);
- ``train/reward_errors``: the number of failed rewards (status ``error``), summed over ranks;
- ``<prefix>/reward/<name>``: with several rewards, each one's mean over the completions it
  applies to, across ranks (TRL's ``rewards/<name>/mean``); a reward that applied to none is not
  logged;

and summarises a batch with failures in the Python log (items per status, the first reason
verbatim): at INFO, as a warning the first time in a run and whenever at least a quarter of the
batch failed (:class:`~lit_rlvr.rewards.scorer.ScoreSummary`). A completion that no reward
applies to scores 0 and is warned about once (TRL warns too).

Only the training process imports this module (the reward workers never do): it needs torch for
the cross-rank sums.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lit_rlvr.rewards.base import STATUSES
from lit_rlvr.rewards.combine import MixedScore
from lit_rlvr.rewards.scorer import ScoreSummary, summarize

log = logging.getLogger(__name__)


def term_totals(scores: Sequence[MixedScore], num_terms: int) -> Tensor:
    """``(K, 2)`` float64: each reward's sum and count over the completions it applies to.

    Example:
        >>> from lit_rlvr.rewards.base import ScoreResult
        >>> skip = ScoreResult(0.0, "not_applicable")
        >>> scores = [MixedScore(1.0, 1.0, (ScoreResult(1.0), skip)), MixedScore(0.5, 0.0, (ScoreResult(0.0), ScoreResult(0.5)))]
        >>> term_totals(scores, 2).tolist()
        [[1.0, 2.0], [0.5, 1.0]]
    """
    totals = torch.zeros(num_terms, 2, dtype=torch.float64)
    for s in scores:
        for k, part in enumerate(s.parts):
            if part is not None:
                totals[k] += torch.tensor([part, 1.0], dtype=torch.float64)
    return totals


class RewardReport:
    """Logs one batch of rewards through a LightningModule (module docstring).

    Args:
        names: the rewards' names (``RewardMix.names``); empty: each row's own reward, one term.
    """

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self._warned_unscored = False
        self._warned_error = False  # the first failed reward of a run is a warning

    def __call__(self, module: Any, scores: Sequence[MixedScore], rows: Sequence[dict], prefix: str,
                 reduce_sum: Callable[[Tensor], Tensor]) -> None:  # fmt: skip
        """Log ``scores`` of ``rows`` under ``prefix`` with ``module.log``; ``reduce_sum`` sums a tensor over the ranks."""
        summary = summarize([r for s in scores for r in s.results])
        size = max(summary.total, 1)
        for status in STATUSES:  # every status, every batch: the same keys on every rank (synced means)
            module.log(f"{prefix}/reward_status/{status}", summary.counts[status] / size, batch_size=size,
                       add_dataloader_idx=False, sync_dist=True)  # the validation set's name is in the prefix
        if prefix == "train":
            module.log("train/reward_errors", float(summary.errors), batch_size=size, reduce_fx="sum", sync_dist=True)
        self.report_failures(summary, f"{prefix} rewards (step {module.global_step}, rank {module.global_rank})", prefix)
        if self.names:
            self.log_terms(module, scores, rows, prefix, reduce_sum)

    def log_terms(self, module: Any, scores: Sequence[MixedScore], rows: Sequence[dict], prefix: str,
                  reduce_sum: Callable[[Tensor], Tensor]) -> None:  # fmt: skip
        """``<prefix>/reward/<name>``: each reward's mean over the completions it applies to, across ranks."""
        totals = reduce_sum(term_totals(scores, len(self.names)))
        for k, name in enumerate(self.names):
            if totals[k, 1] > 0:
                module.log(f"{prefix}/reward/{name}", float(totals[k, 0] / totals[k, 1]), batch_size=int(totals[k, 1]),
                           add_dataloader_idx=False, sync_dist=False)  # fmt: skip
        unscored = next((i for i, s in enumerate(scores) if all(p is None for p in s.parts)), None)
        if unscored is not None and not self._warned_unscored:  # TRL warns too; once is enough
            self._warned_unscored = True
            from lightning.pytorch.utilities import rank_zero_warn

            rank_zero_warn(f"every reward of {self.names} returned None for a completion of row {rows[unscored].get('id')!r}, "
                           "so it scores 0; check that some reward judges every row")

    def report_failures(self, summary: ScoreSummary, where: str, prefix: str) -> None:
        """The batch's failures in the Python log: INFO always, WARNING the first time and when loud."""
        if summary.first_reason is None:
            return
        log.info("%s: %s", where, summary)
        if summary.loud:
            log.warning("%s: %d of %d rewards failed (status error), each scored 0: %s", where, summary.errors, summary.total, summary)
        elif summary.errors and not self._warned_error:
            counted = "; train/reward_errors counts them" if prefix == "train" else ""
            log.warning("%s: a reward failed (status error, scored 0%s): %s", where, counted, summary)
        self._warned_error = self._warned_error or summary.errors > 0
