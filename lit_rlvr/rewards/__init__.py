"""Verifiable rewards: math (math-verify) and text-to-SQL (sandboxed SQLite), safe and parallel.

- ``REWARDS[name]`` — one :class:`Reward` record per name (``"math"``, ``"sql"``, and a user's
  own, :func:`register_reward`): ``.score(completion, answer, **row) -> ScoreResult`` says why
  (status ``ok``, ``no_answer``, ``timeout``, ``rejected``, ``error`` and a reason),
  ``.answer_key(completion, **row)`` gives the canonical final answer for maj@k (math → the
  normalised answer; sql → a hash of the execution result), and calling the record gives the
  plain float reward in [0, 1].
- :class:`BatchScorer` — many items in killable worker processes with a per-item deadline; the
  answer keys run there too.

A malformed gold answer is a data error: :class:`GoldAnswerError` (a ``ValueError``) naming the
row's ``id``.
"""

from lit_rlvr.rewards import math as math
from lit_rlvr.rewards import sql as sql
from lit_rlvr.rewards.base import (
    REWARDS,
    STATUSES,
    GoldAnswerError,
    Reward,
    ScoreResult,
    register_reward,
)
from lit_rlvr.rewards.scorer import BatchScorer

__all__ = ["REWARDS", "STATUSES", "BatchScorer", "GoldAnswerError", "Reward", "ScoreResult", "math", "register_reward", "sql"]
