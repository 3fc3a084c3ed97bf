"""The ``sql`` environment on the real Spider dev databases: exploration, refusals, bounds, scoring, and no byte changed."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from lit_rlvr.envs import resolve_environment
from lit_rlvr.envs.sql import INVALID, format_rows


@pytest.fixture
def spider(spider_dev):
    return spider_dev


def digests(root) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((root / "database").rglob("*.sqlite"))}


def episode(db, gold, max_turns=5, **options):
    env = resolve_environment("sql", options).make()
    env.reset({"id": "q", "db_path": str(db), "answer": gold}, max_turns)
    return env


def test_gold_query_explored_then_answered_scores_one_on_every_spider_database(spider):
    """For the first dev question of every database (all but wta_1, whose file is absent): the gold
    query as an <sql> turn shows its rows, then as the <solution> it scores 1."""
    before = digests(spider)
    seen = {}
    for row in json.loads((spider / "dev.json").read_text()):
        db = spider / "database" / row["db_id"] / f"{row['db_id']}.sqlite"
        if row["db_id"] in seen or not db.is_file():
            continue
        env = episode(db, row["query"])
        step = env.step(f"I will look first.\n<sql>{row['query']}</sql>")
        rows = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True).execute(row["query"]).fetchall()
        assert (
            not step.done
            and not step.tool_error
            and step.tool_call == " ".join(row["query"].split()).rstrip(";").strip()
        )
        assert format_rows(rows, 50, 9000) in step.observation
        assert step.observation.endswith(
            "<reminder>You have 4 turns left to complete the task.</reminder></observation>\n\n"
        )
        final = env.step(f"<solution>{row['query']}</solution>")
        seen[row["db_id"]] = (final.done, final.reward)
    assert len(seen) == 19 and set(seen.values()) == {(True, 1.0)}, seen
    assert digests(spider) == before


REFUSED = [
    ("DELETE FROM singer", "rejected", "DELETE statement"),
    ("UPDATE singer SET age = 0", "rejected", "UPDATE statement"),
    ("DROP TABLE singer", "rejected", "DROP statement"),
    ("ATTACH DATABASE '/tmp/lit_rlvr_attack.db' AS x", "rejected", "ATTACH statement"),
    ("PRAGMA writable_schema = 1", "rejected", "PRAGMA statement"),
    ("SELECT 1; DELETE FROM singer", "rejected", "2 statements"),
    ("SELECT load_extension('x')", "rejected", "function load_extension is not allowed"),
    ("SELECT nope FROM singer", "error", "no such column: nope"),
    (
        "SELECT * FROM singer a, singer b, singer c, singer d, singer e, singer f, singer g",
        "error",
        "result exceeds 100000 rows",
    ),
    (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
        "timeout",
        "ran longer than 0.3 s",
    ),
]


@pytest.mark.parametrize(("sql", "status", "reason"), REFUSED, ids=[r[1] + ":" + r[0][:24] for r in REFUSED])
def test_writes_attach_pragma_huge_and_endless_queries_are_observations(spider, sql, status, reason):
    db = spider / "database" / "concert_singer" / "concert_singer.sqlite"
    before = digests(spider)
    timeout_s = 0.3 if status == "timeout" else 30.0  # the huge result is refused by size, not by time
    step = episode(db, "SELECT count(*) FROM singer", timeout_s=timeout_s).step(f"<sql>{sql}</sql>")
    assert not step.done and step.tool_error and step.info["status"] == status
    assert f"<observation>Error ({status}): " in step.observation and reason in step.observation
    assert digests(spider) == before


def test_results_are_bounded_in_rows_and_characters_and_say_so(spider):
    db = spider / "database" / "concert_singer" / "concert_singer.sqlite"
    step = episode(db, "SELECT 1", max_rows=5, max_chars=200).step(
        "<sql>SELECT a.name, b.name FROM singer a, singer b, singer c</sql>"
    )
    assert "(showing the first 5 of 216 rows)" in step.observation and step.observation.count("\n") < 12
    wide = episode(db, "SELECT 1", max_chars=100).step(
        "<sql>SELECT group_concat(a.name, ',') FROM singer a, singer b</sql>"
    )
    assert "(cut to 100 of " in wide.observation


def test_malformed_turns_max_turns_and_the_format_reward(spider):
    db = spider / "database" / "concert_singer" / "concert_singer.sqlite"
    gold = "SELECT count(*) FROM singer"
    for options, unanswered in (({}, 0.0), ({"format_reward": True}, -1.0)):
        env = episode(db, gold, max_turns=3, **options)
        step = env.step("<sql>SELECT count(*) FROM singer")  # never closed
        assert (
            INVALID.format(sql="sql", answer="solution") in step.observation
            and step.tool_call is None
            and step.tool_error  # an invalid turn: a tool error, not a call
            and not step.done
        )
        assert step.reward == unanswered
        assert not env.step("<sql>SELECT 1</sql>").done
        last = env.step("<sql>SELECT 2</sql>")  # the last turn: no solution, the episode ends unanswered
        assert (last.done, last.reward, last.observation) == (True, unanswered, "")
    wrong = episode(db, gold).step("<solution>SELECT count(*) FROM stadium</solution>")
    assert (wrong.done, wrong.reward) == (True, 0.0)
    fenced = episode(db, gold).step("<solution>```sql\nSELECT COUNT(*)\nFROM singer;\n```</solution>")
    assert fenced.reward == 1.0


def test_without_the_reminder_an_observation_is_the_result_alone(tmp_path):
    db = tmp_path / "one.sqlite"
    sqlite3.connect(db).close()
    with_reminder = episode(db, "SELECT 1").step("<sql>SELECT 1</sql>").observation
    without = episode(db, "SELECT 1", reminder=False)
    assert with_reminder.startswith("\n\n<observation>1\n<reminder>You have 4 turns left")
    assert without.step("<sql>SELECT 1</sql>").observation == "\n\n<observation>1</observation>\n\n"
    assert without.step("<solution>SELECT 1</solution>").reward == 1.0
    with pytest.raises(ValueError, match="reminder must be true or false; got 'no'"):
        resolve_environment("sql", {"reminder": "no"})


def test_a_row_without_a_database_or_gold_is_refused_naming_it(tmp_path):
    env = resolve_environment("sql").make()
    with pytest.raises(ValueError, match="row id='q7': the sql environment needs 'db_path'"):
        env.reset({"id": "q7", "db_path": str(tmp_path / "missing.sqlite"), "answer": "SELECT 1"}, 3)


@pytest.mark.parametrize("column", ["mode", "timeout_s", "completion"])
def test_row_columns_named_like_the_scorers_arguments_do_not_break_scoring(tmp_path, column):
    """A row's own columns (a dataset may well have ``mode`` or ``completion``) never reach the scorer's
    keyword arguments: the correct solution still scores 1 and a wrong one 0."""
    db = tmp_path / "one.sqlite"
    with sqlite3.connect(db) as c:
        c.executescript("CREATE TABLE t(a INT); INSERT INTO t VALUES (1), (2);")
    row = {"id": "q", "db_path": str(db), "answer": "SELECT a FROM t WHERE a = 2", column: "bird"}
    for solution, reward in (("SELECT a FROM t WHERE a > 1", 1.0), ("SELECT a FROM t", 0.0)):
        env = resolve_environment("sql").make()
        env.reset(row, 3)
        step = env.step(f"<solution>{solution}</solution>")
        assert (step.done, step.reward, step.info["status"]) == (True, reward, "ok")


BAD_OPTIONS = {
    "format_reward": ["yes", 1, 0.5, None],
    "max_rows": ["50", True, 2.5, 0],
    "max_chars": ["9000", 2500.0, 99],
    "timeout_s": ["5", True, float("inf"), float("nan"), 0],
    "sql_tag": [5, ["sql"]],
}
ACCEPTED = {
    "format_reward": "true or false",
    "max_rows": "a whole number >= 1",
    "max_chars": "a whole number >= 100",
    "timeout_s": "a number of seconds > 0",
    "sql_tag": "a tag name such as 'sql'",
}


@pytest.mark.parametrize(("option", "value"), [(k, v) for k, values in BAD_OPTIONS.items() for v in values], ids=repr)
def test_an_option_of_the_wrong_type_or_range_is_refused_at_start_up_naming_it(option, value):
    """A YAML ``format_reward: "yes"`` or ``max_rows: "50"`` is refused with the option, the value and what
    is accepted, not read as truthy or failing later with a comparison's TypeError."""
    message = f"model.environment.options.sql: {option} must be {ACCEPTED[option]}; got {value!r}"
    with pytest.raises(ValueError) as refused:
        resolve_environment("sql", {option: value}, options_key="model.environment.options.sql")
    assert str(refused.value) == message
