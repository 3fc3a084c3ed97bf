"""Every shipped config parses against the code's signatures; bad values fail at start-up."""

from __future__ import annotations

import contextlib
import io

import pytest
import yaml

from lit_rlvr.cli import main
from tests.conftest import REPO_ROOT

CONFIGS = REPO_ROOT / "configs"
METHOD_FILES = sorted(
    p
    for domain in ("math", "sql")
    for p in (CONFIGS / domain).glob("*.yaml")
    if p.stem not in ("base", "cache") and not p.stem.startswith("multiturn")
)


# the entropy and diversity methods (docs/methods.md §8) and the metric that shows each one ran
DIVERSITY_METHODS = {
    "clip_cov": "train/selected",
    "kl_cov": "train/selected",
    "forking_tokens": "train/token_mask_kept",
    "entropy_bonus": "train/entropy_coef",
    "entropy_adaptive": "train/entropy_coef",
    "psr": "train/entropy",
    "nsr": "train/entropy",
    "w_reinforce": "train/entropy",
    "unlikeliness": "train/entropy",
    "ucpo": "train/entropy",
}


def test_every_method_has_a_config_in_both_domains():
    names = {
        "grpo",
        "dapo",
        "dr_grpo",
        "rloo",
        "rkl",
        "dph_f",
        "dph_js",
        "dph_alpha",
        "passk",
        "passk_combined",
        "passk_then_pass1",
        "max_rl",
        *DIVERSITY_METHODS,
    }
    for domain in ("math", "sql", "demo"):
        want = names - {"dr_grpo", "rloo", "dph_alpha"} if domain == "demo" else names
        assert want <= {p.stem for p in (CONFIGS / domain).glob("*.yaml")}, domain


@pytest.mark.parametrize("method", METHOD_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_method_config_parses_with_its_base(method, print_config):
    base = method.parent / "base.yaml"
    config = print_config("fit", "--config", str(base), "--config", str(method))
    overlay = yaml.safe_load(method.read_text())
    model, data = config["model"]["init_args"], config["data"]["init_args"]  # model:/data: take subclasses
    assert config["model"]["class_path"] == "lit_rlvr.RLVRModule"  # jsonargparse names the public import path
    for key, value in overlay.get("model", {}).items():  # the overlay's values survive the merge, group by group
        assert (value.items() <= model[key].items()) if isinstance(value, dict) else model[key] == value, key
    # every setting has one owner: the rollouts' sampling is the module's, the tokenizer is linked to its policy
    assert {"engine", "engine_options"} <= set(config["rollout"]["init_args"])
    assert not {"samples_per_prompt", "max_new_tokens", "temperature", "seed"} & set(config["rollout"]["init_args"])
    assert "tokenizer" not in data
    assert model["sampling"]["n"] >= (model["loss"]["advantage_options"] or {}).get("k", 1)
    if model.get("anchor"):
        assert data["cache"]["path"], "a DPH config needs data.cache"


@pytest.mark.parametrize("domain", ["math", "sql"])
def test_cache_config_parses(domain):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["cache", "--config", str(CONFIGS / domain / "cache.yaml"), "--print_config"])
    assert exit_info.value.code in (0, None)
    config = yaml.safe_load(out.getvalue())
    assert config["sampling"]["n"] == 8 and config["data"]["cache"]["path"] == f"runs/{domain}/ref_cache"
    assert "tokenizer" not in config["data"]  # linked to policy.path


@pytest.mark.parametrize("method", ["grpo.yaml", "passk.yaml", "multiturn_dph_f.yaml"])
def test_the_multi_turn_sql_configs_parse_and_the_cache_samples_as_the_run(method, print_config):
    """configs/sql/multiturn*.yaml: an overlay on base.yaml with any method, DPH-F on the multi-turn
    cache, and the cache tool's config, whose environment, prompts and data are the run's."""
    config = print_config(
        "fit",
        "--config",
        str(CONFIGS / "sql" / "base.yaml"),
        "--config",
        str(CONFIGS / "sql" / "multiturn.yaml"),
        "--config",
        str(CONFIGS / "sql" / method),
    )
    model, data = config["model"]["init_args"], config["data"]["init_args"]
    assert model["environment"]["name"] == "sql" and model["environment"]["max_turns"] == 5
    assert model["policy"]["path"] == "Qwen/Qwen2.5-Coder-7B-Instruct" and config["trainer"]["devices"] == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main(["cache", "--config", str(CONFIGS / "sql" / "multiturn_cache.yaml"), "--print_config"])
    assert exit_info.value.code in (0, None)
    cache = yaml.safe_load(out.getvalue())
    assert cache["environment"] == model["environment"] and cache["data"]["prompt"] == data["prompt"]
    assert cache["data"]["train"] == data["train"] and cache["policy"]["path"] == model["policy"]["path"]
    assert {k: v for k, v in cache["batching"].items() if k.startswith("micro")} == {
        k: v for k, v in model["batching"].items() if k.startswith("micro")
    }
    if model.get("anchor"):
        assert data["cache"]["path"] == cache["data"]["cache"]["path"] == "runs/sql_multiturn/ref_cache"


