"""SQL toy: gold queries execute to what a Python reference computes; the SQL reward accepts them."""

from __future__ import annotations

import re
import sqlite3
from collections import Counter

import pytest

from lit_rlvr.demo import sql_toy
from lit_rlvr.demo.data import DEMO_CHARS


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return sql_toy.build_database(tmp_path_factory.mktemp("sql") / "toy.sqlite", seed=0)


def _reference(prompt: str, rows: list[tuple]) -> list[tuple]:
    """Answer a ``Q:<agg> [col] <filter>;`` question by brute force over the table's rows."""
    m = re.fullmatch(r"Q:(count|sum|max|min|ids)(?: ([ab]))? ([abg])([<>=])(\w);", prompt)
    agg, col, fcol, op, val = m.groups()
    idx = {"a": 1, "b": 2, "g": 3}
    val = val if fcol == "g" else int(val)
    test = {"<": lambda x: x < val, ">": lambda x: x > val, "=": lambda x: x == val}[op]
    hit = [r for r in rows if test(r[idx[fcol]])]
    if agg == "ids":
        return [(r[0],) for r in hit]
    if agg == "count":
        return [(len(hit),)]
    return [({"sum": sum, "max": max, "min": min}[agg](r[idx[col]] for r in hit),)]


def test_database_holds_table_rows(db):
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT id, a, b, g FROM t ORDER BY id").fetchall() == sql_toy.table_rows(0)


@pytest.mark.parametrize("seed", [0, 3])
def test_gold_queries_match_reference(seed, tmp_path):
    path = sql_toy.build_database(tmp_path / "toy.sqlite", seed=seed)
    rows = sql_toy.table_rows(seed)
    items = sql_toy.questions(seed)
    assert len({q["prompt"] for q in items}) == len(items) > 300
    with sqlite3.connect(path) as con:
        for q in items:
            got = con.execute(q["answer"]).fetchall()
            assert Counter(got) == Counter(_reference(q["prompt"], rows)), q
            assert set(q["prompt"] + q["answer"]) <= set(DEMO_CHARS)


def test_filters_match_at_least_one_row():
    rows = sql_toy.table_rows(0)
    for q in sql_toy.questions(0):
        if q["prompt"].startswith("Q:count"):
            assert _reference(q["prompt"], rows)[0][0] >= 1


def test_questions_and_split_deterministic():
    assert sql_toy.questions(0) == sql_toy.questions(0)
    assert sql_toy.split_questions(0) == sql_toy.split_questions(0)
    assert sql_toy.split_questions(0) != sql_toy.split_questions(1)
    with pytest.raises(ValueError, match="holdout"):
        sql_toy.split_questions(0, holdout=1.0)
    with pytest.raises(ValueError, match="aggregate"):
        sql_toy.gold_query("avg", "a", "a>1")


def test_sql_reward_scores_gold_and_equivalent_forms(db):
    rewards = pytest.importorskip("lit_rlvr.rewards")
    sql = rewards.REWARDS["sql"]
    for q in sql_toy.questions(0)[::7]:
        assert sql(q["answer"], q["answer"], db_path=str(db), id=q["id"]) == 1.0, q
    row = {"db_path": str(db), "id": "x"}
    gold = "SELECT count(*) FROM t WHERE a>3;"
    assert sql("SELECT count(id) FROM t WHERE 3<a;", gold, **row) == 1.0
    assert sql("SELECT count(*) FROM t WHERE a>=4;", gold, **row) == 1.0
    assert sql("SELECT count(*) FROM t WHERE a>4;", gold, **row) == 0.0
    ids = "SELECT id FROM t WHERE g='x';"
    assert sql("SELECT id FROM t WHERE g='x' ORDER BY id DESC;", ids, **row) == 1.0
    assert sql("SELECT id FROM t WHERE g='y';", ids, **row) == 0.0
    assert sql("Q:ids g=x;", ids, **row) == 0.0
