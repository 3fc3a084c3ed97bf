"""Dataset adapters: one function per dataset format that turns a raw record into a prompt row.

A prompt *row* is ``{"id", "prompt", "answer", "reward", ...extras}``: a stable string id (the
dataset name and the record's index, or its native id), the problem text (before any chat
template) or a conversation (a list of ``{"role", "content"}`` messages, TRL's and verl's
conversational prompts), the gold answer as a string, and the name of the reward function in
``lit_rlvr.rewards.REWARDS`` that judges it. A row scored by ``model.scoring.reward_funcs`` (a TRL
dataset) may have no ``reward`` and no ``answer``: its columns are what the reward functions read;
a row its multi-turn environment scores needs no ``reward``.
Adapters are registered in :data:`ADAPTERS` and chosen by name from config; each has the signature

    ``adapter(record: dict, *, index: int, name: str, source: Path, **options) -> dict``

where ``index`` is the record's 0-based position among all records of the dataset and ``source``
the file it came from. A record that cannot become a row raises :class:`BadRowError`; the loader
reports it with file and line and carries on. An adapter whose text prompts go to the tokenizer as
they are (TRL's standard format) registers with ``raw_text=True`` (:class:`LoadedRows`).
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from lit_rlvr.data.readers import BadRow, HFSource, read_hf_records, read_records
from lit_rlvr.registry import Registry
from lit_rlvr.rewards.base import REWARDS

ADAPTERS = Registry("dataset adapter", injected=("index", "name", "source"))

_INT_LIKE = re.compile(r"[+-]?\d+(\.0*)?")


class BadRowError(ValueError):
    """A record that cannot become a prompt row (missing field, unreadable database, ...)."""


class ReservedColumnError(ValueError):
    """A dataset column that the row's own key of that name would hide: a problem of the whole
    dataset, reported once by :func:`load_rows` with the setting that fixes it, not row by row."""

    def __init__(self, columns: list[str]):
        self.columns = columns
        super().__init__(
            f"column(s) {columns} would be hidden by the row's own key(s) of that name (`answer`: the gold; "
            "`reward`: the registered reward that scores the row; `id`: the row's key); rename them in the data"
        )


def normalize_answer(value) -> str:
    """Gold answer as a string; integer-valued numbers lose padding and trailing ``.0``.

    AIME answers come zero-padded (``"025"``), AMC answers as floats or float strings (``27.0``,
    ``"142.0"``); all become the integer's string so every format of the same number agrees.
    Anything else (LaTeX, fractions, decimals) is kept verbatim, stripped.

    Example:
        >>> [normalize_answer(a) for a in ["025", 27.0, "142.0", 7, " \\\\frac{1}{2} ", 0.5, "-3"]]
        ['25', '27', '142', '7', '\\\\frac{1}{2}', '0.5', '-3']
    """
    if isinstance(value, bool) or value is None:
        raise BadRowError(f"answer must be a string or a number, got {value!r}")
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    text = str(value).strip()
    if _INT_LIKE.fullmatch(text):
        return str(int(float(text))) if "." in text else str(int(text))
    return text


def _field(record: dict, key: str) -> object:
    value = record.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BadRowError(f"missing or empty field {key!r} (fields present: {sorted(record)})")
    return value


def _text(record: dict, key: str) -> str:
    """Field ``key`` as the text of a prompt: a non-empty string of valid Unicode, never converted.

    Example:
        >>> _text({"q": 7}, "q")
        Traceback (most recent call last):
        ...
        lit_rlvr.data.adapters.BadRowError: field 'q' must be text, got int 7
    """
    value = _field(record, key)
    if not isinstance(value, str):
        raise BadRowError(f"field {key!r} must be text, got {type(value).__name__} {value!r:.60}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate ("\\ud800" in JSON): no tokenizer takes it
        raise BadRowError(f"field {key!r} is not valid Unicode: a lone surrogate at character {e.start}") from None
    return value


def _row_id(record: dict, index: int, name: str, id_field: str | None) -> str:
    if id_field is None:
        return f"{name}/{index}"
    return f"{name}/{_field(record, id_field)}"


@ADAPTERS.register("gsm8k")
def gsm8k(
    record: dict, *, index: int, name: str, source: Path, reward: str = "math", id_field: str | None = None
) -> dict:
    """GSM8K: ``question``, and ``answer`` = reasoning then ``#### N``; the gold is N without commas.

    Example:
        >>> gsm8k({"question": "2+2?", "answer": "so 4\\n#### 1,004"}, index=3, name="gsm8k", source=Path("t"))
        {'id': 'gsm8k/3', 'prompt': '2+2?', 'answer': '1004', 'reward': 'math', 'solution': 'so 4\\n#### 1,004'}
    """
    solution = str(_field(record, "answer"))
    if "####" not in solution:
        raise BadRowError(f"GSM8K answer has no '#### N' final answer: {solution[-80:]!r}")
    final = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not final:
        raise BadRowError("GSM8K answer has an empty final answer after '####'")
    prompt = _text(record, "question")
    return {
        "id": _row_id(record, index, name, id_field),
        "prompt": prompt,
        "answer": final,
        "reward": reward,
        "solution": solution,
    }


@ADAPTERS.register("math")
def math_problem(
    record: dict,
    *,
    index: int,
    name: str,
    source: Path,
    reward: str = "math",
    id_field: str | None = None,
    prompt_field: str = "problem",
    answer_field: str = "answer",
) -> dict:
    """MATH-style (MATH-500, AIME, AMC): ``problem`` and ``answer``, normalised by :func:`normalize_answer`.

    Extras kept when present: ``solution``, ``subject``, ``level``.

    Example:
        >>> math_problem({"problem": "p", "answer": "025", "level": 3}, index=0, name="aime24", source=Path("t"))
        {'id': 'aime24/0', 'prompt': 'p', 'answer': '25', 'reward': 'math', 'level': 3}
    """
    row = {
        "id": _row_id(record, index, name, id_field),
        "prompt": _text(record, prompt_field),
        "answer": normalize_answer(_field(record, answer_field)),
        "reward": reward,
    }
    row.update({k: record[k] for k in ("solution", "subject", "level") if record.get(k) is not None})
    return row


@functools.lru_cache(maxsize=256)
def sqlite_schema(db_path: str) -> str:
    """The ``CREATE`` statements of a SQLite database's tables, read through ``sqlite_master``.

    Opens the file read-only (``mode=ro``), so a missing file is an error rather than a new,
    empty database. Cached per path: many questions share one database.
    """
    if not Path(db_path).is_file():
        raise BadRowError(f"SQLite database {db_path!r} does not exist")
    try:
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            rows = con.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL ORDER BY rowid"
            ).fetchall()
        finally:
            con.close()
    except sqlite3.Error as e:
        raise BadRowError(f"cannot read SQLite database {db_path!r}: {e}") from e
    if not rows:
        raise BadRowError(f"SQLite database {db_path!r} has no tables")
    return "\n".join(r[0].strip() + ";" for r in rows)


@ADAPTERS.register("spider")
def spider(
    record: dict,
    *,
    index: int,
    name: str,
    source: Path,
    reward: str = "sql",
    db_root: str | None = None,
    id_field: str | None = None,
) -> dict:
    """Spider / BIRD-style text-to-SQL: ``question``, ``db_id``, gold ``query`` (or ``SQL``).

    The database is ``<db_root>/<db_id>/<db_id>.sqlite`` (``db_root`` defaults to ``database/``
    next to the data file). The prompt is the schema (``CREATE`` statements from
    ``sqlite_master``) followed by the question; the row carries ``db_path`` for the SQL reward.
    """
    db_id = str(_field(record, "db_id"))
    root = Path(db_root) if db_root is not None else Path(source).parent / "database"
    db_path = str(root / db_id / f"{db_id}.sqlite")
    schema = sqlite_schema(db_path)
    gold = record.get("query") if record.get("query") is not None else record.get("SQL")
    if gold is None or not str(gold).strip():
        raise BadRowError(f"missing gold SQL: neither 'query' nor 'SQL' present (fields: {sorted(record)})")
    question = _text(record, "question")
    prompt = f"Database schema:\n{schema}\n\nQuestion: {question}"
    return {
        "id": _row_id(record, index, name, id_field),
        "prompt": prompt,
        "answer": str(gold).strip(),
        "reward": reward,
        "db_id": db_id,
        "db_path": db_path,
        "question": question,
    }


KEPT_FIELDS = ("db_path",)
"""Record fields the ``jsonl`` adapter always keeps when present (the SQL reward's database)."""


@ADAPTERS.register("jsonl")
def generic(
    record: dict,
    *,
    index: int,
    name: str,
    source: Path,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    reward: str | None = None,
    reward_field: str = "reward",
    id_field: str | None = None,
    extra_fields: Iterable[str] = (),
) -> dict:
    """Generic field mapping for any JSONL/JSON/Parquet file (e.g. the synthetic demo tasks).

    The reward name is ``reward`` when given, else the record's ``reward_field``; a row with
    neither has no ``reward``, for rows a multi-turn environment scores (docs/agents.md) or that
    ``model.scoring.reward_funcs`` score (the start-up checks refuse it otherwise, naming the fix:
    :meth:`~lit_rlvr.rewards.RewardMix.check_rows`). String answers are kept verbatim (numbers
    become strings). The record's fields in :data:`KEPT_FIELDS`
    (``db_path``) and in ``extra_fields`` are kept in the row when present: ``extra_fields`` adds
    to them (``[db_id, data]`` keeps ``db_path`` too); a relative ``db_path`` is resolved against
    the data file's folder.

    Example:
        >>> generic({"q": "1+1", "a": 2, "reward": "math"}, index=0, name="toy", source=Path("t"),
        ...         prompt_field="q", answer_field="a")
        {'id': 'toy/0', 'prompt': '1+1', 'answer': '2', 'reward': 'math'}
    """
    reward_name = reward if reward is not None else record.get(reward_field)
    answer = _field(record, answer_field)
    row = {
        "id": _row_id(record, index, name, id_field),
        "prompt": _text(record, prompt_field),
        "answer": answer if isinstance(answer, str) else normalize_answer(answer),
    }
    if reward_name is not None and str(reward_name).strip():
        row["reward"] = str(reward_name)
    for key in dict.fromkeys([*KEPT_FIELDS, *extra_fields]):
        if record.get(key) is not None:
            row[key] = record[key]
    if "db_path" in row and not Path(row["db_path"]).is_absolute():
        row["db_path"] = str(Path(source).parent / row["db_path"])
    return row


def messages(value, key: str = "prompt") -> list[dict]:
    """A conversational prompt, checked: a non-empty list of messages, each with a string ``role`` and ``content``.

    Example:
        >>> messages([{"role": "user", "content": "2+2?"}])
        [{'role': 'user', 'content': '2+2?'}]
        >>> messages([{"role": "user", "content": ["image", "text"]}])
        Traceback (most recent call last):
        ...
        lit_rlvr.data.adapters.BadRowError: 'prompt' message 1 must have a string 'role' and a string 'content' (text only), got {'role': 'user', 'content': ['image', 'text']}
    """
    if not isinstance(value, list) or not value:
        raise BadRowError(f"{key!r} must be text or a non-empty list of messages, got {value!r:.80}")
    for i, message in enumerate(value, start=1):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise BadRowError(
                f"{key!r} message {i} must have a string 'role' and a string 'content' (text only), got {message!r:.80}"
            )
    return [dict(m) for m in value]


def _prompt(record: dict, key: str) -> str | list[dict]:
    """A record's prompt: non-empty text (standard) or a list of messages (conversational)."""
    value = _field(record, key)
    return str(value) if isinstance(value, str) else messages(value, key)


def _columns(record: dict, prompt_key: str, id_field: str | None, reserved: tuple[str, ...]) -> dict:
    """Every column but the prompt; raises :class:`ReservedColumnError` for one the row's own keys
    would hide (an ``id`` column keys the row unless ``id_field`` names another: :func:`_key_field`)."""
    hidden = [k for k in reserved if k in record and not (k == "id" and _key_field(record, id_field) == "id")]
    if hidden:
        raise ReservedColumnError(hidden)
    return {k: v for k, v in record.items() if k != prompt_key}


def _key_field(record: dict, id_field: str | None) -> str | None:
    """The column that keys a row of a dataset whose columns are all kept: ``id_field``, else the
    dataset's own ``id`` column when it has one (Hub datasets often do), else None (its position).

    Example:
        >>> _key_field({"id": "a7", "prompt": "p"}, None), _key_field({"prompt": "p"}, None), _key_field({"uid": 3}, "uid")
        ('id', None, 'uid')
    """
    return id_field if id_field is not None else "id" if "id" in record else None


@ADAPTERS.register("trl", raw_text=True)  # TRL sends its text prompts as they are
def trl(
    record: dict,
    *,
    index: int,
    name: str,
    source: Path,
    answer_field: str | None = None,
    reward: str | None = None,
    id_field: str | None = None,
) -> dict:
    """TRL's prompt-only datasets: standard (``prompt`` text) or conversational (``prompt`` a list of
    ``{role, content}`` messages), every other column kept: the reward functions get them by name,
    as TRL's ``**kwargs`` (``model.scoring.reward_funcs``).

    A TRL dataset names no reward and no gold of lit_rlvr's; ``answer_field`` makes one column the
    row's ``answer`` too (for a registered reward such as ``math``, the gold check and maj@k), and
    ``reward`` names the registered reward of rows scored without ``reward_funcs``. Rows are keyed
    by ``id_field``, else by the dataset's own ``id`` column when it has one (the reward functions
    then get ``id`` as the row's key, ``<name>/<id>``), else by position. A ``reward`` column (or an
    ``answer`` column beside another ``answer_field``) would be hidden by the row's own key: the
    dataset is refused once, saying so.

    Example:
        >>> trl({"prompt": [{"role": "user", "content": "2+2?"}], "solution": "4"}, index=0, name="t", source=Path("t"))
        {'solution': '4', 'id': 't/0', 'prompt': [{'role': 'user', 'content': '2+2?'}]}
        >>> trl({"prompt": "2+2?", "solution": 4}, index=1, name="t", source=Path("t"), answer_field="solution", reward="math")
        {'solution': 4, 'id': 't/1', 'prompt': '2+2?', 'answer': '4', 'reward': 'math'}
    """
    prompt = _prompt(record, "prompt")
    row = _columns(
        record, "prompt", id_field, ("id", "reward") + (("answer",) if answer_field not in (None, "answer") else ())
    )
    row.update(id=_row_id(record, index, name, _key_field(record, id_field)), prompt=prompt)
    if answer_field is not None:
        answer = _field(record, answer_field)
        row["answer"] = answer.strip() if isinstance(answer, str) else normalize_answer(answer)
    if reward is not None:
        row["reward"] = reward
    return row


@ADAPTERS.register("verl")
def verl(
    record: dict,
    *,
    index: int,
    name: str,
    source: Path,
    reward: str | None = "math",
    prompt_key: str = "prompt",
    id_field: str | None = None,
) -> dict:
    """verl's RL rows, as its ``examples/data_preprocess`` scripts write them (GSM8K, MATH, ...):
    ``data_source``, ``prompt`` (messages), ``ability``, ``reward_model: {style, ground_truth}``,
    ``extra_info``.

    The gold is ``reward_model.ground_truth`` (``answer``; numbers as :func:`normalize_answer`
    writes them); every column is kept, so a verl ``compute_score`` in ``model.scoring.reward_funcs``
    gets ``data_source`` and ``extra_info`` as verl gives them (rows are keyed as :func:`trl`'s are).
    ``reward`` is the registered reward
    of rows scored without ``reward_funcs`` (``math``: math-verify on the ground truth, where verl's
    ``default_compute_score`` picks a scorer by ``data_source``); ``prompt_key`` is verl's
    ``data.prompt_key``.

    Example:
        >>> row = verl({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "2+2?"}],
        ...             "ability": "math", "reward_model": {"style": "rule", "ground_truth": "4"},
        ...             "extra_info": {"split": "test", "index": 0}}, index=0, name="gsm8k", source=Path("t"))
        >>> row["id"], row["answer"], row["reward"], row["data_source"], row["prompt"][0]["content"]
        ('gsm8k/0', '4', 'math', 'openai/gsm8k', '2+2?')
    """
    prompt = _prompt(record, prompt_key)
    reward_model = record.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise BadRowError(
            f"verl rows carry the gold in reward_model.ground_truth; got reward_model={reward_model!r:.80}"
        )
    gold = reward_model["ground_truth"]
    if isinstance(gold, str) and not gold.strip():
        raise BadRowError("reward_model.ground_truth is empty")
    row = _columns(record, prompt_key, id_field, ("id", "answer", "reward"))
    row.update(id=_row_id(record, index, name, _key_field(record, id_field)), prompt=prompt)
    row["answer"] = (
        gold.strip() if isinstance(gold, str) else normalize_answer(gold) if isinstance(gold, (int, float)) else gold
    )
    if reward is not None:
        row["reward"] = reward
    return row


@dataclass
class LoadedRows:
    """Rows of one dataset plus the records that failed, for reporting.

    Attributes:
        rows: the prompt rows, in file order.
        bad: one :class:`BadRow` per record that could not become a row.
        total: number of records read (good + bad).
        positions: per row, ``(file or source label, line)`` it came from (for later reports).
        raw_text: the adapter's text prompts go to the tokenizer as they are, as TRL sends its
            standard prompts (:func:`~lit_rlvr.data.prompts.encode_prompt`; the ``trl`` adapter's
            trait).
    """

    rows: list[dict] = field(default_factory=list)
    bad: list[BadRow] = field(default_factory=list)
    total: int = 0
    positions: list[tuple[str, int]] = field(default_factory=list)
    raw_text: bool = False

    def drop(self, problems: list[str | None]) -> None:
        """Move rows with a problem (``problems[i]`` not None) to :attr:`bad`, with their file:line.

        Example:
            >>> out = LoadedRows(rows=[{"id": "a"}, {"id": "b"}], total=2, positions=[("f", 1), ("f", 2)])
            >>> out.drop([None, "malformed gold"])
            >>> [r["id"] for r in out.rows], [str(b) for b in out.bad]
            (['a'], ['f:2: malformed gold'])
        """
        keep = [i for i, p in enumerate(problems) if p is None]
        self.bad += [BadRow(*self.positions[i], p) for i, p in enumerate(problems) if p is not None]
        self.rows = [self.rows[i] for i in keep]
        self.positions = [self.positions[i] for i in keep]

    @property
    def bad_fraction(self) -> float:
        return len(self.bad) / self.total if self.total else 0.0


def _reserved_hint(columns: list[str], options_key: str) -> str:
    """The setting that resolves a hidden column, with its full key, where one does."""
    hints = []
    if "answer" in columns:
        hints.append(f"set {options_key}.answer_field: answer to make that column the gold")
    if "id" in columns:
        hints.append(f"set {options_key}.id_field: id to key the rows by that column")
    return f"; or {'; or '.join(hints)}" if hints else ""


def load_rows(
    source: str | Path | Iterable[str | Path] | HFSource,
    adapter: str,
    name: str | None = None,
    *,
    options_key: str = "options",
    **options,
) -> LoadedRows:
    """Read every record of ``source`` through the named adapter.

    Args:
        source: one path or several (records are numbered across files, in order), or a
            Hugging Face dataset split (:class:`~lit_rlvr.data.readers.HFSource`): its records
            are numbered by position, and the adapters' ``source`` is ``Path(source.path)``.
        adapter: a name in :data:`ADAPTERS`.
        name: dataset name used in row ids (default: the adapter name).
        options_key: the config key of ``options``, for errors (``data.train.options``).
        **options: passed to the adapter (e.g. ``db_root``, ``reward``, ``prompt_field``);
            an option the adapter does not take is a ``ValueError`` before any reading
            (:meth:`lit_rlvr.registry.Registry.get_checked`).

    Returns:
        :class:`LoadedRows`, rows in source order; a duplicate id (ids must be unique to key the
        cache), or a reward name that is not registered in :data:`lit_rlvr.rewards.REWARDS`, makes
        a bad row (found here, before any training step). The same records give the same rows
        whichever source holds them.

    Raises:
        ValueError: a column the rows' own keys would hide (:class:`ReservedColumnError`), once,
            with the file and line where it was met and the setting that resolves it, if any.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "g.jsonl")
        >>> _ = open(p, "w").write('{"question": "q", "answer": "#### 5"}\\n{"question": "q"}\\n')
        >>> out = load_rows(p, "gsm8k")
        >>> [r["id"] for r in out.rows], [b.line for b in out.bad], out.total
        (['gsm8k/0'], [2], 2)
    """
    fn = ADAPTERS.get_checked(adapter, "adapter", options, options_key)
    name = name or adapter
    if isinstance(source, HFSource):
        sources = [(source.label, Path(source.path), read_hf_records(source))]
    else:
        paths = [Path(source)] if isinstance(source, (str, Path)) else [Path(f) for f in source]
        sources = [(str(path), path, read_records(path)) for path in paths]
    out, seen, index = LoadedRows(raw_text=ADAPTERS.trait(adapter, "raw_text", default=False)), set(), 0
    for label, path, records in sources:
        for line, record in records:
            index, out.total = index + 1, out.total + 1
            if isinstance(record, BadRow):
                out.bad.append(record)
                continue
            try:
                row = fn(record, index=index - 1, name=name, source=path, **options)
            except BadRowError as e:
                out.bad.append(BadRow(label, line, str(e)))
                continue
            except ReservedColumnError as e:
                raise ValueError(f"{label}:{line}: {e}{_reserved_hint(e.columns, options_key)}") from None
            if row["id"] in seen:
                out.bad.append(
                    BadRow(
                        label,
                        line,
                        f"duplicate id {row['id']!r} (row ids key the reference cache and the "
                        f"pass counts: {options_key}.id_field names a column with unique values)",
                    )
                )
                continue
            if (
                row.get("reward") is not None and row["reward"] not in REWARDS
            ):  # None: scored by model.scoring.reward_funcs
                out.bad.append(BadRow(label, line, f"unknown reward {row['reward']!r}; valid names: {sorted(REWARDS)}"))
                continue
            seen.add(row["id"])
            out.rows.append(row)
            out.positions.append((label, line))
    return out
