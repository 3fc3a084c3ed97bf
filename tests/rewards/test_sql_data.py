"""SQL reward on Spider dev: every runnable gold query scores 1 against itself on its database."""

from __future__ import annotations

import json
from pathlib import Path

from lit_rlvr.rewards import REWARDS


def _spider_rows(shared_data: Path) -> tuple[list[dict], list[dict]]:
    base = shared_data / "spider_dev"
    runnable, missing = [], []
    for i, q in enumerate(json.load((base / "dev.json").open())):
        db = base / "database" / q["db_id"] / f"{q['db_id']}.sqlite"
        row = {
            "id": f"spider-dev-{i}",
            "prompt": q["question"],
            "answer": q["query"],
            "reward": "sql",
            "db_path": str(db),
        }
        (runnable if db.exists() else missing).append(row)
    return runnable, missing


def test_every_runnable_gold_query_scores_one(shared_data):
    runnable, missing = _spider_rows(shared_data)
    assert len(runnable) == 972 and {Path(r["db_path"]).parent.name for r in missing} == {"wta_1"}
    for row in runnable:
        for completion in (f"```sql\n{row['answer']}\n```", f"The query is:\n{row['answer']}"):
            result = REWARDS["sql"].score(completion, **row)
            assert (result.reward, result.status) == (1.0, "ok"), (row, result)
        assert REWARDS["sql"].score(f"```sql\n{row['answer']}\n```", mode="bird", **row).reward == 1.0, row


def test_wrong_queries_on_spider(shared_data):
    db = str(shared_data / "spider_dev" / "database" / "concert_singer" / "concert_singer.sqlite")
    score = lambda pred, gold, mode="spider": REWARDS["sql"].score(pred, gold, db_path=db, mode=mode, id="w").reward
    gold = "SELECT name, age FROM singer ORDER BY age DESC"
    assert score("SELECT name, age FROM singer ORDER BY age DESC", gold) == 1.0
    assert score("SELECT name, age FROM singer ORDER BY age ASC", gold) == 0.0  # wrong direction
    assert score("SELECT name, age FROM singer ORDER BY age DESC LIMIT 5", gold) == 0.0  # missing row
    assert score("SELECT age, name FROM singer ORDER BY age DESC", gold) == 1.0  # columns may permute
    assert score("SELECT age, name FROM singer ORDER BY age DESC", gold, "bird") == 0.0  # not under BIRD
    unordered = "SELECT country FROM singer"
    assert score("SELECT country FROM singer ORDER BY country DESC", unordered) == 1.0
    assert score("SELECT DISTINCT country FROM singer", unordered) == 0.0  # duplicates count
    assert score("SELECT DISTINCT country FROM singer", unordered, "bird") == 1.0
    assert score("SELECT count(*) FROM singer WHERE age > 40", "SELECT count(*) FROM singer WHERE age > 30") == 0.0
    assert (
        score("SELECT name FROM singer WHERE 0", "SELECT song_name FROM singer WHERE age > 1000") == 1.0
    )  # both empty
