"""The multi-turn SQL toy: a policy must query to learn the table's name, one that guesses is at chance,
its rows are scored by the real `sql` environment, and the warm start trains on its trajectories."""

from __future__ import annotations

import json
import random
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from lit_rlvr.demo import sql_agent
from lit_rlvr.demo import warmstart as ws
from lit_rlvr.demo.data import write_demo_data
from lit_rlvr.envs import resolve_environment

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return sql_agent.training_rows(tmp_path_factory.mktemp("sql_agent"), seed=0)


def sql_env():
    return resolve_environment("sql", sql_agent.ENVIRONMENT_OPTIONS).make()


def test_every_name_serves_about_as_many_databases_and_no_question_names_its_table():
    names = Counter(sql_agent.database_name(0, i) for i in range(sql_agent.NUM_DATABASES))
    assert set(names) == set(sql_agent.TABLE_NAMES) and max(names.values()) - min(names.values()) <= 1
    assert [sql_agent.database_name(1, i) for i in range(8)] != [sql_agent.database_name(0, i) for i in range(8)]
    for index in range(sql_agent.NUM_DATABASES):
        for q in sql_agent.database_questions(0, index, "x.sqlite"):
            assert not any(name in q["prompt"] for name in sql_agent.TABLE_NAMES), q


def test_the_gold_scores_on_its_database_and_a_guessed_name_is_right_one_time_in_ten(rows):
    """A policy that never queries is at chance: of the gold query written on each name, exactly one
    (the database's own) scores; the others are errors the environment scores 0."""
    for row in random.Random(0).sample(rows, 12):
        table = row["answer"].split(" FROM ")[1].split(" ")[0]
        rewards = []
        for name in sql_agent.TABLE_NAMES:
            env = sql_env()
            env.reset(row, 3)
            guess = row["answer"].rstrip(";").replace(f" FROM {table} ", f" FROM {name} ")
            rewards.append(env.step(f"<solution>{guess}</solution>").reward)
        assert sorted(rewards) == [0.0] * (sql_agent.NUM_NAMES - 1) + [1.0], row


def test_asking_the_database_reveals_the_name(rows):
    row = rows[0]
    env = sql_env()
    env.reset(row, 3)
    step = env.step(f"<sql>{sql_agent.SCHEMA_QUERY}</sql>")
    table = row["answer"].split(" FROM ")[1].split(" ")[0]
    assert (
        step.observation == f"\n\n<observation>{table}</observation>\n\n" and step.tool_call == sql_agent.SCHEMA_QUERY
    )


def test_the_rl_rows_hold_out_whole_databases_and_point_at_them(tmp_path):
    train, val = sql_agent.split_rows(0)
    per_db = sql_agent.QUESTIONS_PER_DATABASE
    assert len(train) == sql_agent.TRAIN_DATABASES * per_db
    assert len(val) == (sql_agent.NUM_DATABASES - sql_agent.TRAIN_DATABASES) * per_db
    assert not {r["db_path"] for r in train} & {r["db_path"] for r in val}
    paths = write_demo_data(tmp_path, seed=0)
    written = [json.loads(line) for line in paths["sql_agent_val"].read_text().splitlines()]
    assert written == val
    for row in written[:: per_db * 2]:
        db = paths["sql_agent_dbs"].parent / row["db_path"]
        with sqlite3.connect(db) as con:
            (name,) = con.execute(sql_agent.SCHEMA_QUERY).fetchone()
        assert f" FROM {name} " in row["answer"] and row["reward"] == "sql"


def test_trajectories_query_at_the_given_share_and_each_scores_where_it_should(rows):
    rng, queried, right = random.Random(0), 0, Counter()
    for _ in range(400):
        row, parts = sql_agent.agent_trajectory(rng, rows)
        env = sql_env()
        env.reset(row, 3)
        if len(parts) == 3:
            queried += 1
            assert parts[0] == (f"<sql>{sql_agent.SCHEMA_QUERY}</sql>", True) and not parts[1][1]
            assert env.step(parts[0][0]).observation == parts[1][0]
        right[len(parts)] += env.step(parts[-1][0]).reward
    assert abs(queried / 400 - sql_agent.QUERY_SHARE) < 0.06
    assert right[3] == queried  # who asked is right; who guessed is right about 1 time in 10
    assert right[1] / (400 - queried) < 0.25
    assert all(len(p) == 1 for _, p in (sql_agent.agent_trajectory(rng, rows, max_turns=1) for _ in range(20)))


def test_the_demo_configs_run_the_environment_the_warm_start_trained_in():
    base = yaml.safe_load((REPO / "configs/demo/sql_agent/base.yaml").read_text())["model"]["environment"]
    cache = yaml.safe_load((REPO / "configs/demo/sql_agent/cache.yaml").read_text())["environment"]
    warm = yaml.safe_load((REPO / "configs/demo/sql_agent/warmstart.yaml").read_text())
    for env in (base, cache):
        assert env["name"] == "sql" and env["options"] == {"sql": sql_agent.ENVIRONMENT_OPTIONS}
        assert env["max_turns"] == warm["checker_turns"]
    assert {k: v for k, v in cache.items()} == {k: v for k, v in base.items()}


def test_a_warm_start_on_sql_agent_trajectories_trains_a_bpe_policy_and_writes_the_databases(tmp_path):
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    tiny = dict(steps=2, batch_size=4, hidden_size=32, num_layers=1, num_heads=1, intermediate_size=32)
    tiny |= dict(countdown_share=0.0, sql_agent_share=1.0, vocab_size=160, eval_samples=0, progress_bar=False)
    out = ws.warmstart(tmp_path / "base", **tiny)
    assert sorted(p.name for p in (out / "sql_agent").iterdir())[0] == "db00.sqlite"
    assert len(list((out / "sql_agent").iterdir())) == sql_agent.TRAIN_DATABASES
    tok = AutoTokenizer.from_pretrained(out)
    assert all(tok.tokenize(f" {name} ")[1] == name for name in sql_agent.TABLE_NAMES)
    assert len(tok("<sql>SELECT name FROM sqlite_master</sql>").input_ids) < 15
    settings = json.loads((out / ws.INFO_FILE).read_text())["settings"]
    assert settings["vocab_size"] == 160 and settings["sql_agent_share"] == 1.0
    with pytest.raises(ValueError, match="vocab_size .* needs sql_agent_share"):
        ws.warmstart(tmp_path / "other", **{**tiny, "sql_agent_share": 0.0, "countdown_share": 1.0})


def test_the_warm_start_stream_trains_the_models_turns_only(rows, tmp_path):
    from lit_rlvr.demo.tiny import build_bpe_tokenizer

    tok = build_bpe_tokenizer(sql_agent.corpus(rows, 200), 160, words=sql_agent.TABLE_NAMES)
    data = ws.WarmStartData(tok, batch_size=16, countdown_share=0.0, sql_agent_share=1.0, sql_agent_dir=tmp_path)
    batch = next(iter(data.train_dataloader()))
    for ids, labels, mask in zip(batch["input_ids"], batch["labels"], batch["attention_mask"]):
        real, trained = ids[mask.bool()].tolist(), [t for t in labels.tolist() if t != ws.IGNORE_INDEX]
        text, trained_text = tok.decode(real), tok.decode(trained)
        assert "<observation>" not in trained_text and trained_text.endswith("</solution><eos>")
        assert text.startswith("Q:") and text.count("<observation>") == trained_text.count("<sql>")
