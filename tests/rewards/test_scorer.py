"""BatchScorer: same results as in-process scoring, survives hanging and dying items, reports statuses."""

from __future__ import annotations

import importlib
import json
import sqlite3
import sys
import textwrap
import time

import pytest

from lit_rlvr.rewards import BatchScorer, GoldAnswerError, ScoreResult

PROBE = '''
import os, signal, time

def probe(completion, answer, **row):
    """Misbehaves on request: the ways a reward can go wrong in a worker."""
    if completion == "hang":  # blocks SIGALRM too, so only the parent's kill can end it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)
    if completion == "spin":
        while True:
            pass
    if completion == "die":
        os._exit(3)
    if completion == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if completion == "raise":
        raise RuntimeError("probe failed")
    if completion == "nan":
        return float("nan")
    return float(completion == answer)
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """A reward module importable by workers (they inherit ``sys.path``)."""
    folder = tmp_path_factory.mktemp("probe")
    (folder / "lit_rlvr_probe_reward.py").write_text(textwrap.dedent(PROBE))
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("lit_rlvr_probe_reward").probe
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("lit_rlvr_probe_reward", None)


@pytest.fixture(scope="module")
def toy_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("db") / "toy.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript("CREATE TABLE t(a INT, b TEXT); INSERT INTO t VALUES (1, 'x'), (2, 'y'), (3, 'y');")
    conn.close()
    return str(path)


def _mixed_batch(toy_db):
    completions, rows = [], []
    for i in range(12):
        completions += [f"\\boxed{{{i}}}", f"#### {i + 1}", "no answer"]
        rows += [{"id": f"m{i}", "prompt": "p", "reward": "math", "answer": f"#### {i}"}] * 3
    sql_row = {"id": "s", "prompt": "p", "reward": "sql", "answer": "SELECT b FROM t", "db_path": toy_db}
    for pred in ["SELECT b FROM t", "SELECT DISTINCT b FROM t", "```sql\nDELETE FROM t\n```", "SELECT zz FROM t"]:
        completions.append(pred)
        rows.append(sql_row)
    return completions, rows


@pytest.mark.timeout(120)
def test_pool_matches_in_process(toy_db):
    completions, rows = _mixed_batch(toy_db)
    expected = BatchScorer(workers=0).score(completions, rows)
    assert [r.reward for r in expected[:6]] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert [r.status for r in expected[-4:]][:2] == ["ok", "ok"] and expected[-2].status == "rejected"
    with BatchScorer(workers=2, timeout_s=5.0, chunk_size=5) as pool:
        assert pool.score(completions, rows) == expected
        assert pool.score(completions[::-1], rows[::-1]) == expected[::-1]
        assert pool.score([], []) == []
        with_answers = BatchScorer(workers=0).score(completions, rows, with_answers=True)
        assert [r.answer for r in with_answers[:3]] == ["0", "1", None]  # answer keys ran (math: canonical numbers)
        assert pool.score(completions, rows, with_answers=True) == with_answers  # ... and equally in the workers


@pytest.mark.timeout(120)
def test_pool_survives_hanging_and_dying_items(probe, toy_db):
    completions, rows = _mixed_batch(toy_db)
    expected = BatchScorer(workers=0).score(completions, rows)
    killed = ("timeout", "killed after the hard deadline of 2 s")
    bad = {
        "hang": killed,
        "spin": killed,
        "die": ("error", "worker died (exit code 3)"),
        "segv": ("error", "worker died (killed by SIGSEGV)"),
        "raise": ("error", "RuntimeError: probe failed"),
        "nan": ("error", "reward nan outside [0, 1]"),
    }
    for k, completion in enumerate(bad):  # interleave the misbehaving items with good ones
        position = 3 + 7 * k
        completions.insert(position, completion)
        rows.insert(position, {"id": f"bad{k}", "reward": "probe", "answer": "x"})
        expected.insert(position, ScoreResult(0.0, *bad[completion]))
    with BatchScorer(workers=2, timeout_s=1.0, kill_grace_s=1.0, chunk_size=4, rewards={"probe": probe}) as pool:
        start = time.perf_counter()
        results = pool.score(completions, rows)
        elapsed = time.perf_counter() - start
        assert results == expected
        assert elapsed < 30, elapsed
        again = pool.score(["x", "y"], [{"id": "a", "reward": "probe", "answer": "x"}] * 2)  # replacements work
        assert again == [ScoreResult(1.0, "ok"), ScoreResult(0.0, "ok")]


REGISTERED = """
from lit_rlvr.rewards import REWARDS

@REWARDS.register("{name}")
def length_parity(completion, answer, **row):
    return float(len(completion) % 2 == int(answer))
"""


@pytest.mark.timeout(120)
def test_rewards_registered_elsewhere_reach_the_workers(tmp_path, monkeypatch):
    """Rewards that other modules register in REWARDS run in workers, even if registered after
    the scorer was built (workers restart with them); unpicklable ones run in this process, with a
    warning that says why, next to the others in the workers."""
    from lit_rlvr.rewards import REWARDS

    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"id": "p", "reward": "parity_a", "answer": "1"}] * 2
    try:
        (tmp_path / "lit_rlvr_parity_a.py").write_text(REGISTERED.format(name="parity_a"))
        importlib.import_module("lit_rlvr_parity_a")
        with BatchScorer(workers=1) as pool:
            assert pool.score(["abc", "ab"], rows) == [ScoreResult(1.0, "ok"), ScoreResult(0.0, "ok")]
            (tmp_path / "lit_rlvr_parity_b.py").write_text(REGISTERED.format(name="parity_b"))
            importlib.import_module("lit_rlvr_parity_b")
            late = [{**r, "reward": "parity_b"} for r in rows]
            assert pool.score(["abc", "ab"], late) == [ScoreResult(1.0, "ok"), ScoreResult(0.0, "ok")]
            seen = []  # what the lambda scored: it can only fill this list in this process
            REWARDS.register("parity_lambda")(lambda completion, answer, **row: seen.append(completion) or 1.0)
            mixed = [{"id": "l", "reward": "parity_lambda", "answer": "1"}, rows[0]]
            with pytest.warns(UserWarning, match="'parity_lambda' runs in the training process.*not picklable"):
                assert pool.score(["x", "abc"], mixed) == [ScoreResult(1.0, "ok"), ScoreResult(1.0, "ok")]
            assert seen == ["x"]
        assert BatchScorer(workers=0).score(["x"], [{"id": "l", "reward": "parity_lambda", "answer": "1"}]) == [
            ScoreResult(1.0, "ok")
        ]
    finally:
        for name in ("parity_a", "parity_b", "parity_lambda"):
            REWARDS.pop(name, None)
        for module in ("lit_rlvr_parity_a", "lit_rlvr_parity_b"):
            sys.modules.pop(module, None)


@pytest.mark.timeout(120)
def test_soft_deadline_times_out_without_killing_the_worker(toy_db):
    row = {"id": "r", "reward": "sql", "answer": "SELECT a FROM t", "db_path": toy_db}
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    with BatchScorer(workers=1, timeout_s=0.3, kill_grace_s=5.0) as pool:
        pool.score(["SELECT a FROM t"], [row])
        pid = pool._workers[0].proc.pid
        results = pool.score([endless, "SELECT a FROM t"], [row, row])
        assert results == [ScoreResult(0.0, "timeout"), ScoreResult(1.0, "ok")]
        assert pool._workers[0].proc.pid == pid


@pytest.mark.timeout(120)
def test_malformed_gold_raises_after_the_batch(toy_db):
    rows = [{"id": "fine", "reward": "math", "answer": "2"}, {"id": "broken-7", "reward": "math", "answer": "  "}]
    with BatchScorer(workers=1) as pool:
        with pytest.raises(GoldAnswerError, match="broken-7"):
            pool.score(["\\boxed{2}", "\\boxed{2}"], rows)
        assert pool.score(["\\boxed{2}"], rows[:1]) == [ScoreResult(1.0, "ok")]
    with pytest.raises(GoldAnswerError, match="broken-7"):
        BatchScorer(workers=0).score(["\\boxed{2}"], rows[1:])


@pytest.mark.parametrize(
    ("completions", "rows", "match"),
    [
        (["a"], [], "must pair up"),
        (["a"], [{"id": "r", "answer": "1"}], "needs 'reward' and 'answer'"),
        (
            ["a"],
            [{"id": "r", "reward": "chess", "answer": "1"}],
            "unknown reward .chess. in rows; valid names: .*.math.",
        ),
    ],
)
def test_score_validates_rows(completions, rows, match):
    with pytest.raises(ValueError, match=match):
        BatchScorer(workers=0).score(completions, rows)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": -1}, "workers"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_constructor_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BatchScorer(**{"workers": 0, **kwargs})


def test_an_unpicklable_reward_is_scored_in_process_with_a_warning_at_construction():
    with pytest.warns(UserWarning, match="'lam' runs in the training process.*not picklable"):
        scorer = BatchScorer(workers=1, rewards={"lam": lambda c, a, **r: 1.0})
    with scorer:
        assert scorer.score(["x"], [{"id": "l", "reward": "lam", "answer": "1"}]) == [ScoreResult(1.0, "ok")]


@pytest.mark.timeout(120)
def test_pool_on_real_data_matches_in_process(shared_data):
    gsm = [json.loads(line) for line in (shared_data / "gsm8k" / "test.jsonl").open()][:60]
    math500 = [json.loads(line) for line in (shared_data / "math500" / "test.jsonl").open()][:30]
    spider = json.load((shared_data / "spider_dev" / "dev.json").open())[:60]
    completions, rows = [], []
    for i, r in enumerate(gsm):
        gold = r["answer"].rsplit("####", 1)[1].strip()
        completions += [f"\\boxed{{{gold}}}", f"#### {gold}1"]
        rows += [{"id": f"g{i}", "reward": "math", "answer": r["answer"]}] * 2
    for r in math500:
        completions += [f"\\boxed{{{r['answer']}}}", "\\boxed{x^{3}+7}"]
        rows += [{"id": r["unique_id"], "reward": "math", "answer": r["answer"]}] * 2
    for i, q in enumerate(spider):
        db = shared_data / "spider_dev" / "database" / q["db_id"] / f"{q['db_id']}.sqlite"
        completions += [f"```sql\n{q['query']}\n```", "SELECT 1"]
        rows += [{"id": f"s{i}", "reward": "sql", "answer": q["query"], "db_path": str(db)}] * 2
    expected = BatchScorer(workers=0).score(completions, rows)
    assert sum(r.reward for r in expected) == len(gsm) + len(math500) + len(spider)
    with BatchScorer(workers=2) as pool:
        assert pool.score(completions, rows) == expected


def test_a_row_column_named_like_an_argument_or_option_of_its_reward_does_not_collide(toy_db):
    """A dataset's own columns ``completion``, ``mode`` or ``timeout_s`` are row fields: they neither
    collide with the reward's arguments (a TypeError: a right answer scored 0) nor set its options."""
    columns = {"completion": "the reference solution", "mode": "multi-turn", "timeout_s": "long"}
    rows = [
        {"id": "s", "reward": "sql", "answer": "SELECT b FROM t", "db_path": toy_db, **columns},
        {"id": "m", "reward": "math", "answer": "#### 18", **columns},
    ]
    plain = [{k: v for k, v in row.items() if k not in columns} for row in rows]
    completions = ["SELECT b FROM t", "\\boxed{18}"]
    for options in ({}, {"sql": {"mode": "bird"}}):
        scorer = BatchScorer(workers=0, options=options)
        assert scorer.score(completions, rows) == [ScoreResult(1.0), ScoreResult(1.0)]
        answers = [r.answer for r in scorer.score(completions, rows, with_answers=True)]
        assert answers[1] == "18" and answers == [r.answer for r in scorer.score(completions, plain, with_answers=True)]
        assert scorer.check_golds(rows) == [None, None]


def test_a_reward_gets_only_the_row_fields_it_names_and_its_options_from_the_config():
    def exact(completion, answer, *, strip: bool = True, **row):
        return float((completion.strip() if strip else completion) == answer)

    def by_id(completion, answer, id):  # no **row: the other fields are not passed
        return float(completion == answer and id == "q")

    rows = [{"id": "q", "reward": r, "answer": "4", "strip": False, "prompt": "2+2?"} for r in ("exact", "by_id")]
    scorer = BatchScorer(workers=0, rewards={"exact": exact, "by_id": by_id})
    assert scorer.score(["4 ", "4"], rows) == [ScoreResult(1.0), ScoreResult(1.0)]  # the row's strip is no option
    configured = BatchScorer(workers=0, rewards={"exact": exact}, options={"exact": {"strip": False}})
    assert [r.reward for r in configured.score(["4 "], rows[:1])] == [0.0]
