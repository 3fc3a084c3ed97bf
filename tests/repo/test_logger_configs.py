"""Logs by default: the shipped configs' loggers, W&B one flag away, and a default-logger fit that report draws."""

from __future__ import annotations

import importlib.util
import json

import pytest

from lit_rlvr.cli import main
from tests.conftest import REPO_ROOT

CONFIGS = REPO_ROOT / "configs"
DEMO_METHODS = sorted(
    p.stem
    for p in (CONFIGS / "demo").glob("*.yaml")
    if p.stem not in ("base", "cache", "record", "warmstart", "sql", "sql_cache", "study_sets")
)


@pytest.mark.parametrize("domain", ["math", "sql"])
def test_math_and_sql_configs_log_with_lightnings_default_logger_and_validate_during_fit(domain, print_config):
    trainer = print_config("fit", "--config", str(CONFIGS / domain / "base.yaml"))["trainer"]
    assert trainer["logger"] is True  # TensorBoard when tensorboard/tensorboardX is installed, else CSV
    assert trainer["val_check_interval"] <= trainer["max_steps"] / 5  # enough points for the curves


def test_wandb_is_one_flag_away(print_config):
    trainer = print_config(
        "fit",
        "--config",
        str(CONFIGS / "math" / "base.yaml"),
        "--trainer.logger=WandbLogger",
        "--trainer.logger.project=lit_rlvr",
    )["trainer"]
    assert trainer["logger"]["class_path"] == "lightning.pytorch.loggers.WandbLogger"
    assert trainer["logger"]["init_args"]["project"] == "lit_rlvr"


@pytest.mark.parametrize("method", DEMO_METHODS)
def test_demo_fit_logs_csv_curves_per_method(method, print_config):
    config = print_config(
        "fit", "--config", str(CONFIGS / "demo" / "base.yaml"), "--config", str(CONFIGS / "demo" / f"{method}.yaml")
    )
    trainer = config["trainer"]
    assert trainer["logger"]["class_path"] == "lightning.pytorch.loggers.CSVLogger"
    assert {"save_dir": "artifacts/demo/runs", "name": "logs", "version": method}.items() <= trainer["logger"][
        "init_args"
    ].items()
    assert trainer["val_check_interval"] * 4 == trainer["max_steps"]  # the Makefile's curves: 4 validations per fit
    assert [v["n_samples"] for v in config["data"]["init_args"]["val"]] == [8, 8]


def test_demo_before_after_validation_keeps_32_samples_on_the_same_sets(print_config):
    base = print_config("validate", "--config", str(CONFIGS / "demo" / "base.yaml"))
    record = print_config(
        "validate", "--config", str(CONFIGS / "demo" / "base.yaml"), "--config", str(CONFIGS / "demo" / "record.yaml")
    )
    fit_sets, eval_sets = base["data"]["init_args"]["val"], record["data"]["init_args"]["val"]
    assert [s["n_samples"] for s in eval_sets] == [32, 32]
    assert [s | {"n_samples": 0} for s in eval_sets] == [s | {"n_samples": 0} for s in fit_sets]  # same sets otherwise
    assert record["trainer"]["logger"] is False


@pytest.mark.timeout(180)
def test_a_fit_with_the_default_logger_writes_logs_report_draws(tiny_model_dir, tmp_path):
    from lit_rlvr.tools.report import curve_panels, load_logs

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"C{d}={t}:", "answer": t, "reward": "countdown", "digits": d}) + "\n"
            for d, t in [("375", "26"), ("124", "9"), ("563", "33"), ("218", "10")]
        )
    )
    val = f"[{{files: {prompts}, adapter: jsonl, name: cd_val, n_samples: 4, options: {{extra_fields: [digits]}}}}]"
    main(
        [
            "fit",
            "--imports=[lit_rlvr.demo]",
            f"--model.policy.path={tiny_model_dir}",
            f"--data.train.files={prompts}",
            "--data.train.options={extra_fields: [digits]}",
            f"--data.val={val}",
            "--data.batch_size=2",
            "--trainer.accelerator=cpu",
            "--trainer.max_steps=4",
            "--trainer.logger=true",
            "--trainer.val_check_interval=2",
            "--trainer.log_every_n_steps=1",
            "--trainer.num_sanity_val_steps=0",
            "--trainer.enable_progress_bar=false",
            "--rollout.init_args.engine=hf",
            "--model.sampling.n=4",
            "--model.sampling.max_new_tokens=4",
            "--model.scoring.workers=0",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    run = tmp_path / "lightning_logs" / "version_0"
    tensorboard = any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX"))
    assert (
        bool(list(run.glob("events.out.tfevents.*"))) == tensorboard and (run / "metrics.csv").is_file() != tensorboard
    )
    (series,) = load_logs([tmp_path / "lightning_logs"]).values()
    assert sorted(series["val/cd_val/pass@4"]) == [1, 3] and sorted(series["train/reward"]) == [0, 1, 2, 3]
    training = {panel.title: panel for panel in curve_panels({"run": series})[-1]}  # the training row of the curves
    for title in ("training reward", "mean token entropy", "response length (tokens)"):  # every panel drawn by default
        (line,) = training[title].lines["run"]
        assert sorted(line[1]) == [0, 1, 2, 3], title
