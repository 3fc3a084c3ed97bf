"""Reading raw records from files or Hugging Face datasets, each with its position for error reports.

A *record* is the source's own dict (e.g. GSM8K's ``{"question", "answer"}``); dataset adapters
(:mod:`lit_rlvr.data.adapters`) turn records into prompt rows. Every record comes with a 1-based
``line``: the line number in a JSONL file, the item number in a JSON array, a Parquet table or a
Hugging Face dataset split, so a bad row can be reported as ``file:line`` (for a Hugging Face
dataset the "file" is :attr:`HFSource.label`, e.g. ``openai/gsm8k[main]/train``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class BadRow:
    """A record that could not become a prompt row, and why.

    Attributes:
        file: the file it came from, or a Hugging Face split's :attr:`HFSource.label`.
        line: 1-based line (JSONL) or item number (JSON array, Parquet, Hugging Face split).
        reason: what was wrong.
    """

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


def read_records(path: str | Path) -> Iterator[tuple[int, dict | BadRow]]:
    """Yield ``(line, record)`` for every record of a JSONL, JSON (array) or Parquet file.

    A JSONL line that is not a JSON object (or not UTF-8) is yielded as a :class:`BadRow` instead
    of raising, so one broken line does not stop a run; blank lines are skipped. A ``.json`` or
    ``.parquet`` file that cannot be read at all raises ``ValueError`` naming the file.

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
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(
                f"{path}: not a readable JSON file ({err}); a .json data file holds a list of objects"
            ) from err
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json data file must hold a list of objects, got {type(data).__name__}")
        for i, record in enumerate(data, start=1):
            yield i, record if isinstance(record, dict) else BadRow(str(path), i, f"not an object: {record!r:.80}")
    elif suffix == ".parquet":
        import pyarrow
        import pyarrow.parquet as pq

        try:
            records = pq.read_table(path).to_pylist()
        except (pyarrow.ArrowException, OSError) as err:  # not Parquet, truncated, damaged
            raise ValueError(f"{path}: not a readable Parquet file ({type(err).__name__}: {err})") from err
        yield from enumerate(records, start=1)
    else:
        raise ValueError(f"{path}: unsupported data file type {suffix!r}; accepted: {list(SUFFIXES)}")


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict | BadRow]]:
    with path.open("rb") as f:
        for i, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield i, BadRow(str(path), i, f"not UTF-8 text: {e}")
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                yield i, BadRow(str(path), i, f"invalid JSON line: {e}")
                continue
            yield i, record if isinstance(record, dict) else BadRow(str(path), i, f"not an object: {record!r:.80}")


@dataclass
class HFSource:
    """A Hugging Face ``datasets`` split: ``load_dataset(path, name, split=split, **kwargs)``.

    ``path`` is a Hub id (``openai/gsm8k``), a local dataset folder, or a builder name with
    ``kwargs: {data_files: ...}`` (``json``, ``parquet``, ``csv``). A directory written by
    ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` is read with ``load_from_disk``
    instead (``split`` picks the split of a saved ``DatasetDict``). Nothing is loaded until the
    records are read (the DataModule's ``setup``), so parsing a config never downloads.

    Args:
        path: Hub id, local folder, builder name, or a ``save_to_disk`` directory.
        name: the dataset configuration (``load_dataset``'s ``name``, e.g. ``"main"`` for GSM8K).
        split: the split to read (slices such as ``"train[:1000]"`` work when not streaming).
        streaming: iterate an ``IterableDataset`` record by record instead of downloading and
            converting the whole dataset first (large sets); the rows are still materialised,
            the raw dataset never is. No effect on a ``save_to_disk`` directory (memory-mapped).
        kwargs: any other ``load_dataset`` argument (``data_files``, ``revision``, ``cache_dir``,
            ...), or ``load_from_disk``'s (``keep_in_memory``, ``storage_options``).
    """

    path: str
    name: str | None = None
    split: str = "train"
    streaming: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How bad rows name this source: ``path[name]/split``.

        Example:
            >>> HFSource("openai/gsm8k", "main", "test").label, HFSource("data/saved").label
            ('openai/gsm8k[main]/test', 'data/saved/train')
        """
        return f"{self.path}{f'[{self.name}]' if self.name else ''}/{self.split}"

    @property
    def saved_to_disk(self) -> bool:
        """Whether ``path`` is a ``save_to_disk`` directory (a ``Dataset``'s or a ``DatasetDict``'s)."""
        folder = Path(self.path)
        return (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()


def read_hf_records(source: HFSource) -> Iterator[tuple[int, dict]]:
    """Yield ``(position, record)`` for every record of a Hugging Face dataset split, 1-based.

    Example:
        >>> import tempfile
        >>> from datasets import Dataset
        >>> path = tempfile.mkdtemp()
        >>> Dataset.from_list([{"q": "a"}, {"q": "b"}]).save_to_disk(path)
        >>> list(read_hf_records(HFSource(path)))
        [(1, {'q': 'a'}), (2, {'q': 'b'})]
    """
    yield from enumerate(_open_hf(source), start=1)


def _open_hf(source: HFSource):
    """The ``Dataset`` or ``IterableDataset`` of one split, with errors that name the source."""
    try:
        import datasets
    except ImportError as err:
        raise ImportError(f"data source {source.label}: Hugging Face datasets need `pip install datasets`") from err
    if source.saved_to_disk:
        if source.name is not None:
            raise ValueError(
                f"data source {source.label}: {source.path!r} is a save_to_disk directory, which has no "
                f"configurations; drop name={source.name!r}"
            )
        saved = datasets.load_from_disk(source.path, **source.kwargs)
        if isinstance(saved, datasets.DatasetDict):
            if source.split not in saved:
                raise ValueError(
                    f"data source {source.label}: no split {source.split!r}; the saved splits are {sorted(saved)}"
                )
            return saved[source.split]
        return saved
    try:
        return datasets.load_dataset(
            source.path, source.name, split=source.split, streaming=source.streaming, **source.kwargs
        )
    except Exception as err:  # unknown id, offline, bad split or data files: say which source, keep the error
        err.add_note(f"lit_rlvr: while loading the data source {source.label} with datasets.load_dataset")
        raise
