"""Text-to-SQL reward: execute the predicted query in a sandbox and compare results with the gold's.

Pipeline for one completion (row carries ``db_path``):

1. Extract the SQL (:func:`extract_sql`): the last fenced block (```` ```sql ```` or bare
   ```` ``` ````), else the text from the last line that starts with ``SELECT``/``WITH``.
2. Check it (:func:`check_read_only`) with sqlglot's sqlite dialect: exactly one statement,
   a ``SELECT`` / ``WITH … SELECT`` / ``UNION``/``INTERSECT``/``EXCEPT``, no DML/DDL node or
   denied function anywhere inside. Anything else scores 0 *without executing*, with status
   ``rejected`` (the reason says why).
3. Execute with defence in depth: a read-only connection (``file:…?mode=ro`` URI and
   ``PRAGMA query_only=1``), an authorizer that allows only reads, selects, recursive CTEs and
   non-denied functions (so ``load_extension``, ``ATTACH``, ``PRAGMA``, writes are refused by
   sqlite itself), ``SQLITE_LIMIT_LENGTH`` of 1 MB per value, ``SQLITE_LIMIT_ATTACHED`` = 0,
   a progress-handler deadline (infinite recursive CTEs, huge cross joins) and caps on fetched
   rows and bytes. ``printf``/``format`` are replaced by a wrapper that refuses widths or
   precisions above 1 MB (``printf('%.*c', 1e9, 'x')`` loops in C, out of the deadline's reach).
   Recursive CTEs are allowed on purpose: they are read-only, legitimate SQL, and bounded by the
   deadline.
4. Compare with the gold result (executed once per ``(db_path, gold query)`` and memoised):
   ``mode="spider"`` (default) is Spider's test-suite execution accuracy
   (taoyds/test-suite-sql-eval ``result_eq``) with DISTINCT kept: rows in order only when the gold
   query contains ``ORDER BY`` (the official substring rule, so an ORDER BY in a subquery also
   counts), otherwise as multisets; a column permutation must match whole rows; values compare
   with Python ``==``; two empty results are equal. ``mode="bird"`` is BIRD's
   ``set(pred) == set(gold)``.

Connections are opened once per (thread, database) and reused; predicted results are memoised
per ``(db_path, sql)`` (small results only), so identical completions in a group execute once.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from lit_rlvr.rewards.base import (
    STATUS_ERROR,
    STATUS_NO_ANSWER,
    STATUS_OK,
    STATUS_REJECTED,
    STATUS_TIMEOUT,
    ScoreResult,
    gold_error,
    register_reward,
    sanitize_text,
)

MODES = ("spider", "bird")
DEFAULT_TIMEOUT_S = 5.0
MAX_SQL_CHARS = 20_000
MAX_ROWS = 100_000
MAX_RESULT_BYTES = 64 * 2**20
MAX_VALUE_BYTES = 2**20
PROGRESS_STEPS = 1000  # sqlite VM instructions between deadline checks
PRED_CACHE_SIZE = 4096
PRED_CACHE_MAX_ROWS = 1000

_READ_ONLY_ROOTS = (exp.Select, exp.Union, exp.Intersect, exp.Except)
_WRITE_NODES = (
    exp.Insert,
    exp.Update,
    exp.Delete,
    exp.Create,
    exp.Drop,
    exp.Alter,
    exp.Command,
    exp.Pragma,
    exp.Attach,
    exp.Detach,
    exp.Transaction,
    exp.Commit,
    exp.Rollback,
    exp.Merge,
    exp.Analyze,
)
DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_READ, sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE})
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")
_LONG_DIGITS = re.compile(r"\d{30}")
_STATEMENT_LINE = re.compile(r"^[ \t]*(?:select|with)\b", re.IGNORECASE | re.MULTILINE)


class _ResultTooLarge(Exception):
    pass


class _QueryTimeout(Exception):
    pass


def extract_sql(completion: str) -> str | None:
    """The SQL query written in ``completion``, without trailing semicolons; None if absent.

    Args:
        completion: model output text.

    Returns:
        The last complete fenced block (a leading ``sql``/``sqlite`` tag dropped), else the text
        from the last line starting with SELECT or WITH to the end; None if neither exists.

    Example:
        >>> extract_sql("Try:\\n```sql\\nSELECT 1;\\n```\\nthen\\n```sql\\nSELECT name FROM t;\\n```")
        'SELECT name FROM t'
        >>> extract_sql("Reasoning...\\nSELECT count(*) FROM singer;")
        'SELECT count(*) FROM singer'
        >>> extract_sql("I don't know") is None
        True
    """
    text = sanitize_text(completion)
    parts = text.split("```")
    if len(parts) >= 3:
        block = parts[len(parts) - 2 if len(parts) % 2 == 1 else len(parts) - 3]
        first, _, rest = block.partition("\n")
        sql = rest if first.strip().lower() in ("sql", "sqlite") else block
    else:
        last = None
        for last in _STATEMENT_LINE.finditer(text):
            pass
        if last is None:
            return None
        sql = text[last.start() :]
    sql = sql.strip().rstrip(";").strip()
    return sql or None


@lru_cache(maxsize=16384)
def check_read_only(sql: str) -> str | None:
    """Why ``sql`` must not be executed, or None if it is a single read-only query.

    Example:
        >>> check_read_only("WITH t AS (SELECT 1 AS a) SELECT a FROM t UNION SELECT 2") is None
        True
        >>> check_read_only("SELECT 1; DROP TABLE singer")
        '2 statements (only one read-only query is executed)'
        >>> check_read_only("ATTACH DATABASE 'x.db' AS x")
        'ATTACH statement (only SELECT queries are executed)'
        >>> check_read_only("SELECT load_extension('evil')")
        'function load_extension is not allowed'
    """
    if len(sql) > MAX_SQL_CHARS:
        return f"query has {len(sql)} characters (> {MAX_SQL_CHARS})"
    try:
        statements = [s for s in sqlglot.parse(sql, read="sqlite") if s is not None]
    except (ParseError, TokenError) as e:
        return f"unparsable SQL ({str(e).splitlines()[0][:120]})"
    if len(statements) != 1:
        return f"{len(statements)} statements (only one read-only query is executed)"
    root = statements[0]
    if not isinstance(root, _READ_ONLY_ROOTS):
        return f"{root.key.upper()} statement (only SELECT queries are executed)"
    for node in root.walk():
        if isinstance(node, _WRITE_NODES):
            return f"{node.key.upper()} inside the query"
        if isinstance(node, exp.Func) and node.sql_name().lower() in DENIED_FUNCTIONS:
            return f"function {node.sql_name().lower()} is not allowed"
        if isinstance(node, exp.Anonymous) and str(node.this).lower() in DENIED_FUNCTIONS:
            return f"function {str(node.this).lower()} is not allowed"
    return None


def _authorizer(action: int, arg1, arg2, db_name, trigger) -> int:
    """sqlite authorizer: reads, selects, recursive CTEs and non-denied functions only."""
    if action == sqlite3.SQLITE_FUNCTION:
        return sqlite3.SQLITE_DENY if (arg2 or "").lower() in DENIED_FUNCTIONS else sqlite3.SQLITE_OK
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def _bounded_printf(engine: sqlite3.Connection) -> Callable:
    """sqlite's ``printf``/``format``, refusing (NULL, as sqlite does for too-long results) any
    width or precision above ``MAX_VALUE_BYTES``: ``printf('%.*c', 1e9, 'x')`` otherwise spends
    seconds in one C call that the progress handler cannot interrupt."""

    def printf(fmt, *args):
        if not isinstance(fmt, str):
            return engine.execute("SELECT printf(?)", (fmt,)).fetchone()[0]
        if "*" in fmt and any(isinstance(a, (int, float)) and abs(a) > MAX_VALUE_BYTES for a in args):
            return None
        if any(int(d) > MAX_VALUE_BYTES for d in _DIGITS.findall(fmt) if len(d) < 30) or _LONG_DIGITS.search(fmt):
            return None
        placeholders = ", ".join("?" * (len(args) + 1))
        return engine.execute(f"SELECT printf({placeholders})", (fmt, *args)).fetchone()[0]

    return printf


class _Sandbox:
    """A read-only, authorised, deadline-guarded connection to one database (one thread)."""

    def __init__(self, db_path: str):
        uri = Path(db_path).resolve().as_uri() + "?mode=ro"
        self.conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        self.conn.execute("PRAGMA query_only = 1")
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self._printf_engine = sqlite3.connect(":memory:")  # no tables: evaluates printf only
        self._printf_engine.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        for name in ("printf", "format"):
            self.conn.create_function(name, -1, _bounded_printf(self._printf_engine), deterministic=True)
        self.conn.set_authorizer(_authorizer)
        self.deadline = float("inf")
        self.conn.set_progress_handler(self._over_time, PROGRESS_STEPS)

    def _over_time(self) -> int:
        return int(time.monotonic() > self.deadline)

    def run(self, sql: str, timeout_s: float | None) -> list[tuple]:
        """All result rows; raises ``_QueryTimeout``, ``_ResultTooLarge`` or ``sqlite3.Error``."""
        self.deadline = time.monotonic() + timeout_s if timeout_s else float("inf")
        rows: list[tuple] = []
        size = 0
        try:
            cursor = self.conn.execute(sql)
            while chunk := cursor.fetchmany(256):
                rows.extend(chunk)
                size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for row in chunk for v in row)
                if len(rows) > MAX_ROWS or size > MAX_RESULT_BYTES:
                    raise _ResultTooLarge(f"result exceeds {MAX_ROWS} rows or {MAX_RESULT_BYTES} bytes")
        except sqlite3.OperationalError as e:
            if time.monotonic() > self.deadline and "interrupt" in str(e):
                raise _QueryTimeout from e
            raise
        finally:
            self.deadline = float("inf")
        return rows


_local = threading.local()


def _sandbox(db_path: str) -> _Sandbox:
    boxes = _local.__dict__.setdefault("boxes", {})
    if db_path not in boxes:
        boxes[db_path] = _Sandbox(db_path)
    return boxes[db_path]


@lru_cache(maxsize=8192)
def _gold_rows(db_path: str, gold_sql: str, timeout_s: float | None) -> tuple[tuple, ...]:
    """The gold query's result, executed once per (db, query) in this process."""
    return tuple(_sandbox(db_path).run(gold_sql, timeout_s))


