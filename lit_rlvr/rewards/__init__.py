"""Verifiable rewards: math (math-verify) and text-to-SQL (sandboxed SQLite), safe and parallel.

- ``REWARDS[name](completion, answer, **row) -> float`` in [0, 1] (``"math"``, ``"sql"``).
- ``SCORERS[name](...) -> ScoreResult`` — the same functions, also saying why (``ok``,
  ``no_answer``, ``timeout``, ``error: …``).
- ``ANSWER_KEYS[name](completion, **row) -> str | None`` — canonical final answers for maj@k:
  math → the normalised answer (reduced fraction or sympy string); sql → a hash of the
  execution result.
- :class:`BatchScorer` — many items in killable worker processes with a per-item deadline.

A malformed gold answer is a data error: :class:`GoldAnswerError` (a ``ValueError``) naming the
row's ``id``.
"""

from lit_rlvr.rewards import countdown as countdown
from lit_rlvr.rewards import math as math
from lit_rlvr.rewards import sql as sql
from lit_rlvr.rewards.base import ANSWER_KEYS, REWARDS, SCORERS, GoldAnswerError, ScoreResult
from lit_rlvr.rewards.scorer import BatchScorer

__all__ = ["ANSWER_KEYS", "REWARDS", "SCORERS", "BatchScorer", "GoldAnswerError", "ScoreResult", "countdown", "math", "sql"]
