"""``lit-rlvr`` as a user meets it first: evaluating a checkpoint fit wrote, config errors, flags that merge."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import yaml

from lit_rlvr.cli import ConfigError, main


def tiny_config(tmp_path: Path, model_dir: Path, reward: str) -> Path:
    """A demo-like config (train and a validation set, Lightning's default checkpointing) for the tiny model."""
    files = tmp_path / "prompts.jsonl"
    files.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "x", "reward": reward}) + "\n"
            for i in range(4)
        )
    )
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "max_steps": 1,
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            "default_root_dir": str(tmp_path / "run"),
        },
        "model": {
            "policy": {"path": str(model_dir)},
            "sampling": {"n": 2, "max_new_tokens": 4, "seed": 0},
            "scoring": {"workers": 0},
        },
        "rollout": {"init_args": {"engine": "hf"}},
        "data": {
            "train": {"files": str(files), "name": "toy"},
            "val": [{"files": str(files), "name": "toy_val", "n_samples": 2}],
            "batch_size": 2,
        },
    }
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
    values = {row[0]: float(row[1]) for row in table if row[0].startswith("pass")}
    assert values["pass^1"] == values["pass@1"] and values["pass^2"] <= values["pass@1"] <= values["pass@2"]


CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ERRORS = {
    "a value of the wrong type (the parser)": (
        "--model.sampling.n=abc",
        "model.sampling.n: Expected a <class 'int'>. Got value: abc",
    ),
    "an option group's check": (
        "--model.dynamic_sampling={max_batches_per_step: 0}",
        "model.dynamic_sampling.max_batches_per_step must be an integer > 0, got 0",
    ),
    "the module's check": (
        "--model.sampling.n=1",
        "model.sampling.n=1: advantage 'grpo' compares the samples of a prompt "
        "with each other and needs model.sampling.n >= 2 (with fewer, every advantage is 0 and the policy never learns)",
    ),
}


@pytest.mark.parametrize("flag, message", ERRORS.values(), ids=ERRORS)
def test_a_config_error_is_lit_rlvrs_own_message_once_at_the_end(flag, message, tiny_model_dir, monkeypatch, capsys):
    """On the command line: two lines, the message and where the options are, instead of jsonargparse's
    60-110 lines of usage or traceback ending in a dump of the whole namespace; exit status 2."""
    args = [
        "fit",
        "--config",
        str(CONFIGS / "demo" / "base.yaml"),
        "--config",
        str(CONFIGS / "demo" / "grpo.yaml"),
        f"--model.policy.path={tiny_model_dir}",
        flag,
    ]
    monkeypatch.setattr(sys, "argv", ["lit-rlvr", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.splitlines()[-2:] == [
        f"lit-rlvr fit: error: {message}",
        "(every option: lit-rlvr fit --help, and docs/configuration.md)",
    ]
    assert err.count(message) == 1 and not any(s in err for s in ("Traceback", "Namespace(", "usage:", "Subtypes:")), (
        err
    )
    if "abc" not in flag:  # from Python (no parser error): the exception, with the same message
        with pytest.raises(ConfigError) as raised:
            main(args)
        assert str(raised.value) == message


def _refuse_the_cache(*args, **kwargs):
    from lit_rlvr.cache.format import CacheMismatchError

    raise CacheMismatchError("reference cache /c does not match this run:\n  environment: countdown@1 != sql@1")


STARTUP_ERRORS = {
    "a data option a config sets and the adapter does not take": (
        ["--data.train.options={extra_feilds: [digits]}"],
        None,
        "(to remove an option a config sets: --data.train.options.extra_feilds=null)",
    ),
    "a reference cache that is not there": (
        ["--data.cache.path=/nonexistent/lit_rlvr_cache"],
        None,
        "(manifest.json missing); build one with `lit-rlvr cache`",
    ),
    "a reference cache built for another environment": (
        [],
        _refuse_the_cache,
        "  environment: countdown@1 != sql@1",
    ),
}


@pytest.mark.parametrize("flags, check, last", STARTUP_ERRORS.values(), ids=STARTUP_ERRORS)
def test_a_run_refused_at_set_up_ends_like_a_config_error(
    flags, check, last, tiny_model_dir, tmp_path, seven_reward, monkeypatch, capsys
):
    """The data or the reference cache refused once the run is set up: lit_rlvr's few lines and exit 2,
    as a refused setting, not exit 1 and a traceback."""
    import lit_rlvr.module

    if check is not None:
        monkeypatch.setattr(lit_rlvr.module, "check_prompt_data", check)
    args = ["fit", "--config", str(tiny_config(tmp_path, tiny_model_dir, seven_reward)), *flags]
    monkeypatch.setattr(sys, "argv", ["lit-rlvr", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    assert "lit-rlvr fit: error: " in err and err.splitlines()[-2].endswith(last), err
    assert err.splitlines()[-1] == "(every option: lit-rlvr fit --help, and docs/configuration.md)"
    from lit_rlvr.contracts import StartupError

    with pytest.raises(StartupError):  # from Python: the exception
        main(args)


def engine_options(print_config, *flags: str) -> dict:
    config = print_config(
        "fit", "--config", str(CONFIGS / "math" / "base.yaml"), "--config", str(CONFIGS / "math" / "grpo.yaml"), *flags
    )
    return config["rollout"]["init_args"]["engine_options"]


def test_a_dict_on_the_command_line_merges_into_the_configs_like_its_dotted_keys(print_config):
    """``--rollout.init_args.engine_options='{…}'`` replaced the base config's dict (and dropped its
    gpu_memory_utilization) while ``--rollout.init_args.engine_options.KEY=…`` merged: both merge now,
    ``KEY: null`` removes a key (the engine's default applies; it was the string 'None'), ``{}`` empties."""
    base = {"gpu_memory_utilization": 0.35, "max_model_len": 3072, "enable_sleep_mode": True}
    assert engine_options(print_config) == base
    merged = {**base, "kv_cache_memory_bytes": 5}
    assert engine_options(print_config, "--rollout.init_args.engine_options={kv_cache_memory_bytes: 5}") == merged
    assert engine_options(print_config, "--rollout.init_args.engine_options.kv_cache_memory_bytes=5") == merged
    assert engine_options(print_config, "--rollout.engine_options={kv_cache_memory_bytes: 5}") == merged
    without = {"gpu_memory_utilization": 0.35, "enable_sleep_mode": True}
    assert engine_options(print_config, "--rollout.init_args.engine_options.max_model_len=null") == without
    assert engine_options(print_config, "--rollout.init_args.engine_options", "null") is None
    nested = "--rollout.init_args.engine_options={server_env: {VLLM_LOGGING_LEVEL: DEBUG}, enable_sleep_mode: null}"
    assert engine_options(print_config, nested) == {
        "gpu_memory_utilization": 0.35,
        "max_model_len": 3072,
        "server_env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
    }
    assert engine_options(print_config, "--rollout.init_args.engine_options.server_env.X=null") == {
        **base,
        "server_env": {},
    }
    assert engine_options(print_config, "--rollout.init_args.engine_options={}") == {}
    config = print_config(
        "fit",
        "--config",
        str(CONFIGS / "math" / "base.yaml"),
        "--config",
        str(CONFIGS / "math" / "passk.yaml"),
        "--model.loss.advantage_options={k: 8}",
        "--model.loss={dual_clip: 3.0}",
    )
    assert (
        config["model"]["init_args"]["loss"]["advantage_options"] == {"k": 8}
        and config["model"]["init_args"]["loss"]["dual_clip"] == 3.0
    )