_pred_cache: OrderedDict[tuple[str, str], list[tuple]] = OrderedDict()
_pred_lock = threading.Lock()


def _pred_rows(db_path: str, sql: str, timeout_s: float | None) -> list[tuple]:
    """A predicted query's result; small results are memoised per (db, sql) (LRU)."""
    key = (db_path, sql)
    with _pred_lock:
        if key in _pred_cache:
            _pred_cache.move_to_end(key)
            return _pred_cache[key]
    rows = _sandbox(db_path).run(sql, timeout_s)
    if len(rows) <= PRED_CACHE_MAX_ROWS:
        with _pred_lock:
            _pred_cache[key] = rows
            while len(_pred_cache) > PRED_CACHE_SIZE:
                _pred_cache.popitem(last=False)
    return rows


class QueryOutcome(NamedTuple):
    """What one model-written query returned in the sandbox (:func:`run_query`).

    Attributes:
        rows: the result rows (None unless ``status`` is ``ok``).
        status: ``ok``, ``rejected`` (not one read-only query: never executed), ``timeout`` or ``error``.
        reason: why, for every status but ``ok``.
    """

    rows: list[tuple] | None
    status: str
    reason: str = ""


def run_query(sql: str, db_path: str, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> QueryOutcome:
    """Run one model-written query with every check and limit of :func:`sql_score` (module docstring).

    For tools that show the model a query's result (the ``sql`` environment of :mod:`lit_rlvr.envs`):
    a refused, failing or slow query is an outcome with its reason, never an exception.

    Example:
        >>> import sqlite3, tempfile, os
        >>> db = os.path.join(tempfile.mkdtemp(), "toy.sqlite")
        >>> with sqlite3.connect(db) as c:
        ...     _ = c.executescript("CREATE TABLE t(a INT); INSERT INTO t VALUES (1), (2);")
        >>> run_query("SELECT a FROM t ORDER BY a", db)
        QueryOutcome(rows=[(1,), (2,)], status='ok', reason='')
        >>> run_query("DELETE FROM t", db)
        QueryOutcome(rows=None, status='rejected', reason='DELETE statement (only SELECT queries are executed)')
        >>> run_query("SELECT b FROM t", db).reason
        'sqlite: OperationalError: no such column: b'
    """
    reason = check_read_only(sql)
    if reason is not None:
        return QueryOutcome(None, STATUS_REJECTED, reason)
    try:
        return QueryOutcome(_pred_rows(db_path, sql, timeout_s), STATUS_OK)
    except _QueryTimeout:
        return QueryOutcome(None, STATUS_TIMEOUT, f"the query ran longer than {timeout_s:g} s")
    except _ResultTooLarge as e:
        return QueryOutcome(None, STATUS_ERROR, str(e))
    except (sqlite3.Error, OverflowError, MemoryError) as e:
        return QueryOutcome(None, STATUS_ERROR, f"sqlite: {type(e).__name__}: {str(e)[:200]}")


def _column_matches(gold: list[tuple], pred: list[tuple], order_matters: bool) -> list[list[int]]:
    """For each gold column, the pred columns it could map to (equal column, in order or as multiset)."""
    n = len(gold[0])
    gold_cols = [[row[i] for row in gold] for i in range(n)]
    pred_cols = [[row[j] for row in pred] for j in range(n)]
    if order_matters:
        return [[j for j in range(n) if pred_cols[j] == g] for g in gold_cols]
    pred_counts = [Counter(c) for c in pred_cols]
    return [[j for j in range(n) if pred_counts[j] == Counter(g)] for g in gold_cols]


def spider_result_eq(gold: list[tuple], pred: list[tuple], order_matters: bool) -> bool:
    """Spider test-suite execution equality: is some column permutation of ``pred`` equal to
    ``gold`` as a row list (``order_matters``) or as a row multiset?

    Columns are assigned by backtracking over candidates whose columns already match (a
    necessary condition), trying only one of several identical pred columns.

    Example:
        >>> spider_result_eq([(1, "a"), (2, "b")], [("b", 2), ("a", 1.0)], order_matters=False)
        True
        >>> spider_result_eq([(1,), (2,)], [(2,), (1,)], order_matters=True)
        False
        >>> spider_result_eq([(1,), (1,)], [(1,)], order_matters=False)  # duplicates count
        False
        >>> spider_result_eq([], [], order_matters=True)
        True
    """
    if not gold and not pred:
        return True
    if len(gold) != len(pred) or len(gold[0]) != len(pred[0]):
        return False
    candidates = _column_matches(gold, pred, order_matters)
    target = gold if order_matters else Counter(gold)
    n = len(gold[0])
    pred_cols = [tuple(row[j] for row in pred) for j in range(n)]

    def search(i: int, perm: list[int], used: set[int]) -> bool:
        if i == n:
            permuted = [tuple(row[j] for j in perm) for row in pred]
            return (permuted == target) if order_matters else Counter(permuted) == target
        tried: set[tuple] = set()
        for j in candidates[i]:
            if j in used or pred_cols[j] in tried:  # identical columns give identical permutations
                continue
            tried.add(pred_cols[j])
            if search(i + 1, [*perm, j], used | {j}):
                return True
        return False

    return search(0, [], set())


def bird_result_eq(gold: list[tuple], pred: list[tuple]) -> bool:
    """BIRD execution equality: ``set(pred) == set(gold)`` (order, duplicates ignored).

    Example:
        >>> bird_result_eq([(1, "a"), (1, "a")], [(1, "a")]), bird_result_eq([(1, "a")], [("a", 1)])
        (True, False)
    """
    return set(pred) == set(gold)


def _db_path(row: dict) -> str:
    db_path = row.get("db_path")
    if not db_path:
        raise gold_error(row, f"SQL rows need a 'db_path'; row keys are {sorted(row)}")
    return str(db_path)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"sql reward mode must be one of {MODES}; got {mode!r}")