def test_wrong_type_is_reported_with_the_key():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main(
            ["fit", "--config", str(CONFIGS / "math" / "base.yaml"), "--model.loss.clip_low", "wide", "--print_config"]
        )
    assert exit_info.value.code != 0
    assert "clip_low" in err.getvalue()


def tiny_fit_args(tiny_model_dir, tmp_path) -> list[str]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "C375=026:", "answer": "26", "reward": "countdown", "digits": "375"}\n')
    return [
        "fit",
        "--imports=[lit_rlvr.demo]",
        f"--model.policy.path={tiny_model_dir}",
        f"--data.train.files={prompts}",
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=1",
        "--trainer.logger=false",
        "--rollout.init_args.engine=hf",
        "--model.sampling.n=4",
        "--model.sampling.max_new_tokens=4",
        "--model.scoring.workers=0",
        f"--trainer.default_root_dir={tmp_path}",
    ]


def test_unknown_registry_name_fails_at_start_up(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"model.loss.advantage: unknown advantage estimator 'pass@k'; valid names"):
        main([*tiny_fit_args(tiny_model_dir, tmp_path), "--model.loss.advantage=pass@k"])


def test_k_above_samples_per_prompt_fails_at_start_up(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="model.loss.advantage_options.k=8 must be between 1 and model.sampling.n=4"):
        main(
            [
                *tiny_fit_args(tiny_model_dir, tmp_path),
                "--model.loss.advantage=passk",
                "--model.loss.advantage_options={k: 8}",
            ]
        )


def test_a_linked_value_given_twice_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="sets data.tokenizer, which is linked to model.policy.path"):
        main([*tiny_fit_args(tiny_model_dir, tmp_path), f"--data.tokenizer={tiny_model_dir}"])


def test_missing_training_file_fails_at_start_up(tiny_model_dir, tmp_path):
    args = tiny_fit_args(tiny_model_dir, tmp_path)
    args = [a for a in args if not a.startswith("--data.train.files=")] + [
        f"--data.train.files={tmp_path / 'missing.jsonl'}"
    ]
    with pytest.raises(Exception, match="missing.jsonl"):
        main(args)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", sorted(DIVERSITY_METHODS))
def test_one_fit_step_through_each_shipped_demo_config(method, tiny_model_dir, tmp_path):
    """``lit-rlvr fit --config configs/demo/base.yaml --config configs/demo/<method>.yaml`` on the tiny
    model (smaller batches, no validation): the method's settings reach the step, which logs them."""
    import csv

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        '{"id": "a", "prompt": "C375=026:", "answer": "26", "reward": "countdown", "digits": "375"}\n'
        '{"id": "b", "prompt": "C124=009:", "answer": "9", "reward": "countdown", "digits": "124"}\n'
    )
    main(
        [
            "fit",
            "--config",
            str(CONFIGS / "demo" / "base.yaml"),
            "--config",
            str(CONFIGS / "demo" / f"{method}.yaml"),
            f"--model.policy.path={tiny_model_dir}",
            f"--data.train.files={prompts}",
            "--data.val=[]",
            "--data.batch_size=2",
            "--model.sampling.n=4",
            "--model.sampling.max_new_tokens=4",
            "--trainer.max_steps=1",
            "--trainer.log_every_n_steps=1",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--trainer.default_root_dir={tmp_path}",
            f"--export.dirpath={tmp_path / 'hf'}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    rows = list(csv.DictReader((tmp_path / "logs" / method / "metrics.csv").open()))
    logged = {k for row in rows for k, v in row.items() if v}
    assert {DIVERSITY_METHODS[method], "train/entropy", "train/loss"} <= logged
    assert (tmp_path / "hf" / "config.json").is_file()  # the fit ran to its end and exported the policy


def test_conflicting_method_options_fail_at_start_up(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="policy loss 'kl_cov' does not clip, so dual_clip=3.0 would have no effect"):
        main(
            [*tiny_fit_args(tiny_model_dir, tmp_path), "--model.loss.policy_loss=kl_cov", "--model.loss.dual_clip=3.0"]
        )
    with pytest.raises(ValueError, match=r"model.entropy.options: .*entropy_coef_max \(0.1\)"):
        main(
            [
                *tiny_fit_args(tiny_model_dir, tmp_path),
                "--model.entropy.control=adaptive",
                "--model.entropy.options={entropy_coef: 0.5, entropy_coef_max: 0.1}",
            ]
        )
