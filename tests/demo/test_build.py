"""The demo data files: deterministic, well formed, held-out pairs never in training."""

from __future__ import annotations

import json

import pytest

from lit_rlvr.demo.countdown import countdown_reward, solutions
from lit_rlvr.demo.data import ADDITION_WIDTH, DEMO_CHARS, addition_val_pairs, read_rows, write_demo_data

FILES = ("countdown_train", "countdown_select", "countdown_val", "addition_val", "sql_train", "sql_val")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_data")
    return write_demo_data(out, seed=0)


@pytest.fixture(scope="module")
def rows(data):
    return {name: read_rows(data[name]) for name in FILES}


def files(paths: dict) -> dict:
    """Every file written, a folder's (the SQL agent's databases) one by one."""
    return {f"{name}/{f.name}": f for name, p in paths.items() for f in (sorted(p.iterdir()) if p.is_dir() else [p])}


def test_deterministic_and_idempotent(data, tmp_path):
    other = files(write_demo_data(tmp_path, seed=0))
    written = files(data)
    assert len(written) == len(other) > 32
    for name, path in written.items():
        assert other[name].read_bytes() == path.read_bytes(), name
    mtimes = {name: path.stat().st_mtime_ns for name, path in other.items()}
    again = write_demo_data(tmp_path, seed=0)
    assert {name: path.stat().st_mtime_ns for name, path in files(again).items()} == mtimes


def test_other_seed_gives_other_data(data, tmp_path):
    other = write_demo_data(tmp_path, seed=1)
    assert other["countdown_val"].read_bytes() != data["countdown_val"].read_bytes()
    assert other["addition_val"].read_bytes() != data["addition_val"].read_bytes()


def test_rows_are_well_formed(rows):
    ids = [r["id"] for name in FILES for r in rows[name]]
    assert len(ids) == len(set(ids))
    for name in FILES:
        for r in rows[name]:
            assert {"id", "prompt", "answer", "reward"} <= set(r), (name, r)
            assert all(isinstance(r[k], str) for k in ("id", "prompt", "answer", "reward"))
            assert set(r["prompt"]) <= set(DEMO_CHARS), r["prompt"]
    assert {r["reward"] for r in rows["countdown_train"] + rows["countdown_val"]} == {"countdown"}
    assert {r["reward"] for r in rows["addition_val"]} == {"math"}
    assert {r["reward"] for r in rows["sql_train"] + rows["sql_val"]} == {"sql"}


def test_countdown_split_and_gold(rows):
    train, select, val = rows["countdown_train"], rows["countdown_select"], rows["countdown_val"]
    assert len(train) + len(select) + len(val) == len(solutions()) and len(val) == 142 and len(select) == 128
    key = lambda r: ("".join(sorted(r["digits"])), int(r["answer"]))  # noqa: E731
    splits = [{key(r) for r in part} for part in (train, select, val)]
    assert not (splits[0] & splits[1] or splits[0] & splits[2] or splits[1] & splits[2])  # disjoint
    for r in train + select + val:
        assert r["prompt"] == f"C{r['digits']}={int(r['answer']):03d}:"
        exprs = solutions()[key(r)]
        assert r["n_solutions"] == len(exprs) >= 1
        extras = {k: v for k, v in r.items() if k != "answer"}
        assert all(countdown_reward(f"{e};", r["answer"], **extras) == 1.0 for e in exprs)


def test_the_multi_turn_demos_prompts_are_every_sixth_training_row(data, rows):
    agents = read_rows(data["agents_train"])
    assert agents == rows["countdown_train"][::6] and 150 < len(agents) < 250


def test_addition_rows(rows):
    add = rows["addition_val"]
    assert len(add) == 200 == len({(r["a"], r["b"]) for r in add})
    assert [(r["a"], r["b"]) for r in add] == addition_val_pairs(0)
    for r in add:
        w = ADDITION_WIDTH
        assert r["prompt"] == f"A{r['a']:0{w}d}+{r['b']:0{w}d}=" and r["answer"] == str(r["a"] + r["b"])


def test_three_digit_addition_option(tmp_path):
    rows = read_rows(write_demo_data(tmp_path, addition_width=3, addition_val_size=5)["addition_val"])
    assert len(rows) == 5 and all(r["prompt"] == f"A{r['a']:03d}+{r['b']:03d}=" for r in rows)


def test_addition_gold_scores_with_math_reward(rows):
    rewards = pytest.importorskip("lit_rlvr.rewards")
    for r in rows["addition_val"][:20]:
        padded = "\\boxed{" + r["answer"].zfill(ADDITION_WIDTH + 1) + "}"
        extras = {k: v for k, v in r.items() if k != "answer"}
        assert rewards.REWARDS["math"](padded, r["answer"], **extras) == 1.0


def test_sql_rows_point_at_the_database(data, rows):
    raw = json.loads(data["sql_val"].read_text().splitlines()[0])
    assert raw["db_path"] == "sql_toy.sqlite"  # relative: resolved against the data file's folder
    assert {r["db_path"] for r in rows["sql_train"] + rows["sql_val"]} == {str(data["sql_db"])}
    assert not {r["id"] for r in rows["sql_train"]} & {r["id"] for r in rows["sql_val"]}


def test_addition_val_pairs_rejects_impossible_request():
    with pytest.raises(ValueError, match="distinct addition pairs"):
        addition_val_pairs(0, n=101, width=1)
