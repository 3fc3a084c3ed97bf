"""PromptDataModule: batch contract, validation sets, reporting, and mid-epoch resume through a real checkpoint."""

from __future__ import annotations

import json
import logging

import lightning.pytorch as pl
import pytest
import torch

from lit_rlvr.contracts import TrainBatch, ValBatch
from lit_rlvr.data import DatasetSpec, PromptDataModule, PromptFormat, ValSet, encode_prompt


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def toy_files(tmp_path):
    train = _write(
        tmp_path / "train.jsonl", [{"prompt": f"{i}+{i}=?", "answer": str(2 * i), "reward": "math"} for i in range(10)]
    )
    val = _write(
        tmp_path / "val.jsonl", [{"prompt": f"{i}*2=?", "answer": str(2 * i), "reward": "math"} for i in range(5)]
    )
    return train, val


def _dm(tiny_model_dir, train, val=None, **kw):
    return PromptDataModule(
        str(tiny_model_dir),
        train=DatasetSpec(train, "jsonl", name="toy"),
        val=[ValSet(val, "jsonl", name="in_domain", n_samples=4), ValSet(val, "jsonl", name="ood", n_samples=2)]
        if val
        else None,
        batch_size=3,
        **kw,
    )


def test_train_and_val_batches_follow_the_contract(tiny_model_dir, toy_files):
    from transformers import AutoTokenizer

    train, val = toy_files
    dm = _dm(tiny_model_dir, train, val, prompt=PromptFormat(instruction="Q: {prompt}", system_prompt="Be brief."))
    dm.setup("fit")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fmt = PromptFormat("Q: {prompt}", "Be brief.")
    batches = list(dm.train_dataloader())
    assert [len(b.rows) for b in batches] == [3, 3, 3, 1]
    seen = []
    for b in batches:
        assert isinstance(b, TrainBatch) and b.anchor is None and b.rollouts is None and b.position is not None
        for row, ids in zip(b.rows, b.prompt_ids):
            assert ids == encode_prompt(row, tok, fmt) and tok.decode(ids) == f"Be brief.\n\nQ: {row['prompt']}\n"
            seen.append(row["id"])
    assert sorted(seen) == sorted(f"toy/{i}" for i in range(10))
    assert dm.val_set_names == ["in_domain", "ood"]
    vals = [list(dl) for dl in dm.val_dataloader()]
    assert [[len(b.rows) for b in v] for v in vals] == [[3, 2], [3, 2]]
    assert all(
        isinstance(b, ValBatch) and b.rollouts is None and len(b.padding) == len(b.rows) for v in vals for b in v
    )
    assert {(b.set_name, b.n_samples) for v in vals for b in v} == {("in_domain", 4), ("ood", 2)}
    assert [r["id"] for b in vals[0] for r in b.rows] == [f"in_domain/{i}" for i in range(5)]
    assert dm.base_pass_counts is None


def test_chat_template_is_used_when_the_tokenizer_has_one(tmp_path, tiny_model_dir, toy_files):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
    tok.save_pretrained(tmp_path / "chat")
    dm = PromptDataModule(
        str(tmp_path / "chat"), train=DatasetSpec(toy_files[0]), prompt=PromptFormat(system_prompt="S"), batch_size=2
    )
    dm.setup("fit")
    b = next(iter(dm.train_dataloader()))
    assert tok.decode(b.prompt_ids[0]) == f"<system>S\n<user>{b.rows[0]['prompt']}\n<a>"
    with pytest.raises(ValueError, match="no chat template"):
        encode_prompt(
            {"prompt": "x"}, AutoTokenizer.from_pretrained(tiny_model_dir), PromptFormat(use_chat_template=True)
        )


def test_long_prompts_and_bad_rows_are_reported_and_skipped(tmp_path, tiny_model_dir, caplog):
    records = [{"prompt": "x" * (5 if i % 4 else 50), "answer": "1", "reward": "math"} for i in range(19)] + [
        {"prompt": "no answer"}
    ]
    path = _write(tmp_path / "d.jsonl", records)
    dm = PromptDataModule(
        str(tiny_model_dir), train=DatasetSpec(path, name="d"), max_prompt_tokens=20, max_bad_fraction=0.1
    )
    with caplog.at_level(logging.WARNING):
        dm.setup("fit")
    assert [str(b) for b in dm.bad_rows["d"]] == [
        f"{path}:20: missing or empty field 'answer' (fields present: ['prompt'])"
    ]
    assert dm.skipped_long["d"] == [f"d/{i} (51 tokens)" for i in range(0, 19, 4)]
    assert len(dm.train_rows) == 19 - 5 and all(len(p) <= 20 for p in dm.train_prompt_ids)
    assert f"{path}:20" in caplog.text and "longer than max_prompt_tokens=20" in caplog.text
    strict = PromptDataModule(str(tiny_model_dir), train=DatasetSpec(path, name="d"), max_bad_fraction=0.01)
    with pytest.raises(ValueError, match=r"d: 1 of 20 rows are bad \(5.0%\), more than max_bad_fraction=1.0%"):
        strict.setup("fit")


class _Recorder(pl.LightningModule):
    """Records the prompt ids of every training batch; crashes at a chosen step to simulate a kill."""

    def __init__(self, crash_at: int | None = None):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.crash_at, self.seen = crash_at, []

    def training_step(self, batch, batch_idx):
        assert batch.position is not None and self.trainer.datamodule._consumed == batch.position  # recorded
        if self.crash_at is not None and self.global_step == self.crash_at:
            raise RuntimeError("simulated crash")
        self.seen.append([r["id"] for r in batch.rows])
        return (self.w * 0).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path, max_epochs, callbacks=()):
    return pl.Trainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        callbacks=list(callbacks),
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("checkpoint_step", [2, 5])
def test_mid_epoch_resume_from_a_lightning_checkpoint_continues_with_the_next_prompt(
    tmp_path, tiny_model_dir, toy_files, checkpoint_step
):
    train = toy_files[0]  # 10 prompts, batch 3 -> 4 steps per epoch
    full = _Recorder()
    _trainer(tmp_path / "full", 2).fit(full, _dm(tiny_model_dir, train))
    assert len(full.seen) == 8

    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=checkpoint_step, save_top_k=-1)
    crashed = _Recorder(crash_at=checkpoint_step + 1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _trainer(tmp_path / "run", 2, [ckpt]).fit(crashed, _dm(tiny_model_dir, train))
    path = next((tmp_path / "ckpt").glob(f"*step={checkpoint_step}.ckpt"))
    assert torch.load(path, weights_only=False)["PromptDataModule"]["step"] == (checkpoint_step - 1) % 4

    resumed = _Recorder()
    _trainer(tmp_path / "run", 2).fit(resumed, _dm(tiny_model_dir, train), ckpt_path=path)
    assert crashed.seen[:checkpoint_step] + resumed.seen == full.seen


def test_resume_with_other_data_is_refused(tiny_model_dir, toy_files):
    dm = _dm(tiny_model_dir, toy_files[0])
    dm.setup("fit")
    with pytest.raises(ValueError, match="checkpoint was taken with 7 training prompts and seed 0, this run has 10"):
        dm.load_state_dict({"epoch": 0, "step": 1, "num_train": 7, "seed": 0})
