"""SQL reward: extraction, read-only check, Spider/BIRD result equality vs brute force, sandbox."""

from __future__ import annotations

import hashlib
import itertools
import random
import shutil
import sqlite3
import time
from collections import Counter

import pytest

from lit_rlvr.rewards import REWARDS, GoldAnswerError
from lit_rlvr.rewards.sql import _Sandbox, bird_result_eq, check_read_only, extract_sql, spider_result_eq

# ---------------------------------------------------------------- extraction and static checks


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("```sql\nSELECT a FROM t;\n```", "SELECT a FROM t"),
        ("```sqlite\nSELECT 1\n```", "SELECT 1"),
        ("```\nSELECT 2;;\n```", "SELECT 2"),
        ("```sql\nSELECT 1\n``` then ```sql\nSELECT 3\n```", "SELECT 3"),
        ("```sql\nSELECT 1\n``` then ```sql\nSELECT 3", "SELECT 1"),  # last *complete* fence
        ("Let me think.\nSELECT name\nFROM singer;", "SELECT name\nFROM singer"),
        ("with x as (select 1) select * from x", "with x as (select 1) select * from x"),
        ("I select nothing", None),
        ("", None),
        ("```sql\n\n```", None),
    ],
)
def test_extract_sql(completion, expected):
    assert extract_sql(completion) == expected


READ_ONLY = [
    "SELECT * FROM t",
    "SELECT a FROM t UNION SELECT b FROM u",
    "SELECT a FROM t INTERSECT SELECT a FROM u EXCEPT SELECT 1",
    "WITH c AS (SELECT 1 AS x) SELECT x FROM c",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 5) SELECT x FROM c",
    "SELECT count(*), max(a) FROM t WHERE b IN (SELECT b FROM u) GROUP BY c HAVING count(*) > 1 ORDER BY 1 LIMIT 3",
]
NOT_READ_ONLY = [
    "DROP TABLE singer",
    "DELETE FROM singer",
    "UPDATE singer SET Name = 'x'",
    "INSERT INTO singer (Name) VALUES ('x')",
    "REPLACE INTO singer (Name) VALUES ('x')",
    "CREATE TABLE evil(a)",
    "CREATE TRIGGER t AFTER INSERT ON singer BEGIN DELETE FROM singer; END",
    "ALTER TABLE singer ADD COLUMN z",
    "PRAGMA writable_schema = 1",
    "PRAGMA query_only = 0",
    "ATTACH DATABASE 'other.db' AS other",
    "DETACH other",
    "VACUUM",
    "VACUUM INTO 'copy.db'",
    "REINDEX",
    "ANALYZE",
    "BEGIN",
    "SELECT 1; DROP TABLE singer",
    "SELECT 1; SELECT 2",
    "SELECT load_extension('/tmp/evil.so')",
    "SELECT * FROM (SELECT load_extension('x'))",
    "SELEC * FROM t",
]


@pytest.mark.parametrize("sql", READ_ONLY)
def test_check_read_only_accepts(sql):
    assert check_read_only(sql) is None


@pytest.mark.parametrize("sql", NOT_READ_ONLY)
def test_check_read_only_rejects(sql):
    assert check_read_only(sql)


# ---------------------------------------------------------------- result equality vs brute force


def _brute_spider(gold, pred, order_matters):
    """Reference: some column permutation and (if unordered) some row permutation make them equal."""
    if not gold and not pred:
        return True
    if len(gold) != len(pred) or len(gold[0]) != len(pred[0]):
        return False
    for cols in itertools.permutations(range(len(gold[0]))):
        permuted = [tuple(row[j] for j in cols) for row in pred]
        row_orders = [permuted] if order_matters else itertools.permutations(permuted)
        if any(list(rows) == list(gold) for rows in row_orders):
            return True
    return False


VALUES = [1, 1.0, 2, "1", "a", None, 2.5]


def _random_table(rng, n_rows, n_cols):
    return [tuple(rng.choice(VALUES) for _ in range(n_cols)) for _ in range(n_rows)]


def _variant(rng, gold):
    """A random relative of ``gold``: shuffled rows/columns, a changed cell, a dropped/duplicated row."""
    rows = [list(r) for r in gold]
    if rows and rng.random() < 0.5:
        perm = list(range(len(rows[0])))
        rng.shuffle(perm)
        rows = [[r[j] for j in perm] for r in rows]
    if rng.random() < 0.5:
        rng.shuffle(rows)
    kind = rng.random()
    if rows and kind < 0.2:
        rows[rng.randrange(len(rows))][rng.randrange(len(rows[0]))] = rng.choice(VALUES)
    elif rows and kind < 0.3:
        rows.pop(rng.randrange(len(rows)))
    elif rows and kind < 0.4:
        rows.append(list(rng.choice(rows)))
    return [tuple(r) for r in rows]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("order_matters", [False, True])
