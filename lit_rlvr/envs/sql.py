"""Text-to-SQL with execution feedback: SkyRL-SQL's protocol through lit_rlvr's SQL sandbox.

The model explores the database with ``<sql>…</sql>`` turns and answers with ``<solution>…</solution>``
(SkyRL-SQL, ``skyrl_gym/envs/sql``; Liu et al. 2025, "SkyRL-SQL"): each query runs in the sandbox
of :mod:`lit_rlvr.rewards.sql` (read-only connection, authorizer, deadline, result caps) and its
result comes back as ``<observation>…<reminder>You have N turns left…</reminder></observation>``;
the solution is scored by the Spider (or BIRD) execution reward, the same as a single-turn answer.

Where it departs from SkyRL's ``SQLEnv``, and why:

- Queries run read-only with lit_rlvr's checks (one SELECT statement, no ``ATTACH``/``PRAGMA``/
  writes, a deadline that also stops infinite recursive CTEs), not in a rolled-back read-write
  transaction; a refused, failing or slow query is an observation naming why.
- Results show the rows in the order the database returns them (SkyRL shows a ``frozenset``, whose
  order is arbitrary), the first ``max_rows`` of them, cut to ``max_chars`` characters, saying what
  was left out (SkyRL cuts to 50 rows only above 9,000 characters, without saying how many rows).
- The solution is scored on its own with Spider's test-suite semantics (row order only when the
  gold query has ORDER BY; SkyRL compares result sets); SkyRL's format reward (−1 for an episode
  without a well-formed solution) is the option ``format_reward``, without SkyRL's ``<think>`` rule.
- The tags are options; the turn ends at their closing tags (:attr:`stop`).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lit_rlvr.envs.base import EnvironmentBase, Step, register_environment
from lit_rlvr.rewards.base import STATUS_OK
from lit_rlvr.rewards.sql import DEFAULT_TIMEOUT_S, MODES, run_query, sql_score

INVALID = "Your previous action is invalid: write a query as <{sql}>…</{sql}> to run it, or the final query as <{answer}>…</{answer}>."


def _check(
    sql_tag: str,
    answer_tag: str,
    max_rows: int,
    max_chars: int,
    timeout_s: float,
    mode: str,
    format_reward: bool,
    reminder: bool = True,
) -> None:
    """Refuse, at start-up, an option value of the wrong type or out of range (a string where a number
    goes, a number where true or false goes), naming the option, the value and what is accepted."""
    for name, tag in (("sql_tag", sql_tag), ("answer_tag", answer_tag)):
        if not isinstance(tag, str) or not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
            raise ValueError(f"{name} must be a tag name such as 'sql'; got {tag!r}")
    if sql_tag == answer_tag:
        raise ValueError(f"sql_tag and answer_tag must differ; both are {sql_tag!r}")
    for name, value, least in (("max_rows", max_rows, 1), ("max_chars", max_chars, 100)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ValueError(f"{name} must be a whole number >= {least}; got {value!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s must be a number of seconds > 0; got {timeout_s!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    for name, value in (("format_reward", format_reward), ("reminder", reminder)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false; got {value!r}")


@register_environment("sql", check=_check, scores=True)
class SQLEnvironment(EnvironmentBase):
    """One text-to-SQL episode on the row's database (module docstring).

    The row needs ``db_path`` (the SQLite file) and ``answer`` (the gold query).

    Args:
        sql_tag: the tag of a query to run (``<sql>…</sql>``).
        answer_tag: the tag of the final query (``<solution>…</solution>``).
        max_rows: result rows shown.
        max_chars: characters of a result shown.
        timeout_s: each query's deadline (exploration and scoring).
        mode: ``"spider"`` or ``"bird"`` execution equality (:func:`~lit_rlvr.rewards.sql.sql_score`).
        format_reward: −1 for an episode that ends without a well-formed solution (SkyRL's), else 0.
        reminder: end each observation with SkyRL's ``<reminder>You have N turns left…</reminder>``;
            False shows the result alone (the SQL agent demo's tiny model reads shorter trajectories).

    Example:
        >>> import sqlite3, tempfile, os
        >>> db = os.path.join(tempfile.mkdtemp(), "toy.sqlite")
        >>> with sqlite3.connect(db) as c:
        ...     _ = c.executescript("CREATE TABLE t(a INT, b TEXT); INSERT INTO t VALUES (1,'x'),(2,'y');")
        >>> env = SQLEnvironment()
        >>> env.reset({"id": "q1", "db_path": db, "answer": "SELECT b FROM t WHERE a = 2"}, max_turns=3)
        >>> print(env.step("Let me look. <sql>SELECT * FROM t</sql>").observation.strip())
        <observation>1 | x
        2 | y
        <reminder>You have 2 turns left to complete the task.</reminder></observation>
        >>> env.step("<solution>SELECT b FROM t WHERE a > 1</solution>").reward
        1.0
    """

    version = "1"

    def __init__(
        self,
        *,
        sql_tag: str = "sql",
        answer_tag: str = "solution",
        max_rows: int = 50,
        max_chars: int = 9000,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        mode: str = "spider",
        format_reward: bool = False,
        reminder: bool = True,
    ):
        _check(sql_tag, answer_tag, max_rows, max_chars, timeout_s, mode, format_reward, reminder)
        self.reminder = reminder
        self.sql_tag, self.answer_tag = sql_tag, answer_tag
        self.max_rows, self.max_chars, self.timeout_s = max_rows, max_chars, timeout_s
        self.mode, self.format_reward = mode, format_reward
        self.stop = (f"</{sql_tag}>", f"</{answer_tag}>")
        self._query = re.compile(rf"<{sql_tag}>(.*?)</{sql_tag}>", re.DOTALL)
        self._answer = re.compile(rf"<{answer_tag}>(.*?)</{answer_tag}>", re.DOTALL)

    def check_row(self, row: Mapping[str, Any]) -> None:
        if not row.get("db_path") or not Path(str(row["db_path"])).is_file():
            raise ValueError(
                f"row id={row.get('id')!r}: the sql environment needs 'db_path', an SQLite file; got {row.get('db_path')!r}"
            )
        if not isinstance(row.get("answer"), str) or not row["answer"].strip():
            raise ValueError(
                f"row id={row.get('id')!r}: the sql environment needs 'answer', the gold query; got {row.get('answer')!r}"
            )

    def step(self, action: str) -> Step:
        last = self.next_turn()
        answers = self._answer.findall(action)
        if answers:
            return self._final(answers[-1])
        if last:
            return Step(reward=self._unanswered(), done=True, info={"status": "no_solution"})
        queries = self._query.findall(action)
        if not queries:
            text = INVALID.format(sql=self.sql_tag, answer=self.answer_tag)
            return Step(self._observation(text), reward=self._unanswered(), tool_error=True, info={"status": "invalid"})
        sql = queries[-1].strip().rstrip(";").strip()
        outcome = run_query(sql, str(self.row["db_path"]), self.timeout_s)
        if outcome.status == STATUS_OK:
            text = format_rows(outcome.rows, self.max_rows, self.max_chars)
        else:
            text = f"Error ({outcome.status}): {outcome.reason}"
        return Step(
            self._observation(text),
            reward=self._unanswered(),
            tool_call=" ".join(sql.split()),
            tool_error=outcome.status != STATUS_OK,
            info={"status": outcome.status},
        )

    def _final(self, solution: str) -> Step:
        text = solution if "```" in solution else f"```sql\n{solution.strip()}\n```"
        # Only what the scorer reads: the row's other columns (``mode``, ``completion``…) would collide with its arguments.
        where = {"db_path": self.row["db_path"], "id": self.row.get("id")}
        score = sql_score(text, self.row["answer"], mode=self.mode, timeout_s=self.timeout_s, **where)
        return Step(reward=score.reward, done=True, info={"status": score.status, "reason": score.reason})

    def _unanswered(self) -> float:
        """The reward of an episode that ends here without a solution."""
        return -1.0 if self.format_reward else 0.0

    def _observation(self, text: str) -> str:
        if not self.reminder:
            return f"\n\n<observation>{text}</observation>\n\n"
        left = self.turns_left
        return f"\n\n<observation>{text}\n<reminder>You have {left} turns left to complete the task.</reminder></observation>\n\n"


def format_rows(rows: list[tuple], max_rows: int, max_chars: int) -> str:
    """A query result as text: one line per row, values separated by `` | `` (NULL for None), at most
    ``max_rows`` rows and ``max_chars`` characters, saying what was left out.

    Example:
        >>> print(format_rows([(1, "x"), (2, None), (3, "z")], max_rows=2, max_chars=100))
        1 | x
        2 | NULL
        (showing the first 2 of 3 rows)
        >>> format_rows([], 5, 100)
        '(no rows)'
        >>> print(format_rows([("a" * 150,)], 5, 100))
        aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
        (cut to 100 of 150 characters)
    """
    if not rows:
        return "(no rows)"
    lines = [" | ".join("NULL" if v is None else str(v) for v in row) for row in rows[:max_rows]]
    text = "\n".join(lines)
    notes = []
    if len(rows) > max_rows:
        notes.append(f"(showing the first {max_rows} of {len(rows)} rows)")
    if len(text) > max_chars:
        notes.append(f"(cut to {max_chars} of {len(text)} characters)")
        text = text[:max_chars]
    return "\n".join([text, *notes])
