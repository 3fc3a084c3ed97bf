"""HFExport after a real fit: the folder reloads with transformers, pads on the left, and carries a model card."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from lightning import Trainer
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlvr.callbacks import HFExport, RolloutCallback
from lit_rlvr.data import PromptDataModule
from lit_rlvr.data.datamodule import DatasetSpec, ValSet
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import KLOptions, LossOptions, PolicyOptions, SamplingParams, ScoringOptions

pytestmark = pytest.mark.usefixtures("seven_reward")


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def generate_padded(export: Path, prompts: list[str]) -> list[str]:
    """What a user does with the export: tokenize a batch with its tokenizer's padding, generate; the warnings."""
    tok = AutoTokenizer.from_pretrained(export)
    model = AutoModelForCausalLM.from_pretrained(export).eval()
    records = Records()
    logger = logging.getLogger("transformers")  # its records do not propagate to the root logger
    logger.addHandler(records)
    try:
        batch = tok(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            model.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    finally:
        logger.removeHandler(records)
    return records.messages


def fit_and_export(model_dir: Path, prompts: str, export: Path, **module_kwargs) -> Trainer:
    dm = PromptDataModule(
        tokenizer=str(model_dir),
        train=DatasetSpec(files=prompts, name="toy"),
        val=[ValSet(files=prompts, name="toy_val", n_samples=4)],
        batch_size=2,
        seed=0,
    )
    module = RLVRModule(
        PolicyOptions(str(model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=6, seed=0),
        scoring=ScoringOptions(workers=0),
        **module_kwargs,
    )
    trainer = Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
        val_check_interval=2,
        callbacks=[RolloutCallback(engine="hf"), HFExport(str(export))],
    )
    trainer.fit(module, datamodule=dm)
    return trainer


@pytest.mark.timeout(180)
def test_export_pads_left_reloads_and_its_card_has_method_and_final_pass_at_k(chat_model_dir, toy_prompts, tmp_path):
    export = tmp_path / "hf"
    trainer = fit_and_export(
        chat_model_dir,
        toy_prompts(),
        export,
        loss=LossOptions(advantage="passk", advantage_options={"k": 2}),
        kl=KLOptions(coef=0.05),
    )
    tok = AutoTokenizer.from_pretrained(export)
    assert tok.padding_side == "left"
    assert tok.chat_template == AutoTokenizer.from_pretrained(chat_model_dir).chat_template is not None
    messages = generate_padded(export, ["What is 1 + 2?", "What is 12 + 30? Please reason step by step."])
    assert not [m for m in messages if "padding" in m], messages  # no right-padding warning

    card = (export / "README.md").read_text()
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    assert "library_name: transformers" in front and "base_model" not in front  # a local path is not a Hub id
    assert "tags: [lit_rlvr, rlvr, passk]" in front  # no anchor: no DPH-RL
    assert f"Trained from `{chat_model_dir}` for 2 optimizer steps" in body
    assert "| advantage | `passk` {'k': 2} |" in body and "| KL(π_θ‖π_ref) penalty | β = 0.05 (k3) |" in body
    assert "DPH-RL" not in body and "## Config" not in body  # not run through the CLI: no config
    metrics = trainer.callback_metrics
    row = (
        f"| toy_val | {float(metrics['val/toy_val/pass@1']):.3f} | {float(metrics['val/toy_val/pass@2']):.3f} | "
        f"{float(metrics['val/toy_val/pass@4']):.3f} | {float(metrics['val/toy_val/distinct_correct_answers']):.2f} |"
    )
    assert "## Final validation (step 2)\n\n| set | pass@1 | pass@2 | pass@4 | distinct correct answers |" in body
    assert row in body


@pytest.mark.timeout(180)
def test_export_through_the_cli_carries_the_saved_config(tiny_model_dir, tmp_path):
    from lit_rlvr.cli import main

    prompts = tmp_path / "p.jsonl"
    rows = [("375", "26"), ("124", "9"), ("563", "33"), ("218", "10")]  # (digits, target)
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"C{d}={t}:", "answer": t, "reward": "countdown", "digits": d}) + "\n"
            for d, t in rows
        )
    )
    export = tmp_path / "hf"
    main(
        [
            "fit",
            "--imports=[lit_rlvr.demo]",
            f"--model.policy.path={tiny_model_dir}",
            f"--data.train.files={prompts}",
            "--data.train.options={extra_fields: [digits]}",
            "--trainer.accelerator=cpu",
            "--trainer.max_steps=1",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--rollout.init_args.engine=hf",
            "--model.sampling.n=4",
            "--model.sampling.max_new_tokens=4",
            "--model.scoring.workers=0",
            "--model.loss.clip_high=0.3",
            f"--trainer.default_root_dir={tmp_path}",
            f"--export.dirpath={export}",
        ]
    )
    card = (export / "README.md").read_text()
    assert "No validation ran during training." in card
    config = card.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert config == (tmp_path / "config.yaml").read_text()  # what the CLI saved beside the run
    assert f"dirpath: {export}" in config and "clip_high: 0.3" in config
    assert AutoTokenizer.from_pretrained(export).padding_side == "left"
    assert not [m for m in generate_padded(export, ["C375=026:", "C12=3:"]) if "padding" in m]

    # validating the exported folder itself puts the results in its card (it said "No validation ran")
    main(
        [
            "validate",
            "--imports=[lit_rlvr.demo]",
            f"--model.policy.path={export}",
            f"--export.dirpath={export}",
            f"--data.val=[{{files: {prompts}, name: toy_val, n_samples: 2, options: {{extra_fields: [digits]}}}}]",
            "--trainer.accelerator=cpu",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--rollout.init_args.engine=hf",
            "--model.sampling.max_new_tokens=4",
            "--model.scoring.workers=0",
            f"--trainer.default_root_dir={tmp_path}",
            "--verbose=false",
        ]
    )
    after = (export / "README.md").read_text()
    assert "No validation ran" not in after and after.split("## Validation")[0] == card.split("## Final validation")[0]
    assert (
        "## Validation (lit-rlvr validate of this folder)\n\n| set | pass@1 | pass@2 | distinct correct answers |\n"
        in after
    )
    assert "| toy_val | " in after and after.split("## Config", 1)[1] == card.split("## Config", 1)[1]


@pytest.mark.timeout(180)
def test_the_card_names_the_step_of_the_last_validation(tiny_model_dir, toy_prompts, tmp_path):
    """Validated at step 2, trained to step 3: the card's results are step 2's, and say so."""
    dm = PromptDataModule(
        tokenizer=str(tiny_model_dir),
        train=DatasetSpec(files=toy_prompts(12), name="toy"),
        val=[ValSet(files=toy_prompts(4, "val.jsonl"), name="toy_val", n_samples=2)],
        batch_size=2,
        seed=0,
    )
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=2, max_new_tokens=4, seed=0),
        scoring=ScoringOptions(workers=0),
    )
    trainer = Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=2,
        callbacks=[RolloutCallback(engine="hf"), HFExport(str(tmp_path / "hf"))],
    )
    trainer.fit(module, datamodule=dm)
    body = (tmp_path / "hf" / "README.md").read_text()
    assert "for 3 optimizer steps" in body and "## Final validation (step 2)\n" in body