def sql_score(
    completion: str, answer: str, *, mode: str = "spider", timeout_s: float | None = DEFAULT_TIMEOUT_S, **row
) -> ScoreResult:
    """Score a text-to-SQL completion by executing it against ``row["db_path"]`` (module docstring).

    Args:
        completion: model output holding one SQL query (see :func:`extract_sql`).
        answer: the gold SQL query.
        mode: ``"spider"`` (test-suite semantics) or ``"bird"`` (set equality).
        timeout_s: execution deadline for each query (progress handler); None disables it.
        **row: the rest of the prompt row; needs ``db_path`` (``id`` is used in errors).

    Returns:
        ``ScoreResult`` with status ``ok``, ``no_answer``, ``timeout``, ``rejected`` or ``error``.

    Raises:
        GoldAnswerError: no ``db_path``, the database cannot be opened, or the gold query fails.
        ValueError: ``mode`` is not one of ``MODES``.

    Example:
        >>> import sqlite3, tempfile, os
        >>> db = os.path.join(tempfile.mkdtemp(), "toy.sqlite")
        >>> with sqlite3.connect(db) as c:
        ...     _ = c.executescript("CREATE TABLE t(a INT, b TEXT); INSERT INTO t VALUES (1,'x'),(2,'y');")
        >>> sql_score("```sql\\nSELECT b, a FROM t\\n```", "SELECT a, b FROM t", db_path=db, id="q1")
        ScoreResult(reward=1.0, status='ok')
        >>> sql_score("SELECT a FROM t ORDER BY a DESC", "SELECT a FROM t ORDER BY a", db_path=db, id="q1")
        ScoreResult(reward=0.0, status='ok')
        >>> sql_score("DROP TABLE t", "SELECT a FROM t", db_path=db, id="q1").status
        'no_answer'
        >>> sql_score("```sql\\nDROP TABLE t\\n```", "SELECT a FROM t", db_path=db, id="q1").reason
        'DROP statement (only SELECT queries are executed)'
    """
    _check_mode(mode)
    db_path = _db_path(row)
    pred_sql = extract_sql(completion)
    if pred_sql is None:
        return ScoreResult(0.0, STATUS_NO_ANSWER)
    reason = check_read_only(pred_sql)
    if reason is not None:
        return ScoreResult(0.0, STATUS_REJECTED, reason)
    try:
        gold = _gold_rows(db_path, answer, timeout_s)
    except _QueryTimeout:
        return ScoreResult(0.0, STATUS_TIMEOUT)
    except (sqlite3.Error, _ResultTooLarge) as e:
        raise gold_error(row, f"gold query {answer!r} failed on {db_path}: {type(e).__name__}: {e}") from e
    try:
        pred = _pred_rows(db_path, pred_sql, timeout_s)
    except _QueryTimeout:
        return ScoreResult(0.0, STATUS_TIMEOUT)
    except _ResultTooLarge as e:
        return ScoreResult(0.0, STATUS_ERROR, str(e))
    except (sqlite3.Error, OverflowError, MemoryError) as e:
        return ScoreResult(0.0, STATUS_ERROR, f"sqlite: {type(e).__name__}: {str(e)[:200]}")
    if mode == "bird":
        return ScoreResult(float(bird_result_eq(list(gold), pred)), STATUS_OK)
    order_matters = bool(_ORDER_BY.search(answer))
    return ScoreResult(float(spider_result_eq(list(gold), pred, order_matters)), STATUS_OK)


