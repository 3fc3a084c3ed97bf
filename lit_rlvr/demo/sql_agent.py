"""The multi-turn SQL toy: a text-to-SQL agent that must query the database to answer.

Questions in the SQL toy's compact template (:mod:`lit_rlvr.demo.sql_toy`; ``Q:max a g=x;``: an
aggregate of one group) are asked of several generated SQLite databases, and every database names
its table differently (``birds``, ``books`` …, drawn per database). The name is in no question: a policy that answers at once guesses it, right
one time in :data:`NUM_NAMES` at best, while one that first asks the database
(``<sql>SELECT name FROM sqlite_master</sql>``) reads it in the observation and can write the
answer. The episode runs in the real ``sql`` environment (:class:`~lit_rlvr.envs.sql.SQLEnvironment`:
SkyRL-SQL's tags and observations without the turn reminder, lit_rlvr's sandbox) and its solution
is scored by the Spider execution reward. A trajectory reads::

    Q:max a g=x;
    <sql>SELECT name FROM sqlite_master</sql>

    <observation>lamps</observation>

    <solution>SELECT max(a) FROM lamps WHERE g='x'</solution>

Whether the agent keeps querying where the tool is needed is the behaviour the agents demo
measures beside the countdown checker's, where the tool is optional (docs/agents.md).

As with the countdown checker, a tiny model learns the protocol first: :func:`agent_trajectory`
draws the warm start's synthetic trajectories (``lit-rlvr warmstart`` with ``sql_agent_share``),
:data:`QUERY_SHARE` of them asking for the table's name first, the others answering with a guessed
name, so both behaviours are there for RL to keep or lose; the observations are the environment's own.
Everything is deterministic given a seed.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from lit_rlvr.demo import sql_toy
from lit_rlvr.envs.sql import SQLEnvironment

TABLE_NAMES = ("birds", "books", "cars", "coins", "games", "lamps", "plants", "songs", "stars", "tools")
NUM_NAMES = len(TABLE_NAMES)
SCHEMA_QUERY = "SELECT name FROM sqlite_master"
QUERY_SHARE = 0.75  # warm-start trajectories that ask for the table's name before they answer
NUM_DATABASES = 32  # the first TRAIN_DATABASES are the training databases, the rest held out
TRAIN_DATABASES = 24
QUESTIONS_PER_DATABASE = 8  # rows per database in the RL data files
ENVIRONMENT_OPTIONS = {"reminder": False}  # the sql environment's options here (configs/demo/sql_agent/base.yaml)
HEADS = ("count", "sum a", "sum b", "max a", "max b", "min a", "min b")  # what a question asks, of one group g


def database_name(seed: int, index: int) -> str:
    """The table name of database ``index``: every name of :data:`TABLE_NAMES` serves about as many
    databases (a shuffled cycle of them, drawn from ``seed``), so no guess beats 1 in :data:`NUM_NAMES`
    by much.

    Example:
        >>> [database_name(0, i) for i in range(4)]
        ['games', 'lamps', 'coins', 'songs']
    """
    cycle = [TABLE_NAMES[i % NUM_NAMES] for i in range(max(NUM_DATABASES, index + 1))]
    random.Random(f"sql_agent/{seed}").shuffle(cycle)
    return cycle[index]


def database_seed(seed: int, index: int) -> int:
    """The :func:`~lit_rlvr.demo.sql_toy.table_rows` seed of database ``index``."""
    return 1000 * (seed + 1) + index


def build_database(path: str | Path, seed: int, index: int) -> Path:
    """Write database ``index``: :func:`~lit_rlvr.demo.sql_toy.table_rows` in a table named
    :func:`database_name` (replacing ``path``); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    name = database_name(seed, index)
    con = sqlite3.connect(path)
    try:
        con.execute(f"CREATE TABLE {name}(id INTEGER PRIMARY KEY, a INTEGER, b INTEGER, g TEXT)")
        con.executemany(f"INSERT INTO {name} VALUES (?,?,?,?)", sql_toy.table_rows(database_seed(seed, index)))
        con.commit()
    finally:
        con.close()
    return path


def database_questions(seed: int, index: int, db_path: str) -> list[dict]:
    """Every question of database ``index``: each of :data:`HEADS` of each group ``g`` (``Q:max a
    g=x;``), its gold query (:func:`~lit_rlvr.demo.sql_toy.gold_query`) on the database's own table.
    The questions are the same for every database; only the table they must be asked of differs.

    Each item has ``id`` (``sql_agent/<db>/<n>``), ``prompt`` (no table name), ``answer`` (the gold
    SQL), ``reward`` (``"sql"``) and ``db_path``.

    Example:
        >>> q = database_questions(0, 2, "db02.sqlite")[4]  # the 2nd head's 2nd group
        >>> q["prompt"], q["answer"], q["db_path"]
        ('Q:sum a g=y;', "SELECT sum(a) FROM coins WHERE g='y';", 'db02.sqlite')
    """
    name, out = database_name(seed, index), []
    for head in HEADS:
        aggregate, _, column = head.partition(" ")
        for group in sql_toy.GROUPS:
            gold = sql_toy.gold_query(aggregate, column or None, f"g='{group}'")
            n = len(out)
            out.append(
                {
                    "id": f"sql_agent/{index:02d}/{n:03d}",
                    "prompt": f"Q:{head} g={group};",
                    "answer": gold.replace(f" FROM {sql_toy.TABLE} ", f" FROM {name} "),
                    "reward": "sql",
                    "db_path": db_path,
                }
            )
    return out


