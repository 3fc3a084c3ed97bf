"""TRL's prompt-only datasets and verl's parquet layout: the same rows, prompts, bad-row reports and
resumable order as the native format, from files and from Hugging Face ``datasets`` (offline)."""

from __future__ import annotations

import json
import re

import pytest

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from lit_rlvr.data import DatasetSpec, PromptDataModule, PromptFormat, encode_prompt, load_rows  # noqa: E402
from lit_rlvr.data.readers import HFSource, read_records  # noqa: E402

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'  # verl's gsm8k.py
NATIVE_FORMAT = PromptFormat(instruction="{prompt} " + INSTRUCTION)

RECORDS = [
    {
        "question": f"Tom has {i} apples and buys {1000 * i + 4} more. How many?",
        "answer": f"{i} + {1000 * i + 4}\n#### {1001 * i + 4:,}",
    }
    for i in range(8)
]


def extract_solution(solution_str: str) -> str:
    """verl's ``examples/data_preprocess/gsm8k.py``: the number after ``####``, commas dropped."""
    solution = re.search("#### (\\-?[0-9\\.\\,]+)", solution_str)
    assert solution is not None
    return solution.group(0).split("#### ")[1].replace(",", "")


def verl_record(example: dict, idx: int, split: str = "test") -> dict:
    """verl's ``make_map_fn(split)(example, idx)`` from ``examples/data_preprocess/gsm8k.py``."""
    question_raw, answer_raw = example["question"], example["answer"]
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question_raw + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_solution(answer_raw)},
        "extra_info": {"split": split, "index": idx, "answer": answer_raw, "question": question_raw},
    }


def trl_records(conversational: bool) -> list[dict]:
    """The same problems as a TRL prompt-only dataset: a prompt and a ``solution`` column."""
    return [
        {
            "prompt": [{"role": "user", "content": r["question"]}] if conversational else r["question"],
            "solution": extract_solution(r["answer"]),
        }
        for r in RECORDS
    ]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


@pytest.fixture
def files(tmp_path) -> dict:
    """The problems in the native GSM8K format, verl's parquet (as a file, a parquet builder and a
    save_to_disk folder), and TRL's standard and conversational formats (JSONL and save_to_disk)."""
    out = {"native": tmp_path / "gsm8k.jsonl"}
    out["native"].write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    verl = [verl_record(r, i) for i, r in enumerate(RECORDS)]
    out["verl"] = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(verl), out["verl"])
    datasets.Dataset.from_list(verl).save_to_disk(str(tmp_path / "verl_saved"))
    out["verl saved"] = HFSource(str(tmp_path / "verl_saved"))
    out["verl builder"] = HFSource(
        "parquet", split="train", kwargs={"data_files": str(out["verl"]), "cache_dir": str(tmp_path / "c")}
    )
    for kind, conversational in (("trl", False), ("trl chat", True)):
        path = tmp_path / f"{kind.replace(' ', '_')}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in trl_records(conversational)))
        out[kind] = path
        datasets.Dataset.from_list(trl_records(conversational)).save_to_disk(str(tmp_path / f"{path.stem}_saved"))
        out[f"{kind} saved"] = HFSource(str(tmp_path / f"{path.stem}_saved"))
    return out


ADAPTER = {"verl": ("verl", {}), "trl": ("trl", {"answer_field": "solution", "reward": "math"})}
KINDS = ["verl", "verl saved", "verl builder", "trl", "trl saved", "trl chat", "trl chat saved"]


def _load(files, kind):
    adapter, options = ADAPTER[kind.split()[0]]
    return load_rows(files[kind], adapter, name="gsm8k", **options)


@pytest.mark.parametrize("kind", KINDS)
def test_rows_equal_the_native_formats(files, kind):
    native = load_rows(files["native"], "gsm8k", name="gsm8k").rows
    rows = _load(files, kind).rows
    assert [r["id"] for r in rows] == [r["id"] for r in native] == [f"gsm8k/{i}" for i in range(8)]
    assert [(r["answer"], r["reward"]) for r in rows] == [(r["answer"], r["reward"]) for r in native]
    assert native[3]["answer"] == "3007"  # "3,007": commas dropped alike
    if kind.startswith("verl"):  # every verl column reaches the rewards (data_source, extra_info for compute_score)
        assert rows[2]["data_source"] == "openai/gsm8k" and rows[2]["extra_info"]["index"] == 2
    else:
        assert rows[2]["solution"] == native[2]["answer"]