def check_sql_gold(answer: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S, **row) -> None:
    """Raise :class:`GoldAnswerError` unless the gold query is one read-only statement that runs on
    the row's database within ``timeout_s`` (run once per row at start-up; its result is cached).

    Example:
        >>> import sqlite3, tempfile, os
        >>> db = os.path.join(tempfile.mkdtemp(), "toy.sqlite")
        >>> with sqlite3.connect(db) as c:
        ...     _ = c.executescript("CREATE TABLE t(a INT);")
        >>> check_sql_gold("SELECT a FROM t", db_path=db, id="q1")
        >>> check_sql_gold("SELECT b FROM t", db_path=db, id="q2")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lit_rlvr.rewards.base.GoldAnswerError: row id='q2': gold query 'SELECT b FROM t' failed on ...: no such column: b
    """
    db_path = _db_path(row)
    if not isinstance(answer, str) or not answer.strip():
        raise gold_error(row, f"the gold SQL must be a non-empty string; got {answer!r}")
    if (reason := check_read_only(answer)) is not None:
        raise gold_error(row, f"the gold SQL is not a read-only query: {reason}")
    try:
        _gold_rows(db_path, answer, timeout_s)
    except _QueryTimeout:
        raise gold_error(row, f"gold query {answer!r} took longer than {timeout_s} s on {db_path}") from None
    except (sqlite3.Error, _ResultTooLarge) as e:
        raise gold_error(row, f"gold query {answer!r} failed on {db_path}: {type(e).__name__}: {e}") from e


