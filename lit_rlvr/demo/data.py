"""Write the CPU demo's prompt files: countdown-3 (RL + held-out), addition (out-of-domain), the SQL toys.

Rows follow the library's convention ``{"id", "prompt", "answer", "reward", ...extras}`` and are
read with the ``generic`` data adapter (keep ``extra_fields`` containing ``digits`` for countdown
and ``db_path`` for SQL; a relative ``db_path`` is resolved against the data file's folder).

| file | rows | reward | extras |
|---|---|---|---|
| ``countdown_train.jsonl`` | the training (digits, target) pairs RL trains on | ``countdown`` | ``digits``, ``n_solutions`` |
| ``countdown_select.jsonl`` | every 10th training pair, left out of RL: the split on which settings are chosen | ``countdown`` | ``digits``, ``n_solutions`` |
| ``agents_train.jsonl`` | every 6th row of ``countdown_train.jsonl``: the multi-turn demo's training prompts, few enough for its reference cache on 2 cores | ``countdown`` | ``digits``, ``n_solutions`` |
| ``countdown_val.jsonl`` | the held-out pairs (~10 %, never trained on, not used to choose anything) | ``countdown`` | ``digits``, ``n_solutions`` |
| ``addition_val.jsonl`` | 200 two-digit additions, out of domain, never in RL nor warm start | ``math`` | ``a``, ``b`` |
| ``sql_train.jsonl`` / ``sql_val.jsonl`` | SQL toy questions (80/20) | ``sql`` | ``db_path`` |
| ``sql_toy.sqlite`` | the SQL toy's database | | |
| ``sql_agent_train.jsonl`` / ``sql_agent_val.jsonl`` | the multi-turn SQL toy: 8 questions of each of 24 training and 8 held-out databases | ``sql`` | ``db_path`` |
| ``sql_agent/db00.sqlite`` … | the multi-turn SQL toy's 32 databases, each naming its table differently (:mod:`lit_rlvr.demo.sql_agent`) | | |

The countdown answer is the target as a decimal string (``"26"``); the addition answer is the sum
(``"82"`` for ``A37+45=``), which the math reward matches against the model's ``\\boxed{082}``.
Addition is two-digit by default: the demo's ~1.3M-parameter model learns it partly within its
few-minute warm start, while three-digit addition stays near zero (pass@1 0.008 after 550 steps),
which would leave no out-of-domain skill to forget. The warm start must use the same ``seed`` and
``addition_width`` so that it never trains on the held-out additions.
Deterministic by seed, no network; files whose content is unchanged are not rewritten.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

from lit_rlvr.demo import sql_agent, sql_toy
from lit_rlvr.demo.countdown import addition_prompt, countdown_prompt, solutions, split_countdown

ADDITION_VAL_SIZE = 200
ADDITION_WIDTH = 2
DEMO_CHARS = "0123456789+-*=;:CA\n\\boxed{}" + sql_toy.SQL_CHARS
"""Every character the demo tasks' prompts and answers use (the char tokenizer's vocabulary)."""


def countdown_rows(pairs: list[tuple[str, int]], seed: int = 0) -> list[dict]:
    """Prompt rows for (sorted digits, target) pairs; each prompt shows its digits shuffled by ``seed``.

    Example:
        >>> countdown_rows([("357", 26)])
        [{'id': 'countdown/357=026', 'prompt': 'C357=026:', 'answer': '26', 'reward': 'countdown', 'digits': '357', 'n_solutions': 4}]
    """
    table = solutions()
    rows = []
    for key_digits, target in pairs:
        shuffled = list(key_digits)
        random.Random(f"{seed}/{key_digits}={target}").shuffle(shuffled)
        digits = "".join(shuffled)
        rows.append(
            {
                "id": f"countdown/{key_digits}={target:03d}",
                "prompt": countdown_prompt(digits, target),
                "answer": str(target),
                "reward": "countdown",
                "digits": digits,
                "n_solutions": len(table[(key_digits, target)]),
            }
        )
    return rows


def addition_val_pairs(seed: int = 0, n: int = ADDITION_VAL_SIZE, width: int = ADDITION_WIDTH) -> list[tuple[int, int]]:
    """The ``n`` distinct out-of-domain addition pairs (operands < 10**width) held out by ``seed``.

    Example:
        >>> pairs = addition_val_pairs(0, n=3)
        >>> len(set(pairs)), all(0 <= x < 1000 for p in pairs for x in p)
        (3, True)
    """
    if n > (10**width) ** 2:
        raise ValueError(f"cannot draw {n} distinct addition pairs with {width}-digit operands")
    rng = random.Random(f"addition/{seed}/{width}")
    pairs: dict[tuple[int, int], None] = {}
    while len(pairs) < n:
        pairs[(rng.randrange(10**width), rng.randrange(10**width))] = None
    return list(pairs)


def addition_rows(pairs: list[tuple[int, int]], width: int = ADDITION_WIDTH) -> list[dict]:
    """Prompt rows judged by the math reward.

    Example:
        >>> addition_rows([(374, 458)], width=3)
        [{'id': 'addition/374+458', 'prompt': 'A374+458=', 'answer': '832', 'reward': 'math', 'a': 374, 'b': 458}]
    """
    return [
        {
            "id": f"addition/{a:0{width}d}+{b:0{width}d}",
            "prompt": addition_prompt(a, b, width),
            "answer": str(a + b),
            "reward": "math",
            "a": a,
            "b": b,
        }
        for a, b in pairs
    ]


def _write_if_changed(path: Path, data: bytes) -> Path:
    if path.is_file() and path.read_bytes() == data:
        return path
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    return _write_if_changed(path, "".join(json.dumps(r) + "\n" for r in rows).encode())


def write_demo_data(
    out_dir: str | Path,
    seed: int = 0,
    holdout: float = 0.1,
    addition_val_size: int = ADDITION_VAL_SIZE,
    addition_width: int = ADDITION_WIDTH,
    sql_holdout: float = 0.2,
    select_every: int = 10,
    agents_every: int = 6,
) -> dict[str, Path]:
    """Write the demo's data files into ``out_dir`` (module docstring); idempotent.

    Args:
        out_dir: folder to write into (created if needed).
        seed: drives the countdown split, prompt digit order, addition pairs, SQL table and split.
        holdout: share of countdown (digits, target) pairs held out from all training.
        addition_val_size: number of out-of-domain addition prompts.
        addition_width: digits per addition operand.
        sql_holdout: share of SQL toy questions in ``sql_val``.
        select_every: every this-many-th training pair goes to ``countdown_select`` (left out of RL,
            seen by the warm start like every training pair) instead of ``countdown_train``.
        agents_every: every this-many-th row of ``countdown_train`` is also in ``agents_train``
            (the multi-turn demo's training prompts, docs/agents.md).

    Returns:
        ``{"countdown_train", "countdown_select", "agents_train", "countdown_val", "addition_val",
        "sql_train", "sql_val", "sql_db", "sql_agent_train", "sql_agent_val", "sql_agent_dbs"}`` → the
        paths written (``sql_agent_dbs``: the databases' folder).

    Example:
        >>> import tempfile
        >>> paths = write_demo_data(tempfile.mkdtemp())
        >>> sorted(paths), sum(1 for _ in open(paths["countdown_val"]))
        (['addition_val', 'agents_train', 'countdown_select', 'countdown_train', 'countdown_val', 'sql_agent_dbs', 'sql_agent_train', 'sql_agent_val', 'sql_db', 'sql_train', 'sql_val'], 142)
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, val = split_countdown(seed, holdout)
    db_name = "sql_toy.sqlite"
    with tempfile.TemporaryDirectory() as tmp:
        db = sql_toy.build_database(Path(tmp) / db_name, seed)
        paths = {"sql_db": _write_if_changed(out / db_name, db.read_bytes())}
        (out / "sql_agent").mkdir(exist_ok=True)
        for db in sql_agent.write_databases(Path(tmp) / "sql_agent", seed):
            _write_if_changed(out / "sql_agent" / db.name, db.read_bytes())
    agent_train, agent_val = sql_agent.split_rows(seed, "sql_agent")
    sql_train, sql_val = sql_toy.split_questions(seed, sql_holdout)
    select = set(train[::select_every])
    rl_train = [p for p in train if p not in select]
    paths |= {
        "countdown_train": _write_jsonl(out / "countdown_train.jsonl", countdown_rows(rl_train, seed)),
        "agents_train": _write_jsonl(out / "agents_train.jsonl", countdown_rows(rl_train[::agents_every], seed)),
        "countdown_select": _write_jsonl(out / "countdown_select.jsonl", countdown_rows(train[::select_every], seed)),
        "countdown_val": _write_jsonl(out / "countdown_val.jsonl", countdown_rows(val, seed)),
        "addition_val": _write_jsonl(
            out / "addition_val.jsonl",
            addition_rows(addition_val_pairs(seed, addition_val_size, addition_width), addition_width),
        ),
        "sql_train": _write_jsonl(
            out / "sql_train.jsonl", [{**q, "reward": "sql", "db_path": db_name} for q in sql_train]
        ),
        "sql_val": _write_jsonl(out / "sql_val.jsonl", [{**q, "reward": "sql", "db_path": db_name} for q in sql_val]),
        "sql_agent_train": _write_jsonl(out / "sql_agent_train.jsonl", agent_train),
        "sql_agent_val": _write_jsonl(out / "sql_agent_val.jsonl", agent_val),
        "sql_agent_dbs": out / "sql_agent",
    }
    return paths


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a JSONL file written by :func:`write_demo_data` (a relative ``db_path`` made absolute)."""
    path = Path(path)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        if "db_path" in row and not Path(row["db_path"]).is_absolute():
            row["db_path"] = str(path.parent / row["db_path"])
    return rows


def main(argv: list[str] | None = None) -> dict[str, Path]:
    """``lit-rlvr demo-data --out_dir artifacts/demo/data``: write (or keep) the demo's data files."""
    from jsonargparse import CLI

    paths = CLI(write_demo_data, args=argv, as_positional=False)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return paths