@pytest.mark.parametrize(("n_rows", "n_cols"), [(0, 1), (1, 1), (3, 1), (2, 3), (4, 2), (5, 3)])
def test_spider_result_eq_matches_brute_force(seed, order_matters, n_rows, n_cols):
    rng = random.Random(seed * 1000 + n_rows * 10 + n_cols)
    for _ in range(25):
        gold = _random_table(rng, n_rows, n_cols)
        pred = (
            _variant(rng, gold) if rng.random() < 0.8 else _random_table(rng, n_rows, rng.choice([n_cols, n_cols + 1]))
        )
        assert spider_result_eq(gold, pred, order_matters) == _brute_spider(gold, pred, order_matters), (gold, pred)


@pytest.mark.parametrize("seed", range(4))
def test_bird_result_eq_is_set_equality(seed):
    rng = random.Random(seed)
    for _ in range(50):
        gold = _random_table(rng, rng.randint(0, 4), 2)
        pred = _variant(rng, gold)
        assert bird_result_eq(gold, pred) == (Counter(set(gold)) == Counter(set(pred)))


def test_spider_semantics_edge_cases():
    assert spider_result_eq([(1, 2)], [(2, 1)], order_matters=True)  # columns may permute
    assert not spider_result_eq([(1, 2), (3, 4)], [(1, 4), (3, 2)], order_matters=False)  # whole rows
    assert spider_result_eq([(1,)], [(1.0,)], order_matters=False)  # Python ==
    assert not spider_result_eq([("1",)], [(1,)], order_matters=False)
    assert not spider_result_eq([], [(1,)], order_matters=False)
    assert spider_result_eq([(0,)] * 3 + [(1,)], [(1,)] + [(0,)] * 3, order_matters=False)
    wide = [tuple(range(8))] * 2  # identical columns must not blow up the permutation search
    assert spider_result_eq([(None,) * 9] * 3, [(None,) * 9] * 3, order_matters=True)
    assert spider_result_eq(wide, [tuple(reversed(wide[0]))] * 2, order_matters=False)


# ---------------------------------------------------------------- executing against a database


def _toy_db(path):
    with sqlite3.connect(path) as conn:
        conn.executescript(
            """
            CREATE TABLE singer (Singer_ID int PRIMARY KEY, Name text, Country text, Age int);
            INSERT INTO singer VALUES (1, 'Joe Sharp', 'Netherlands', 52), (2, 'Timbaland', 'United States', 32),
              (3, 'Justin Brown', 'France', 29), (4, 'Rose White', 'France', 41), (5, 'John Nizinik', 'France', 43),
              (6, 'Tribal King', 'France', 25);
            """
        )
    conn.close()
    return path


@pytest.fixture(params=["toy", "spider"])
def db_copy(request, tmp_path):
    """A private copy of a database (toy, or Spider's concert_singer when the data is present)."""
    target = tmp_path / "concert_singer.sqlite"
    if request.param == "toy":
        return _toy_db(target)
    source = (
        request.getfixturevalue("shared_data") / "spider_dev" / "database" / "concert_singer" / "concert_singer.sqlite"
    )
    shutil.copyfile(source, target)
    return target


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


GOLD = "SELECT Name, Age FROM singer WHERE Country = 'France' ORDER BY Age DESC"


@pytest.mark.parametrize(
    ("pred", "mode", "reward"),
    [
        (GOLD, "spider", 1.0),
        ("SELECT Age, Name FROM singer WHERE Country = 'France' ORDER BY Age DESC", "spider", 1.0),
        ("SELECT Age, Name FROM singer WHERE Country = 'France' ORDER BY Age DESC", "bird", 0.0),
        ("SELECT Name, Age FROM singer WHERE Country = 'France' ORDER BY Age ASC", "spider", 0.0),
        ("SELECT Name, Age FROM singer WHERE Country = 'France' ORDER BY Age ASC", "bird", 1.0),
        ("SELECT Name, Age FROM singer WHERE Country = 'France' ORDER BY Age DESC LIMIT 3", "spider", 0.0),
        ("SELECT Name, Age FROM singer WHERE Country = 'France' AND Age > 25 ORDER BY Age DESC", "bird", 0.0),
        ("SELECT Name, Age * 1.0 FROM singer WHERE Country = 'France' ORDER BY Age DESC", "spider", 1.0),
        ("SELECT Name, CAST(Age AS TEXT) FROM singer WHERE Country = 'France' ORDER BY Age DESC", "spider", 0.0),
    ],
)
def test_sql_reward_on_database(db_copy, pred, mode, reward):
    assert REWARDS["sql"](f"```sql\n{pred}\n```", GOLD, db_path=str(db_copy), mode=mode, id="q", prompt="p") == reward