@pytest.mark.parametrize("kind", ["verl", "trl chat saved", "trl"])
@pytest.mark.parametrize("model", ["tiny_model_dir", "chat_model_dir"])
def test_prompts_encode_to_the_native_formats_tokens(files, kind, model, request):
    """A conversational row goes through the chat template (or the plain template without one) as
    the native row with the same instruction does: the policy sees the same tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(request.getfixturevalue(model)))
    native = load_rows(files["native"], "gsm8k", name="gsm8k").rows
    # verl's prompt holds the instruction already; TRL's here does not, so it takes the native template
    fmt = PromptFormat() if kind.startswith("verl") else NATIVE_FORMAT
    for row, ref in zip(_load(files, kind).rows, native):
        assert encode_prompt(row, tokenizer, fmt) == encode_prompt(ref, tokenizer, NATIVE_FORMAT)


@pytest.mark.parametrize("kind", ["trl", "trl chat"])
def test_trl_datasets_are_templated_as_trl_templates_them(chat_model_dir, files, kind):
    """TRL sends a standard (text) prompt to the tokenizer as it is (`processing_class(text=prompts)`)
    and templates conversational ones only; the DataModule used to template both with a chat model."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(chat_model_dir))
    spec = DatasetSpec(str(files[kind]), adapter="trl", name="gsm8k", options=ADAPTER["trl"][1])
    dm = PromptDataModule(str(chat_model_dir), train=spec, batch_size=3, gold_check=None)
    dm.setup("fit")
    prompts = [r["prompt"] for r in trl_records(conversational=kind == "trl chat")]
    if kind == "trl":  # GRPOTrainer._tokenize_prompts for standard prompts
        expected = tokenizer(text=prompts)["input_ids"]
    else:  # ... and for conversational ones
        expected = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
    assert dm.train_prompt_ids == [list(ids) for ids in expected]
    templated = PromptDataModule(
        str(chat_model_dir), train=spec, batch_size=3, gold_check=None, prompt=PromptFormat(use_chat_template=True)
    )
    templated.setup("fit")  # a choice of the user's still templates them
    assert templated.train_prompt_ids[0] == encode_prompt(
        {"prompt": prompts[0]}, tokenizer, PromptFormat(use_chat_template=True)
    )


def test_a_system_prompt_for_trls_text_prompts_says_how_to_add_it(chat_model_dir, files):
    spec = DatasetSpec(str(files["trl"]), adapter="trl", name="gsm8k", options=ADAPTER["trl"][1])
    dm = PromptDataModule(
        str(chat_model_dir), train=spec, batch_size=3, gold_check=None, prompt=PromptFormat(system_prompt="Be brief.")
    )
    with pytest.raises(
        ValueError, match="data.prompt.system_prompt with a text prompt of TRL-format data.*use_chat_template to true"
    ):
        dm.setup("fit")


def test_real_gsm8k_through_verls_preprocessing_gives_the_native_answers(shared_data, tmp_path):
    path = shared_data / "gsm8k" / "test.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()[:300]]
    parquet = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist([verl_record(r, i) for i, r in enumerate(records)]), parquet)
    native = load_rows(path, "gsm8k", name="gsm8k").rows[:300]
    rows = load_rows(parquet, "verl", name="gsm8k").rows
    assert [(r["id"], r["answer"]) for r in rows] == [(r["id"], r["answer"]) for r in native] and len(rows) == 300