def write_databases(out_dir: str | Path, seed: int = 0) -> list[Path]:
    """Write the :data:`NUM_DATABASES` databases into ``out_dir`` (``db00.sqlite`` …); returns their paths."""
    return [build_database(Path(out_dir) / f"db{i:02d}.sqlite", seed, i) for i in range(NUM_DATABASES)]


def training_rows(out_dir: str | Path, seed: int = 0) -> list[dict]:
    """Write the :data:`TRAIN_DATABASES` training databases into ``out_dir`` and return every
    question of theirs (:func:`database_questions`, absolute ``db_path``): the warm start's rows."""
    rows = []
    for index in range(TRAIN_DATABASES):
        db = build_database(Path(out_dir) / f"db{index:02d}.sqlite", seed, index)
        rows += database_questions(seed, index, str(db.resolve()))
    return rows


def corpus(rows: list[dict], n: int = 1000, seed: int = 0, max_turns: int = 3) -> list[str]:
    """The text of ``n`` :func:`agent_trajectory` draws (question line, turns, observations): what a
    warm start's BPE tokenizer is trained on (:func:`lit_rlvr.demo.tiny.build_bpe_tokenizer`)."""
    rng = random.Random(f"sql_agent/corpus/{seed}")
    texts = []
    for _ in range(n):
        row, parts = agent_trajectory(rng, rows, max_turns)
        texts += [row["prompt"] + "\n", *(text for text, _ in parts)]
    return texts


def split_rows(seed: int = 0, folder: str = "sql_agent") -> tuple[list[dict], list[dict]]:
    """The RL rows: :data:`QUESTIONS_PER_DATABASE` questions of each training database, and of
    each held-out one (``db_path`` relative: ``<folder>/dbNN.sqlite``).

    Example:
        >>> train, val = split_rows(0)
        >>> len(train), len(val), {r["db_path"] for r in val} & {r["db_path"] for r in train}
        (192, 64, set())
    """
    train, val = [], []
    for index in range(NUM_DATABASES):
        rows = database_questions(seed, index, f"{folder}/db{index:02d}.sqlite")
        picked = random.Random(f"sql_agent/rows/{seed}/{index}").sample(rows, QUESTIONS_PER_DATABASE)
        (train if index < TRAIN_DATABASES else val).extend(sorted(picked, key=lambda r: r["id"]))
    return train, val


def agent_trajectory(
    rng: random.Random, rows: list[dict], max_turns: int = 3, query_share: float = QUERY_SHARE
) -> tuple[dict, list[tuple[str, bool]]]:
    """A synthetic trajectory on a random row (``db_path`` an existing file): ``(row, [(text, is the model's), ...])``.

    With probability ``query_share`` (and ``max_turns`` >= 2) the model asks for the table's name,
    the ``sql`` environment answers, and the model writes a query with the gold's result
    (:func:`~lit_rlvr.demo.sql_toy.equivalent_queries`) on that table; otherwise it writes that
    query at once on a guessed table name.

    Example:
        >>> import tempfile
        >>> db = build_database(Path(tempfile.mkdtemp()) / "db.sqlite", 0, 2)
        >>> rows = database_questions(0, 2, str(db))
        >>> row, parts = agent_trajectory(random.Random(1), rows)
        >>> row["prompt"], [text for text, model in parts if model]
        ('Q:sum a g=y;', ['<sql>SELECT name FROM sqlite_master</sql>', "<solution>SELECT sum(a) FROM coins WHERE g='y'</solution>"])
        >>> parts[1][0]
        '\\n\\n<observation>coins</observation>\\n\\n'
        >>> env = SQLEnvironment(**ENVIRONMENT_OPTIONS); env.reset(row, 3); env.step(parts[-1][0]).reward
        1.0
    """
    row = rng.choice(rows)
    env = SQLEnvironment(**ENVIRONMENT_OPTIONS)
    env.reset(row, max_turns)
    answer = rng.choice(sql_toy.equivalent_queries(row["answer"])).rstrip(";")
    parts: list[tuple[str, bool]] = []
    if max_turns >= 2 and rng.random() < query_share:
        action = f"<{env.sql_tag}>{SCHEMA_QUERY}</{env.sql_tag}>"
        parts += [(action, True), (env.step(action).observation, False)]
    else:
        table = row["answer"].split(" FROM ")[1].split(" ")[0]
        answer = answer.replace(f" FROM {table} ", f" FROM {rng.choice(TABLE_NAMES)} ")
    parts.append((f"<{env.answer_tag}>{answer}</{env.answer_tag}>", True))
    return row, parts
