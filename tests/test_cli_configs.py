"""Every shipped config parses against the code's signatures; bad values fail at start-up."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from lit_rlvr.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
METHOD_FILES = sorted(
    p for domain in ("math", "sql") for p in (CONFIGS / domain).glob("*.yaml") if p.stem not in ("base", "cache")
)


def test_every_method_has_a_config_in_both_domains():
    names = {"grpo", "dapo", "dr_grpo", "rloo", "rkl", "dph_f", "dph_js", "dph_alpha", "passk", "passk_combined",
             "passk_then_pass1"}
    for domain in ("math", "sql"):
        assert names <= {p.stem for p in (CONFIGS / domain).glob("*.yaml")}, domain


@pytest.mark.parametrize("method", METHOD_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_method_config_parses_with_its_base(method, print_config):
    base = method.parent / "base.yaml"
    config = print_config("fit", "--config", str(base), "--config", str(method))
    overlay = yaml.safe_load(method.read_text())
    model, data = config["model"]["init_args"], config["data"]["init_args"]  # model:/data: take subclasses
    assert config["model"]["class_path"] == "lit_rlvr.module.RLVRModule"
    for key, value in overlay.get("model", {}).items():  # the overlay's values survive the merge
        assert model[key] == value, key
    # linked values are set from their source at instantiation, so they never appear twice
    assert not {"samples_per_prompt", "max_new_tokens", "temperature"} & set(model)
    assert "tokenizer" not in data
    assert config["rollout"]["init_args"]["samples_per_prompt"] >= (model["advantage_options"] or {}).get("k", 1)
    if model.get("divergence"):
        assert data["cache"], "a DPH config needs data.cache"


@pytest.mark.parametrize("domain", ["math", "sql"])
def test_cache_config_parses(domain):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["cache", "--config", str(CONFIGS / domain / "cache.yaml"), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert yaml.safe_load(out.getvalue())["n"] == 8


def test_wrong_type_is_reported_with_the_key():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "math" / "base.yaml"), "--model.clip_low", "wide", "--print_config"])
    assert exit_info.value.code != 0
    assert "clip_low" in err.getvalue()


def tiny_fit_args(tiny_model_dir, tmp_path) -> list[str]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "C375=026:", "answer": "26", "reward": "countdown", "digits": "375"}\n')
    return ["fit", "--imports=[lit_rlvr.demo]", f"--model.model={tiny_model_dir}", f"--data.train.files={prompts}", "--trainer.accelerator=cpu",
            "--trainer.max_steps=1", "--trainer.logger=false", "--rollout.init_args.engine=hf",
            "--rollout.init_args.samples_per_prompt=4", "--rollout.init_args.max_new_tokens=4",
            f"--trainer.default_root_dir={tmp_path}"]


def test_unknown_registry_name_fails_at_start_up(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"model.advantage: unknown advantage estimator 'pass@k'; valid names"):
        main([*tiny_fit_args(tiny_model_dir, tmp_path), "--model.advantage=pass@k"])


def test_k_above_samples_per_prompt_fails_at_start_up(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="advantage_options.k=8 must be between 1 and samples_per_prompt=4"):
        main([*tiny_fit_args(tiny_model_dir, tmp_path), "--model.advantage=passk", "--model.advantage_options={k: 8}"])


def test_missing_training_file_fails_at_start_up(tiny_model_dir, tmp_path):
    args = tiny_fit_args(tiny_model_dir, tmp_path)
    args = [a for a in args if not a.startswith("--data.train.files=")] + [f"--data.train.files={tmp_path / 'missing.jsonl'}"]
    with pytest.raises(Exception, match="missing.jsonl"):
        main(args)
