"""Verifiable rewards: math (math-verify) and text-to-SQL (sandboxed SQLite), safe and parallel.

- ``REWARDS[name]`` — one :class:`Reward` record per name (``"math"``, ``"sql"``, and a user's
  own, :func:`register_reward`): ``.score(completion, answer, **row) -> ScoreResult`` says why
  (status ``ok``, ``no_answer``, ``timeout``, ``rejected``, ``error`` and a reason),
  ``.answer_key(completion, **row)`` gives the canonical final answer for maj@k (math → the
  normalised answer; sql → a hash of the execution result), and calling the record gives the
  plain float reward in [0, 1].
- :class:`BatchScorer` — many items in killable worker processes with a per-item deadline; the
  answer keys run there too.
- :class:`RewardMix` — several weighted rewards per completion (TRL's ``reward_funcs`` +
  ``reward_weights``), one of them the correctness (:mod:`~lit_rlvr.rewards.combine`).
- ``tool_call`` — the multi-turn tool-call bonus, a term with its weight (:mod:`~lit_rlvr.rewards.tools`).
- :class:`RewardFunc` — a reward function written for TRL or verl, called as it is
  (:mod:`~lit_rlvr.rewards.conventions`).

A malformed gold answer is a data error: :class:`GoldAnswerError` (a ``ValueError``) naming the
row's ``id``.
"""

from lit_rlvr.rewards import math as math
from lit_rlvr.rewards import sql as sql
from lit_rlvr.rewards import tools as tools  # registers tool_call
from lit_rlvr.rewards.base import (
    REWARDS,
    STATUSES,
    GoldAnswerError,
    Reward,
    ScoreResult,
    register_reward,
)
from lit_rlvr.rewards.combine import MixedScore, RewardMix
from lit_rlvr.rewards.conventions import RewardFunc, TrainerState
from lit_rlvr.rewards.scorer import BatchScorer

__all__ = [
    "REWARDS",
    "STATUSES",
    "BatchScorer",
    "GoldAnswerError",
    "MixedScore",
    "Reward",
    "RewardFunc",
    "RewardMix",
    "ScoreResult",
    "TrainerState",
    "math",
    "register_reward",
    "sql",
    "tools",
]
