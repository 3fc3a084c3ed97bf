"""Hugging Face ``datasets`` as a data source: same rows, ids, bad-row reports and resumable order as files.

Everything runs offline (``HF_DATASETS_OFFLINE=1``) on datasets built in the test: the ``json`` and
``parquet`` builders, a local dataset folder, ``save_to_disk`` of a ``Dataset`` and a ``DatasetDict``.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from lit_rlvr.data import DatasetSpec, PromptDataModule, PromptFormat, ValSet, load_rows  # noqa: E402
from lit_rlvr.data.readers import HFSource, read_hf_records  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# GSM8K-style records; record 4 has no '#### N' and record 7 no question: both are bad rows
RECORDS = [
    {"question": f"{i} apples and {i + 1} more?", "answer": f"so {2 * i + 1}\n#### {2 * i + 1}"} for i in range(10)
]
RECORDS[3]["answer"] = "no final answer"
RECORDS[6]["question"] = None


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No hub: offline flags (env and the already-imported configs) and a private datasets cache."""
    import huggingface_hub

    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


@pytest.fixture
def sources(tmp_path) -> dict:
    """The same records as a JSONL file and as every kind of Hugging Face source."""
    jsonl = tmp_path / "gsm8k.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    parquet = tmp_path / "gsm8k.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(RECORDS), parquet)
    folder = tmp_path / "folder"  # a local dataset folder with split files
    folder.mkdir()
    (folder / "test.jsonl").write_text(jsonl.read_text())
    (folder / "train.jsonl").write_text(json.dumps(RECORDS[0]) + "\n")
    saved, saved_dict = tmp_path / "saved", tmp_path / "saved_dict"
    datasets.Dataset.from_list(RECORDS).save_to_disk(str(saved))
    datasets.DatasetDict(
        {"test": datasets.Dataset.from_list(RECORDS), "train": datasets.Dataset.from_list(RECORDS[:2])}
    ).save_to_disk(str(saved_dict))
    cache = {"cache_dir": str(tmp_path / "builder_cache")}
    return {
        "jsonl": str(jsonl),
        "json builder": HFSource("json", split="train", kwargs={"data_files": str(jsonl), **cache}),
        "json builder, streaming": HFSource("json", split="train", streaming=True, kwargs={"data_files": str(jsonl)}),
        "parquet builder": HFSource("parquet", split="train", kwargs={"data_files": str(parquet), **cache}),
        "local folder": HFSource(str(folder), split="test", kwargs=cache),
        "save_to_disk": HFSource(str(saved)),
        "save_to_disk dict": HFSource(str(saved_dict), split="test"),
    }


HF_KINDS = [
    "json builder",
    "json builder, streaming",
    "parquet builder",
    "local folder",
    "save_to_disk",
    "save_to_disk dict",
]


@pytest.mark.parametrize("kind", HF_KINDS)
def test_rows_ids_order_and_bad_rows_equal_the_jsonl_path(sources, kind):
    want = load_rows(sources["jsonl"], "gsm8k", name="gsm8k")
    got = load_rows(sources[kind], "gsm8k", name="gsm8k")
    assert [r["id"] for r in want.rows] == [f"gsm8k/{i}" for i in range(10) if i not in (3, 6)]
    assert got.rows == want.rows and got.total == want.total == 10
    # a record's position is its line, and the "file" is the dataset id and split
    assert [(b.file, b.line) for b in got.bad] == [(sources[kind].label, 4), (sources[kind].label, 7)]
    for g, w in zip(got.bad, want.bad):  # the adapters' reasons (HF rows list every column as present)
        assert g.reason.split(" (fields")[0] == w.reason.split(" (fields")[0]
    assert str(got.bad[0]) == f"{sources[kind].label}:4: GSM8K answer has no '#### N' final answer: 'no final answer'"