def test_bad_rows_are_reported_with_file_and_line(tmp_path):
    lines = [
        {"prompt": "fine", "solution": "1"},
        {"solution": "2"},  # no prompt
        {"prompt": [{"role": "user", "content": ["an image"]}], "solution": "3"},  # not text
        {"prompt": [], "solution": "5"},
    ]
    path = tmp_path / "trl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + "{not json\n")
    out = load_rows(path, "trl", name="t")
    assert [r["id"] for r in out.rows] == ["t/0"] and out.total == 5
    assert [b.line for b in out.bad] == [2, 3, 4, 5]
    assert str(out.bad[0]) == f"{path}:2: missing or empty field 'prompt' (fields present: ['solution'])"
    assert "message 1 must have a string 'role' and a string 'content'" in out.bad[1].reason
    assert "non-empty list of messages" in out.bad[2].reason

    verl = [verl_record(r, i) for i, r in enumerate(RECORDS[:4])]
    verl[2]["reward_model"] = {"style": "rule"}  # no ground truth
    parquet = tmp_path / "v.parquet"
    pq.write_table(pa.Table.from_pylist(verl), parquet)
    datasets.Dataset.from_list(verl).save_to_disk(str(tmp_path / "v_saved"))
    for source, label in (
        (str(parquet), str(parquet)),
        (HFSource(str(tmp_path / "v_saved")), f"{tmp_path / 'v_saved'}/train"),
    ):
        out = load_rows(source, "verl", name="v")
        assert [str(b).split(": ")[0] for b in out.bad] == [f"{label}:3"] and len(out.rows) == 3
        assert "reward_model.ground_truth" in out.bad[0].reason


@pytest.mark.parametrize("source", ["file", "hf"])
def test_a_dataset_with_an_id_column_is_keyed_by_it(tmp_path, source):
    """Hub datasets carry `id` columns; every row used to be refused ("would be hidden")."""
    records = [{"id": f"q{i:03d}", "prompt": f"p{i}", "solution": str(i)} for i in (5, 3, 9)]
    if source == "file":
        where = tmp_path / "ids.jsonl"
        where.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "ids_saved"))
        where = HFSource(str(tmp_path / "ids_saved"))
    out = load_rows(where, "trl", name="t", options_key="data.train.options")
    assert [r["id"] for r in out.rows] == ["t/q005", "t/q003", "t/q009"] and not out.bad
    assert out.rows[1]["solution"] == "3"


