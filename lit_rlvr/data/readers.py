"""Reading raw records from JSONL, JSON and Parquet files, each with its position for error reports.

A *record* is the file's own dict (e.g. GSM8K's ``{"question", "answer"}``); dataset adapters
(:mod:`lit_rlvr.data.adapters`) turn records into prompt rows. Every record comes with a 1-based
``line``: the line number in a JSONL file, the item number in a JSON array or a Parquet table, so
a bad row can be reported as ``file:line``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class BadRow:
    """A record that could not become a prompt row, and why.

    Attributes:
        file: the file it came from.
        line: 1-based line (JSONL) or item number (JSON array, Parquet).
        reason: what was wrong.
    """

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


def read_records(path: str | Path) -> Iterator[tuple[int, dict | BadRow]]:
    """Yield ``(line, record)`` for every record of a JSONL, JSON (array) or Parquet file.

    A JSONL line that is not a JSON object is yielded as a :class:`BadRow` instead of raising, so
    one broken line does not stop a run; blank lines are skipped.

    Args:
        path: a ``.jsonl``, ``.json`` (a list of objects) or ``.parquet`` file.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "d.jsonl")
        >>> _ = open(p, "w").write('{"q": 1}\\n\\nnot json\\n')
        >>> [(line, r if isinstance(r, dict) else r.reason[:18]) for line, r in read_records(p)]
        [(1, {'q': 1}), (3, 'invalid JSON line:')]
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from _read_jsonl(path)
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json data file must hold a list of objects, got {type(data).__name__}")
        for i, record in enumerate(data, start=1):
            yield i, record if isinstance(record, dict) else BadRow(str(path), i, f"not an object: {record!r:.80}")
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, record in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield i, record
    else:
        raise ValueError(f"{path}: unsupported data file type {suffix!r}; accepted: {list(SUFFIXES)}")


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict | BadRow]]:
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                yield i, BadRow(str(path), i, f"invalid JSON line: {e}")
                continue
            yield i, record if isinstance(record, dict) else BadRow(str(path), i, f"not an object: {record!r:.80}")