def test_load_dataset_gets_path_name_split_and_kwargs_and_streams(monkeypatch, sources):
    calls, real = [], datasets.load_dataset

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    source = sources["json builder, streaming"]
    records = read_hf_records(source)
    assert list(itertools.islice(records, 2)) == [(1, RECORDS[0]), (2, RECORDS[1])]
    ((args, kwargs),) = calls
    assert args == ("json", None) and kwargs == {
        "split": "train",
        "streaming": True,
        "data_files": source.kwargs["data_files"],
    }
    assert isinstance(real(*args, **kwargs), datasets.IterableDataset)  # iterated record by record, never materialised
    load_rows(sources["save_to_disk"], "gsm8k")
    assert len(calls) == 1  # a save_to_disk directory is read with load_from_disk, not load_dataset


def test_hf_source_errors_name_the_source(sources, tmp_path):
    with pytest.raises(
        ValueError, match=r"saved_dict/validation: no split 'validation'; the saved splits are \['test', 'train'\]"
    ):
        load_rows(HFSource(sources["save_to_disk dict"].path, split="validation"), "gsm8k")
    with pytest.raises(ValueError, match="save_to_disk directory, which has no configurations; drop name='main'"):
        load_rows(HFSource(sources["save_to_disk"].path, name="main"), "gsm8k")
    with pytest.raises(ConnectionError) as info:  # offline: a hub id cannot be reached
        load_rows(HFSource("openai/gsm8k", "main", "test"), "gsm8k")
    assert "openai/gsm8k[main]/test" in " ".join(info.value.__notes__)


@pytest.mark.parametrize(
    "kwargs,given",
    [({}, "neither"), ({"files": "a.jsonl", "hf": HFSource("openai/gsm8k", "main")}, "both")],
)
def test_exactly_one_of_files_and_hf(kwargs, given):
    with pytest.raises(ValueError, match=rf"dataset 'gsm8k': give exactly one of `files` .* or `hf` .*, got {given}"):
        DatasetSpec(adapter="gsm8k", **kwargs)
    with pytest.raises(ValueError, match="exactly one"):
        ValSet(adapter="gsm8k", n_samples=2, **kwargs)


def _dm(tokenizer_dir, source, val_source=None, **kw) -> PromptDataModule:
    spec = {"hf": source} if isinstance(source, HFSource) else {"files": source}
    val = [
        ValSet(
            adapter="gsm8k",
            name="val",
            n_samples=2,
            **({"hf": val_source} if isinstance(val_source, HFSource) else {"files": val_source}),
        )
    ]
    return PromptDataModule(
        str(tokenizer_dir),
        train=DatasetSpec(adapter="gsm8k", name="gsm8k", **spec),
        val=val,
        batch_size=3,
        prompt=PromptFormat(instruction="Q: {prompt}"),
        max_bad_fraction=0.25,
        **kw,
    )


def _epoch_ids(dm: PromptDataModule, epoch: int) -> list[list[str]]:
    """Row ids of each train batch of ``epoch``, as the DataModule serves them."""
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return [[r["id"] for r in b.rows] for b in loader]


@pytest.mark.parametrize("kind", ["json builder, streaming", "save_to_disk dict"])
def test_datamodule_order_and_resume_state_equal_the_jsonl_path(tiny_model_dir, sources, kind):
    by_file, by_hf = (
        _dm(tiny_model_dir, sources["jsonl"], sources["jsonl"]),
        _dm(tiny_model_dir, sources[kind], sources[kind]),
    )
    for dm in (by_file, by_hf):
        dm.setup("fit")
    assert by_hf.train_rows == by_file.train_rows and by_hf.train_prompt_ids == by_file.train_prompt_ids
    assert [(b.file, b.line) for b in by_hf.bad_rows["gsm8k"]] == [(sources[kind].label, 4), (sources[kind].label, 7)]
    epochs = [_epoch_ids(by_file, e) for e in (0, 1)]
    assert [_epoch_ids(by_hf, e) for e in (0, 1)] == epochs
    assert epochs[0] != epochs[1]  # reshuffled per epoch: the equality is about order, not just content
    by_file.load_state_dict({"epoch": 1, "step": 0, "num_train": 8, "seed": 0})  # as restored from a checkpoint
    by_hf.load_state_dict(by_file.state_dict())  # the file run's checkpoint state resumes the HF run
    assert _epoch_ids(by_hf, 1) == _epoch_ids(by_file, 1) == epochs[1][1:]
    assert [r["id"] for b in by_hf.val_dataloader()[0] for r in b.rows] == [
        f"val/{i}" for i in range(10) if i not in (3, 6)
    ]