def test_sql_multiset_and_distinct(db_copy):
    gold = "SELECT Country FROM singer"  # no ORDER BY: multiset, duplicates count
    score = lambda pred, mode="spider": REWARDS["sql"](pred, gold, db_path=str(db_copy), mode=mode, id="q")
    assert score("SELECT Country FROM singer ORDER BY Country") == 1.0
    assert score("SELECT DISTINCT Country FROM singer") == 0.0
    assert score("SELECT DISTINCT Country FROM singer", "bird") == 1.0
    assert score("SELECT Country FROM singer WHERE 0") == 0.0
    assert (
        REWARDS["sql"](
            "SELECT Name FROM singer WHERE 0", "SELECT Age FROM singer WHERE Age > 99", db_path=str(db_copy), id="q"
        )
        == 1.0
    )


def test_sql_statuses_and_errors(db_copy):
    score = lambda pred, **kw: REWARDS["sql"].score(
        pred, "SELECT Name FROM singer", db_path=str(db_copy), id="q7", **kw
    )
    assert score("SELECT Name FROM singer").status == "ok"
    assert score("no sql here").status == "no_answer"
    assert score("SELECT nope FROM singer").status == "error" and score("SELECT nope FROM singer").reason.startswith(
        "sqlite:"
    )
    assert score("```sql\nDELETE FROM singer\n```").status == "rejected"
    with pytest.raises(ValueError, match="mode must be one of"):
        score("SELECT Name FROM singer", mode="exact")
    with pytest.raises(GoldAnswerError, match="row id='q7'.*gold query"):
        REWARDS["sql"].score("SELECT 1", "SELECT nope FROM singer", db_path=str(db_copy), id="q7")
    with pytest.raises(GoldAnswerError, match="row id='q8'.*db_path"):
        REWARDS["sql"].score("SELECT 1", "SELECT 1", id="q8")
    with pytest.raises(GoldAnswerError, match="row id='q9'"):
        REWARDS["sql"].score("SELECT 1", "SELECT 1", db_path=str(db_copy.parent / "missing.sqlite"), id="q9")


ADVERSARIAL_SQL = [
    *NOT_READ_ONLY,
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000) SELECT count(*) FROM n a, n b",
    "SELECT count(*) FROM " + ", ".join(f"singer s{i}" for i in range(16)),  # 6^16 ≈ 2.8e12 rows
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000) SELECT i FROM n",  # row cap
    "SELECT randomblob(2000000000)",
    "SELECT zeroblob(100000000)",
    "SELECT printf('%.*c', 1000000000, 'x')",  # a C loop the progress handler cannot stop
    "SELECT format('%.' || '*c', 1000000000, 'x')",
    "SELECT * FROM sqlite_master; DELETE FROM singer",
    "SELECT writefile('/tmp/x', 'y')",
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sql", ADVERSARIAL_SQL)
def test_adversarial_sql_scores_zero_within_deadline_and_leaves_db_intact(db_copy, sql):
    before = _sha256(db_copy)
    start = time.perf_counter()
    result = REWARDS["sql"].score(
        f"```sql\n{sql}\n```", "SELECT Name FROM singer", db_path=str(db_copy), id="adv", timeout_s=0.5
    )
    elapsed = time.perf_counter() - start
    assert result.reward == 0.0, result
    if sql in NOT_READ_ONLY:
        assert result.status == "rejected", result
    elif "RECURSIVE c(x)" in sql or "singer s15" in sql or "n a, n b" in sql:
        assert result.status == "timeout", result
    assert elapsed < 4.0, (elapsed, result)  # deadline 0.5 s; slack for a loaded CI machine
    assert _sha256(db_copy) == before


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM singer",
        "UPDATE singer SET Age = 0",
        "CREATE TABLE evil(a)",
        "PRAGMA query_only = 0",
        "ATTACH DATABASE ':memory:' AS m",
        "SELECT load_extension('x')",
    ],
)
def test_sandbox_layers_refuse_writes_without_the_static_check(db_copy, sql):
    """Defence in depth: with sqlglot's check bypassed, sqlite itself still refuses."""
    before = _sha256(db_copy)
    box = _Sandbox(str(db_copy))
    with pytest.raises(sqlite3.DatabaseError):
        box.run(sql, 1.0)
    box.conn.set_authorizer(None)  # and without the authorizer, the read-only connection refuses writes
    if not sql.startswith(("PRAGMA", "ATTACH", "SELECT")):
        with pytest.raises(sqlite3.OperationalError, match="readonly|read-only"):
            box.run(sql, 1.0)
    box.conn.close()
    assert _sha256(db_copy) == before


def test_answer_keys(db_copy):
    key = lambda sql: REWARDS["sql"].answer_key(sql, db_path=str(db_copy), id="k")
    base = key("SELECT Name, Age FROM singer")
    assert base is not None
    assert key("SELECT Age, Name FROM singer ORDER BY Name") == base
    assert key("SELECT Name, Age * 1.0 FROM singer") == base
    assert key("SELECT Name FROM singer") != base
    assert key("SELECT nope FROM singer") is None
    assert key("DROP TABLE singer") is None
    assert key("nothing") is None
