"""``lit-rlvr`` as a user meets it first: evaluating a checkpoint fit wrote, config errors, flags that merge."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from lit_rlvr.cli import main


def tiny_config(tmp_path: Path, model_dir: Path, reward: str) -> Path:
    """A demo-like config (train and a validation set, Lightning's default checkpointing) for the tiny model."""
    files = tmp_path / "prompts.jsonl"
    files.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "x", "reward": reward}) + "\n"
                             for i in range(4)))  # fmt: skip
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "max_steps": 1, "logger": False, "enable_progress_bar": False,
                    "enable_model_summary": False, "num_sanity_val_steps": 0, "limit_val_batches": 0,
                    "default_root_dir": str(tmp_path / "run")},
        "model": {"policy": {"path": str(model_dir)}, "sampling": {"n": 2, "max_new_tokens": 4, "seed": 0},
                  "scoring": {"workers": 0}},
        "rollout": {"init_args": {"engine": "hf"}},
        "data": {"train": {"files": str(files), "name": "toy"}, "val": [{"files": str(files), "name": "toy_val", "n_samples": 2}],
                 "batch_size": 2},
    }  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.timeout(240)
def test_validate_a_checkpoint_that_fit_wrote(tiny_model_dir, seven_reward, tmp_path, capsys, caplog):
    """The README's "evaluate a checkpoint": the fit's own configs and its checkpoint (whose prompt
    order, training state, is not the validate run's to restore)."""
    config = tiny_config(tmp_path, tiny_model_dir, seven_reward)
    main(["fit", "--config", str(config)])
    (checkpoint,) = (tmp_path / "run" / "checkpoints").glob("*.ckpt")
    capsys.readouterr()
    with caplog.at_level(logging.INFO):
        main(["validate", "--config", str(config), f"--ckpt_path={checkpoint}", "--trainer.limit_val_batches=1.0"])
    assert f"Loaded model weights from the checkpoint at {checkpoint}" in caplog.text
    table = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["metric", "toy_val"] in table and any(row[:1] == ["pass@2"] for row in table)
