"""docs/migration.md cannot rot: every lit_rlvr key of its tables parses, no TRL GRPOConfig field is
missing, and the worked examples (a TRL script, a verl run, and their lit-rlvr configs) are
checked against the tables and train for a few steps from YAML, their reward functions unchanged."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT

ROOT = REPO_ROOT
DOC = ROOT / "docs" / "migration.md"
SECTIONS = ("trainer.", "model.", "data.", "rollout.", "export.", "pass_counts.", "seed_everything", "ckpt_path")


def table(marker: str, min_rows: int = 40) -> dict[str, tuple[list[str], str]]:
    """``{their key: ([lit_rlvr keys], notes)}`` of the table after ``<!-- marker -->`` (more than ``min_rows`` rows)."""
    text = DOC.read_text().split(f"<!-- {marker} -->\n", 1)[1]
    rows = {}
    for line in text.splitlines()[2:]:
        if not line.startswith("|"):
            break
        theirs, ours, notes = (cell.strip() for cell in line.strip("|").split("|", 2))
        name = theirs.strip("`")
        assert name not in rows, f"{name} is in the {marker} twice"
        keys = re.findall(r"`([^`]+)`", ours)
        assert keys or ours == "none", f"{name}: the lit_rlvr column is keys in backticks or 'none', got {ours!r}"
        assert keys or notes, f"{name}: 'none' needs its reason"
        rows[name] = (keys, notes)
    assert len(rows) > min_rows
    return rows


def print_config(*args: str) -> dict:
    from lit_rlvr.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main([*args, "--print_config"])
    assert exit_info.value.code in (0, None), err.getvalue()[-3000:]
    return yaml.safe_load(out.getvalue())


def lookup(config: dict, key: str):
    """The value at a YAML key as the tables write it (``model.sampling.n``, ``data.val[i].n_samples``),
    descending into ``init_args`` of the class sections; KeyError if the config has no such key."""
    node = config
    for part in key.split("."):
        name, index = (part[:-3], 0) if part.endswith("[i]") else (part, None)
        if isinstance(node, dict) and name not in node and "init_args" in node:
            node = node["init_args"]
        if not isinstance(node, dict) or name not in node:
            raise KeyError(key)
        node = node[name] if index is None else node[name][index]
    return node


# every option group switched on, so that each key of every group is printed
ON = [
    "--model.kl.coef=0.1",
    "--model.anchor.coef=1.0",
    "--data.cache.path=x",
    "--model.policy.lora.r=16",
    "--model.rollout_correction.mode=token_truncate",
    "--data.train.files=null",
    "--data.train.hf.path=openai/gsm8k",
    "--model.entropy.control=static",
    "--model.entropy.options={entropy_coef: 0.01}",
    "--model.environment.name=countdown",
]


def test_every_lit_rlvr_key_of_the_tables_parses():
    """Each key is in the printed config, and set to that value on the command line it parses again."""
    config = print_config("fit", "--config", str(ROOT / "configs/demo/base.yaml"), *ON)
    tables = [table("trl-table"), table("verl-table"), table("skyrl-table", min_rows=8)]
    keys = sorted({k for rows in tables for keys, _ in rows.values() for k in keys})
    assert {"model.scoring.reward_funcs", "model.scoring.reward_weights", "data.val[i].n_samples"} <= set(keys)
    flags = []
    for key in keys:
        assert key.startswith(SECTIONS), f"{key}: not a key of a lit-rlvr fit config"
        try:
            value = lookup(config, key)
        except KeyError:
            pytest.fail(f"docs/migration.md names {key}, which `lit-rlvr fit --print_config` does not have")
        scalar = (
            value is None or isinstance(value, (str, int, float, bool)) or (isinstance(value, list) and len(value) < 4)
        )
        if scalar and "[i]" not in key and "\n" not in str(value):
            flags.append(
                f"--{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
            )
    assert len(flags) > 40
    print_config("fit", "--config", str(ROOT / "configs/demo/base.yaml"), *ON, *flags)


def test_every_grpo_config_field_of_trl_is_in_the_table():
    trl = pytest.importorskip("trl")
    import dataclasses

    from transformers import TrainingArguments

    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {
        f.name
        for f in dataclasses.fields(trl.GRPOConfig)
        if f.name not in inherited or f.name in trl.GRPOConfig.__annotations__
    }
    missing = sorted(own - set(table("trl-table")))
    assert not missing, f"GRPOConfig fields missing from docs/migration.md: {missing}"
    assert {"reward_weights", "num_generations", "beta", "loss_type", "learning_rate"} <= own


def _value(node: ast.expr):
    """A keyword argument's value: the literal, or its source text (a name, a list of names)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def test_the_trl_script_sets_only_fields_of_the_table_and_the_config_agrees():
    tree = ast.parse((ROOT / "examples/trl_grpo/train_grpo.py").read_text())
    calls = {
        node.func.id: {k.arg: _value(k.value) for k in node.keywords}
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    args, trainer = calls["GRPOConfig"], calls["GRPOTrainer"]
    rows = table("trl-table")
    assert not sorted(set(args) - set(rows)), "a GRPOConfig field of the script is not in the table"
    assert not sorted(f"GRPOTrainer({k}=)" for k in trainer if f"GRPOTrainer({k}=)" not in rows)
    config = print_config("fit", "--config", str(ROOT / "configs/migrate/trl_grpo.yaml"))
    model = config["model"]["init_args"]
    same = {  # the script's value, the config's (key by key, as the table maps them)
        "num_generations": model["sampling"]["n"],
        "max_completion_length": model["sampling"]["max_new_tokens"],
        "temperature": model["sampling"]["temperature"],
        "epsilon": model["loss"]["clip_low"],
        "epsilon_high": model["loss"]["clip_high"],
        "reward_weights": model["scoring"]["reward_weights"],
        "learning_rate": model["optimizer"]["init_args"]["lr"],
        "max_steps": config["trainer"]["max_steps"],
        "max_grad_norm": model["max_grad_norm"],
        "per_device_train_batch_size": model["batching"]["micro_batch_size"],
        "seed": config["seed_everything"],
        "logging_steps": config["trainer"]["log_every_n_steps"],
        "vllm_gpu_memory_utilization": config["rollout"]["init_args"]["engine_options"]["gpu_memory_utilization"],
    }
    assert {k: args[k] for k in same} == same
    per_step = args["per_device_train_batch_size"] * args["gradient_accumulation_steps"]
    assert (
        per_step == config["data"]["init_args"]["batch_size"] * model["sampling"]["n"]
    )  # completions per optimizer step
    assert model["loss"]["aggregation"] == "token_mean" and args["loss_type"] == "dapo"
    funcs = [f.rsplit(":", 1)[1] for f in model["scoring"]["reward_funcs"]]
    assert trainer["reward_funcs"] == f"[{', '.join(funcs)}]" and trainer["model"] == model["policy"]["path"]


def verl_script_settings() -> dict[str, str]:
    """``{key: value}`` of the ``key=value`` arguments of the verl example's ``main_ppo`` command."""
    text = (ROOT / "examples/verl_gsm8k/run_grpo_gsm8k.sh").read_text()
    command = text.split("python3 -m verl.trainer.main_ppo", 1)[1].replace("\\\n", " ")
    settings = dict(arg.split("=", 1) for arg in shlex.split(command.split('"$@"')[0]))
    assert len(settings) > 30
    return settings


def _number(text: str):
    """A command-line value as Hydra reads it (``1e-6`` is a float, unlike in YAML 1.1)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def test_the_verl_script_sets_only_keys_of_the_table_and_the_config_agrees():
    settings, rows = verl_script_settings(), table("verl-table")
    missing = sorted(set(settings) - set(rows))
    assert not missing, f"keys of the verl example missing from docs/migration.md: {missing}"
    config = print_config("fit", "--config", str(ROOT / "configs/migrate/verl_gsm8k.yaml"))
    model, data = config["model"]["init_args"], config["data"]["init_args"]
    n = int(settings["actor_rollout_ref.rollout.n"])
    same = {
        "actor_rollout_ref.rollout.n": model["sampling"]["n"],
        "data.train_batch_size": data["batch_size"],
        "data.max_prompt_length": data["max_prompt_tokens"],
        "data.max_response_length": model["sampling"]["max_new_tokens"],
        "actor_rollout_ref.actor.optim.lr": model["optimizer"]["init_args"]["lr"],
        "actor_rollout_ref.actor.kl_loss_coef": model["kl"]["coef"],
        "actor_rollout_ref.actor.clip_ratio_low": model["loss"]["clip_low"],
        "actor_rollout_ref.actor.clip_ratio_high": model["loss"]["clip_high"],
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": model["batching"]["micro_batch_size"],
        "actor_rollout_ref.rollout.gpu_memory_utilization": config["rollout"]["init_args"]["engine_options"][
            "gpu_memory_utilization"
        ],
        "trainer.total_epochs": config["trainer"]["max_epochs"],
        "trainer.test_freq": config["trainer"]["val_check_interval"],
        "actor_rollout_ref.model.path": model["policy"]["path"],
        "data.train_files": data["train"]["files"],
        "actor_rollout_ref.rollout.val_kwargs.temperature": model["evaluation"]["temperature"],
    }
    assert {k: _number(settings[k]) for k in same} == same
    assert model["batching"]["mini_batch_size"] == int(settings["actor_rollout_ref.actor.ppo_mini_batch_size"]) * n
    reward = f"{settings['reward.custom_reward_function.path']}:{settings['reward.custom_reward_function.name']}"
    assert model["scoring"]["reward_funcs"] == [reward] and model["kl"]["value_cap"] == 10.0


# ---------------------------------------------------------------------------- the examples train
def _fit(config_file: str, overrides: dict, tmp_path: Path, monkeypatch) -> object:
    """``lit-rlvr fit --config <config_file>`` with ``overrides`` merged in (a second config file), from
    the repository root as the docs say; returns the module after training."""
    from lit_rlvr.cli import main

    monkeypatch.chdir(ROOT)  # the configs name the reward files relative to the repository root
    path = tmp_path / "overrides.yaml"
    path.write_text(yaml.safe_dump(overrides))
    seen = {}
    import lit_rlvr.callbacks.rollout as rollout_module

    original = rollout_module.RolloutCallback.on_fit_start

    def spy(self, trainer, pl_module):
        seen["module"] = pl_module
        return original(self, trainer, pl_module)

    monkeypatch.setattr(rollout_module.RolloutCallback, "on_fit_start", spy)
    main(["fit", "--config", config_file, "--config", str(path)])
    return seen["module"]


def _cpu_trainer(tmp_path: Path, **extra) -> dict:
    return {
        "accelerator": "cpu",
        "devices": 1,
        "precision": "32-true",
        "max_steps": 2,
        "logger": False,
        "callbacks": [],
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "default_root_dir": str(tmp_path / "run"),
        **extra,
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_trl_example_config_trains_with_trls_reward_functions_in_workers(chat_model_dir, tmp_path, monkeypatch):
    """configs/migrate/trl_grpo.yaml on a tiny chat model: TRL's conversational rows, its reward
    module unchanged in 1 worker process, each reward logged and the sum their weighted means."""
    prompts = tmp_path / "deepmath.jsonl"  # DeepMath-103K's layout: conversational prompt + solution
    prompts.write_text(
        "".join(
            json.dumps({"prompt": [{"role": "user", "content": f"What is {a} + {a}?"}], "solution": str(2 * a)}) + "\n"
            for a in range(6)
        )
    )
    overrides = {
        "trainer": _cpu_trainer(tmp_path),
        "model": {
            "policy": {"path": str(chat_model_dir), "dtype": "float32", "gradient_checkpointing": False},
            "sampling": {"n": 4, "max_new_tokens": 6, "seed": 0},
            "batching": {"micro_batch_size": 4},
            "scoring": {"workers": 1},
        },
        "rollout": {"init_args": {"engine": "hf", "engine_options": None}},
        "data": {"train": {"hf": None, "files": str(prompts)}, "batch_size": 2},
    }
    module = _fit(str(ROOT / "configs/migrate/trl_grpo.yaml"), overrides, tmp_path, monkeypatch)
    metrics = {k: float(v) for k, v in module.trainer.callback_metrics.items()}
    assert module.trainer.global_step == 2 and module.reward_mix.names == ["accuracy_reward", "format_reward"]
    assert metrics["train/reward"] == pytest.approx(
        metrics["train/reward/accuracy_reward"] + 0.2 * metrics["train/reward/format_reward"]
    )
    assert metrics["train/reward_status/error"] == 0.0 and metrics["train/reward_status/timeout"] == 0.0
    assert module.scorer is None  # closed at teardown


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_verl_example_config_trains_on_verls_parquet_with_its_compute_score(tiny_model_dir, tmp_path, monkeypatch):
    """configs/migrate/verl_gsm8k.yaml on the tiny model: verl's parquet layout, its compute_score
    (a dict result) in a worker process, the KL term, and validation Pass@k by that reward."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"C{i}{i + 1}=0{i}:"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(6)
    ]
    for name in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{name}.parquet")
    overrides = {
        "trainer": _cpu_trainer(tmp_path, val_check_interval=2, limit_val_batches=1, max_epochs=None),
        "model": {
            "policy": {"path": str(tiny_model_dir), "dtype": "float32", "gradient_checkpointing": False},
            "sampling": {"n": 3, "max_new_tokens": 6, "seed": 0},
            "batching": {"mini_batch_size": 6, "micro_batch_size": 3},
            "scoring": {"workers": 1},
        },
        "rollout": {"init_args": {"engine": "hf", "engine_options": None}},
        "data": {
            "train": {"files": str(tmp_path / "train.parquet")},
            "val": [{"files": str(tmp_path / "test.parquet"), "adapter": "verl", "name": "gsm8k_test", "n_samples": 2}],
            "batch_size": 2,
            "val_batch_size": 3,
        },
    }
    module = _fit(str(ROOT / "configs/migrate/verl_gsm8k.yaml"), overrides, tmp_path, monkeypatch)
    metrics = module.trainer.callback_metrics
    assert module.trainer.global_step == 2 and module.reward_mix.names == ["compute_score"]
    assert "train/reward/compute_score" in metrics and "train/kl" in metrics
    assert {"val/gsm8k_test/pass@1", "val/gsm8k_test/pass@2"} <= set(metrics)
    assert float(metrics["train/reward_status/error"]) == 0.0
