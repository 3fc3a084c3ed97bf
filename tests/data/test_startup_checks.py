"""Every bad row or gold is found at set-up, with file:line, before any generation (issue 12, items 5–7)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from lit_rlvr.data import DatasetSpec, GoldCheck, PromptDataModule


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def demo_rewards():
    import lit_rlvr.demo  # noqa: F401  (registers countdown)


@pytest.fixture
def toy_db(tmp_path):
    db = tmp_path / "toy.sqlite"
    with sqlite3.connect(db) as con:
        con.executescript("CREATE TABLE t(a INT, b TEXT); INSERT INTO t VALUES (1, 'x'), (2, 'y');")
    return str(db)


def mixed_rows(toy_db):
    """20 good rows (math, sql, countdown) and, at lines 21–25, one bad gold of each kind plus an unknown reward."""
    good = [{"prompt": f"p{i}", "answer": str(i), "reward": "math"} for i in range(10)]
    good += [{"prompt": f"s{i}", "answer": "SELECT a FROM t", "reward": "sql", "db_path": toy_db} for i in range(5)]
    good += [{"prompt": f"c{i}", "answer": "26", "reward": "countdown", "digits": "375"} for i in range(5)]
    bad = [
        {"prompt": "b1", "answer": "\\boxed{}", "reward": "math"},  # math-verify cannot parse it
        {"prompt": "b2", "answer": "SELECT nope FROM t", "reward": "sql", "db_path": toy_db},  # no such column
        {"prompt": "b3", "answer": "DROP TABLE t", "reward": "sql", "db_path": toy_db},  # not a query
        {"prompt": "b4", "answer": "26", "reward": "countdown", "digits": "37"},  # malformed countdown gold
        {"prompt": "b5", "answer": "1", "reward": "mth"},  # an unknown reward name
    ]
    return good + bad


@pytest.mark.parametrize("workers", [0, 1])
def test_bad_golds_and_reward_names_are_bad_rows_with_file_and_line(
    tiny_model_dir, tmp_path, toy_db, demo_rewards, workers
):
    path = _write(tmp_path / "mixed.jsonl", mixed_rows(toy_db))
    dm = PromptDataModule(
        str(tiny_model_dir),
        train=DatasetSpec(path, "jsonl", name="mixed", options={"extra_fields": ["digits", "db_path"]}),
        max_bad_fraction=0.25,
        gold_check=GoldCheck(workers=workers),
    )
    dm.setup("fit")
    assert len(dm.train_rows) == 20
    bad = dm.bad_rows["mixed"]
    assert [b.line for b in bad] == [25, 21, 22, 23, 24]  # the unknown reward is found while reading
    assert all(b.file == path for b in bad)
    reasons = [b.reason for b in bad]
    assert "unknown reward 'mth'" in reasons[0]
    assert "math-verify cannot parse the gold answer '\\\\boxed{}'" in reasons[1]
    assert "no such column: nope" in reasons[2]
    assert "not a read-only query" in reasons[3]
    assert "malformed gold for countdown" in reasons[4]


def test_too_many_bad_golds_stop_set_up_naming_the_first(tiny_model_dir, tmp_path, toy_db, demo_rewards):
    path = _write(tmp_path / "mixed.jsonl", mixed_rows(toy_db))
    dm = PromptDataModule(
        str(tiny_model_dir),
        train=DatasetSpec(path, "jsonl", name="mixed", options={"extra_fields": ["digits", "db_path"]}),
        max_bad_fraction=0.1,
        gold_check=GoldCheck(workers=0),
    )
    with pytest.raises(
        ValueError,
        match=r"mixed: 5 of 25 rows are bad \(20.0%\), more than max_bad_fraction=10.0%; first: .*mixed.jsonl:25: unknown reward",
    ):
        dm.setup("fit")


def test_a_gold_whose_check_hangs_is_a_bad_row_within_the_deadline(tiny_model_dir, tmp_path, toy_db):
    rows = [{"prompt": f"s{i}", "answer": "SELECT a FROM t", "reward": "sql", "db_path": toy_db} for i in range(9)]
    rows.append(
        {
            "prompt": "slow",
            "reward": "sql",
            "db_path": toy_db,
            "answer": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        }
    )
    path = _write(tmp_path / "slow.jsonl", rows)
    dm = PromptDataModule(
        str(tiny_model_dir),
        train=DatasetSpec(path, "jsonl", name="slow"),
        max_bad_fraction=0.2,
        gold_check=GoldCheck(workers=1, timeout_s=0.5),
    )
    dm.setup("fit")
    assert len(dm.train_rows) == 9
    (bad,) = dm.bad_rows["slow"]
    assert bad.line == 10 and "took longer than 0.5 s" in bad.reason


def test_an_adapter_option_typo_names_the_key_path_and_the_accepted_options(tiny_model_dir, tmp_path):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "p", "answer": "1", "reward": "math"}])
    dm = PromptDataModule(str(tiny_model_dir), train=DatasetSpec(path, "jsonl", options={"extra_feilds": ["digits"]}))
    with pytest.raises(
        ValueError,
        match=r"data.train.options: unknown option\(s\) \['extra_feilds'\] of dataset adapter 'jsonl'; accepted: \[.*'extra_fields'",
    ):
        dm.setup("fit")


@pytest.mark.parametrize(
    ("how", "where"),
    [
        ("yaml", "the config file"),
        ("flag", "the flag --data.tokenizer"),
        ("flag_init_args", "the flag --data.init_args.tokenizer"),
    ],
)
def test_setting_a_linked_target_is_an_error_that_names_the_key_to_set(tmp_path, how, where):
    from lit_rlvr.cli import main

    base = ["fit", "--config", str(Path(__file__).resolve().parents[2] / "configs/demo/base.yaml"), "--print_config"]
    if how == "yaml":
        overlay = tmp_path / "overlay.yaml"
        overlay.write_text("data:\n  tokenizer: other/tokenizer\n")
        args = [*base[:3], "--config", str(overlay), base[3]]
    elif how == "flag":
        args = [*base, "--data.tokenizer=other/tokenizer"]
    else:
        args = [*base, "--data.init_args.tokenizer", "other/tokenizer"]
    with pytest.raises(
        ValueError,
        match=f"{where}.* sets data.tokenizer, which is linked to "
        r"model.policy.path .*set model.policy.path instead",
    ):
        main(args)