def _canonical_value(v):
    """Integral floats as ints, so ``1`` and ``1.0`` (equal under ``==``) get one key."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def sql_answer_key(completion: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S, **row) -> str | None:
    """Canonical answer of a SQL completion for majority voting: a hash of its execution result.

    Voting by execution result (self-consistency for text-to-SQL) groups queries that are
    written differently but return the same rows. The result is canonicalised as a multiset of
    rows (sorted) with columns ordered by their own content and integral floats as ints, so two
    results equal under Spider's unordered semantics get one key (except for rare ties between
    distinct columns with identical value multisets). Row order is ignored. None when nothing is
    extractable, the query is rejected, fails or times out.

    Example:
        >>> import sqlite3, tempfile, os
        >>> db = os.path.join(tempfile.mkdtemp(), "toy.sqlite")
        >>> with sqlite3.connect(db) as c:
        ...     _ = c.executescript("CREATE TABLE t(a INT, b TEXT); INSERT INTO t VALUES (1,'x'),(2,'y');")
        >>> k1 = sql_answer_key("SELECT a, b FROM t", db_path=db)
        >>> k1 == sql_answer_key("SELECT b, a FROM t ORDER BY a DESC", db_path=db)
        True
        >>> sql_answer_key("SELECT nope FROM t", db_path=db) is None
        True
    """
    db_path = _db_path(row)
    sql = extract_sql(completion)
    if sql is None or check_read_only(sql) is not None:
        return None
    try:
        rows = _pred_rows(db_path, sql, timeout_s)
    except (sqlite3.Error, _QueryTimeout, _ResultTooLarge, OverflowError, MemoryError):
        return None
    rows = [tuple(_canonical_value(v) for v in row) for row in rows]
    n = len(rows[0]) if rows else 0
    order = sorted(range(n), key=lambda j: sorted(repr(row[j]) for row in rows))
    canonical = sorted(repr(tuple(row[j] for j in order)) for row in rows)
    return hashlib.sha1("\n".join(canonical).encode("utf-8", "replace")).hexdigest()


register_reward("sql", answer_key=sql_answer_key, check_gold=check_sql_gold, check=_check_mode, values=(0.0, 1.0))(
    sql_score
)