def _instantiate_data(config: dict) -> PromptDataModule:
    """The DataModule as the CLI builds it from the parsed ``data:`` section (no setup)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(PromptDataModule, "data")
    data = {
        **config["data"]["init_args"],
        "tokenizer": "Qwen/not-loaded-before-setup",
    }  # linked from model.model by the CLI
    return parser.instantiate(parser.parse_object({"data": data})).data


@pytest.fixture
def no_loading(monkeypatch):
    """Fail on any ``load_dataset``/``load_from_disk`` call; returns the list of attempted calls."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append((args, kwargs))
        raise AssertionError(f"datasets loaded {args} while parsing a config")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    monkeypatch.setattr(datasets, "load_from_disk", refuse)
    return calls


@pytest.mark.parametrize("domain", ["math", "sql"])
def test_shipped_configs_name_hub_datasets_and_parse_without_loading_them(no_loading, domain, print_config):
    config = print_config(
        "fit", "--config", str(CONFIGS / domain / "base.yaml"), "--config", str(CONFIGS / domain / "grpo.yaml")
    )
    hub = {v["name"]: v["hf"] for v in config["data"]["init_args"]["val"] if v["hf"]}
    if domain == "math":
        assert {k: (v["path"], v["name"], v["split"]) for k, v in hub.items()} == {
            "math500": ("HuggingFaceH4/MATH-500", None, "test"),
            "gsm8k": ("openai/gsm8k", "main", "test"),
        }
    else:
        assert {k: (v["path"], v["split"]) for k, v in hub.items()} == {"spider_dev": ("xlangai/spider", "validation")}
    dm = _instantiate_data(config)
    assert [v.hf.path for v in dm.val_specs if v.hf] == [v["path"] for v in hub.values()]
    assert no_loading == []  # parsing and instantiating read nothing: loading happens in setup()


def test_math_config_loads_its_hub_sets_in_setup(monkeypatch, tiny_model_dir, print_config):
    from transformers import AutoTokenizer

    config = print_config(
        "fit", "--config", str(CONFIGS / "math" / "base.yaml"), "--config", str(CONFIGS / "math" / "grpo.yaml")
    )
    dm = _instantiate_data(config)
    dm.val_specs = [v for v in dm.val_specs if v.hf]  # the local aime24 file is not here
    dm.tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    fake = {"HuggingFaceH4/MATH-500": [{"problem": "1+1?", "answer": "2"}], "openai/gsm8k": RECORDS[:2]}
    calls = []

    def load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        return datasets.Dataset.from_list(fake[path])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    dm.setup("validate")
    assert calls == [
        ("HuggingFaceH4/MATH-500", None, {"split": "test", "streaming": False}),
        ("openai/gsm8k", "main", {"split": "test", "streaming": False}),
    ]
    assert [r["id"] for r in dm.val_sets["gsm8k"].rows] == ["gsm8k/0", "gsm8k/1"] and dm.val_sets["math500"].rows[0][
        "answer"
    ] == "2"


def test_giving_both_sources_fails_at_start_up(tiny_model_dir, tmp_path):
    from lit_rlvr.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "C375=026:", "answer": "26", "reward": "countdown"}\n')
    args = [
        "fit",
        f"--model.policy.path={tiny_model_dir}",
        f"--data.train.files={prompts}",
        "--data.train.hf={path: openai/gsm8k}",
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=1",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    with pytest.raises(ValueError, match="give exactly one of `files`.*got both"):
        main(args)