def test_a_repeated_id_is_a_bad_row_that_names_the_key_to_set(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text(
        "".join(json.dumps({"id": i, "prompt": "p", "uid": f"u{n}"}) + "\n" for n, i in enumerate([1, 2, 1]))
    )
    out = load_rows(path, "trl", name="t", options_key="data.train.options")
    assert [b.line for b in out.bad] == [3]
    assert out.bad[0].reason == (
        "duplicate id 't/1' (row ids key the reference cache and the pass counts: "
        "data.train.options.id_field names a column with unique values)"
    )
    with pytest.raises(
        ValueError,
        match=r"ids.jsonl:1: column\(s\) \['id'\] would be hidden .*; or set data.train.options.id_field: id",
    ):
        load_rows(path, "trl", name="t", options_key="data.train.options", id_field="uid")


@pytest.mark.parametrize(
    ("column", "options", "hint"),
    [
        ("reward", {}, r"rename them in the data$"),
        (
            "answer",
            {"answer_field": "solution"},
            r"; or set data.train.options.answer_field: answer to make that column the gold",
        ),
    ],
)
def test_a_column_the_rows_own_key_would_hide_is_refused_once_for_the_dataset(tmp_path, column, options, hint):
    path = tmp_path / "hidden.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "solution": "1", column: 0.5}) + "\n" for i in range(50)))
    with pytest.raises(
        ValueError, match=rf"hidden.jsonl:1: column\(s\) \['{column}'\] would be hidden by the row's own key.*{hint}"
    ):
        load_rows(path, "trl", name="t", options_key="data.train.options", **options)


def test_unknown_registered_reward_in_options_is_a_bad_row(files):
    out = load_rows(files["trl"], "trl", name="t", reward="maths", answer_field="solution")
    assert not out.rows and "unknown reward 'maths'" in out.bad[0].reason


def _epoch_ids(dm: PromptDataModule, epoch: int) -> list[list[str]]:
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return [[r["id"] for r in b.rows] for b in loader]


@pytest.mark.parametrize("kind", ["verl saved", "trl chat"])
def test_datamodule_order_and_resume_equal_the_native_formats(tiny_model_dir, files, kind):
    adapter, options = ADAPTER[kind.split()[0]]
    spec = {"hf": files[kind]} if isinstance(files[kind], HFSource) else {"files": str(files[kind])}
    native = PromptDataModule(
        str(tiny_model_dir),
        train=DatasetSpec(str(files["native"]), adapter="gsm8k", name="gsm8k"),
        batch_size=3,
        prompt=NATIVE_FORMAT,
    )
    other = PromptDataModule(
        str(tiny_model_dir),
        train=DatasetSpec(adapter=adapter, name="gsm8k", options=options, **spec),
        batch_size=3,
        prompt=PromptFormat() if adapter == "verl" else NATIVE_FORMAT,
    )
    for dm in (native, other):
        dm.setup("fit")
    assert other.train_prompt_ids == native.train_prompt_ids
    epochs = [_epoch_ids(native, e) for e in (0, 1)]
    assert [_epoch_ids(other, e) for e in (0, 1)] == epochs and epochs[0] != epochs[1]
    native.load_state_dict({"epoch": 1, "step": 0, "num_train": 8, "seed": 0})  # as restored from a checkpoint
    other.load_state_dict(native.state_dict())
    assert _epoch_ids(other, 1) == _epoch_ids(native, 1) == epochs[1][1:]


@pytest.mark.parametrize("kind", ["not parquet", "truncated"])
def test_an_unreadable_parquet_file_is_an_error_naming_it(tmp_path, kind):
    """Not pyarrow's bare ``ArrowInvalid`` traceback: the file, and what is wrong with it."""
    path = tmp_path / "train.parquet"
    if kind == "truncated":
        pq.write_table(pa.Table.from_pylist([{"prompt": "p", "answer": "a"}] * 50), path)
        path.write_bytes(path.read_bytes()[:-40])
    else:
        path.write_text('{"prompt": "a JSON line in a .parquet file"}\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: not a readable Parquet file \(Arrow\w+: .+\)$"):
        list(read_records(path))


def test_an_unreadable_json_file_is_an_error_naming_it_and_a_non_utf8_jsonl_line_a_bad_row(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[{"prompt": "p"},')
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(path))}: not a readable JSON file \(Expecting value: line 1"
    ):
        list(read_records(path))
    lines = tmp_path / "train.jsonl"
    lines.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n{"prompt": "b"}\n')
    records = list(read_records(lines))
    assert [(i, r) for i, r in records if isinstance(r, dict)] == [(1, {"prompt": "a"}), (3, {"prompt": "b"})]
    assert str(records[1][1]).startswith(f"{lines}:2: not UTF-8 text: 'utf-8' codec can't decode byte 0xff")


COUNTER_ENV = '''
class Counter:
    """A TRL environment as TRL's docs write one."""

    def reset(self, **row):
        self.count = 0

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: how much to add.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count == 7)
'''


def test_a_trl_environments_tools_are_listed_in_its_prompts_as_trl_lists_them(tool_tokenizer, tmp_path):
    """TRL's GRPOTrainer(environment_factory=...) renders prompts with the environment's bound tools;
    `data.prompt.tools` does the same, and refuses a prompt without a chat template."""
    path = tmp_path / "counter_env.py"
    path.write_text(COUNTER_ENV)
    from lit_rlvr.plugins import load_function

    cls = load_function(f"{path}:Counter", "environment")
    row = {"id": "c", "prompt": "Count to 7."}
    ids = encode_prompt(row, tool_tokenizer, PromptFormat(tools=f"{path}:Counter"))
    trl = tool_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Count to 7."}],
        tools=[cls().increment],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert ids == tool_tokenizer(trl, add_special_tokens=False).input_ids
    assert '"name": "increment"' in trl and ids != encode_prompt(row, tool_tokenizer, PromptFormat())
    with pytest.raises(
        ValueError, match="data.prompt.tools lists .* tools in the chat template, but row 'c' is not rendered with one"
    ):
        encode_prompt(row, tool_tokenizer, PromptFormat(tools=f"{path}:Counter", use_chat_template=False))
    # TRL-format data (the trl adapter): a text prompt goes to the tokenizer as it is, unless tools are
    # listed, which only the chat template shows (TRL would drop them without a word)
    assert encode_prompt(row, tool_tokenizer, PromptFormat(tools=f"{path}:Counter"), raw_text=True) == ids
    assert encode_prompt(row, tool_tokenizer, PromptFormat(), raw_text=True) == tool_tokenizer("Count to 7.").input_ids
    (tmp_path / "empty_env.py").write_text("class Empty:\n    def reset(self, **row):\n        pass\n")
    with pytest.raises(ValueError, match="has no public method besides reset and get_reward"):
        PromptFormat(tools=f"{tmp_path / 'empty_env.py'}:Empty")
