"""Every example of docs/agents.md runs as written: the doctests (tests/repo/test_docs.py), the commands
(parsed there), and here the configuration blocks, the skyrl-gym and TRL examples as `lit-rlvr fit`
runs on the demo's tiny models, the Python example and the Hub-less chat tokenizer recipe, each bounded
to seconds (one step, two samples, a few tokens)."""

from __future__ import annotations

import csv
import json
import re

import pytest
import yaml

from tests.conftest import REPO_ROOT

DOC = (REPO_ROOT / "docs" / "agents.md").read_text()


def block(marker: str, language: str) -> str:
    return re.search(rf"<!-- {marker} -->\n```{language}\n(.*?)```", DOC, re.DOTALL).group(1)


def tiny_run(tmp_path, model) -> str:
    """A config overlay bounding a `fit` to one step of two samples of a few tokens on `model`, logged to CSV."""
    path = tmp_path / "tiny_run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "seed_everything": 0,
                "trainer": {
                    "accelerator": "cpu",
                    "devices": 1,
                    "max_steps": 1,
                    "num_sanity_val_steps": 0,
                    "enable_checkpointing": False,
                    "enable_progress_bar": False,
                    "log_every_n_steps": 1,
                    "logger": {
                        "class_path": "lightning.pytorch.loggers.CSVLogger",
                        "init_args": {"save_dir": str(tmp_path / "runs"), "name": "logs"},
                    },
                    "default_root_dir": str(tmp_path / "runs"),
                },
                "model": {
                    "policy": {"path": str(model), "dtype": "float32"},
                    "sampling": {"n": 2, "max_new_tokens": 8, "seed": 0},
                    "scoring": {"workers": 0},
                },
                "rollout": {"class_path": "lit_rlvr.callbacks.RolloutCallback", "init_args": {"engine": "hf"}},
                "data": {"batch_size": 2, "gold_check": None},
            }
        )
    )
    return str(path)


def fit(*configs: str) -> None:
    from lit_rlvr.cli import main

    main(["fit", *(a for c in configs for a in ("--config", c))])


def logged(tmp_path) -> dict[str, float]:
    """The last logged value of each metric of the run under tmp_path."""
    rows = list(csv.DictReader((tmp_path / "runs/logs/version_0/metrics.csv").open()))
    return {k: float(v) for row in rows for k, v in row.items() if v}


def test_the_environment_block_configures_the_sql_environment():
    from lit_rlvr.options import EnvironmentOptions

    config = yaml.safe_load(
        re.search(r"```yaml\n(model:\n  environment:\n    name: sql.*?)```", DOC, re.DOTALL).group(1)
    )
    env = EnvironmentOptions(**config["model"]["environment"])
    assert env.spec("sql").options == {"max_rows": 50, "timeout_s": 5.0} and env.turns.max_total_tokens == 6144


@pytest.mark.timeout(300)
def test_the_skyrl_example_trains_on_spider_layout_rows_without_a_reward(
    spider_dev, tiny_model_dir, tmp_path, monkeypatch
):
    """The rows carry no `reward` (text2sql scores them), `extra_fields` lists db_id and data, and a model
    that never writes `<sql>…</sql>` makes tool errors, not tool calls."""
    pytest.importorskip("skyrl_gym")
    root = tmp_path / "data/skyrl_sql"
    (root / "spider").mkdir(parents=True)
    (root / "spider/database").symlink_to(spider_dev / "database")  # SQLEnv's layout, nothing copied
    questions = [q for q in json.loads((spider_dev / "dev.json").read_text()) if q["db_id"] == "concert_singer"][:4]
    (root / "train.jsonl").write_text(
        "".join(
            json.dumps({"prompt": q["question"], "answer": q["query"], "db_id": q["db_id"], "data": "spider"}) + "\n"
            for q in questions
        )
    )
    (tmp_path / "skyrl.yaml").write_text(block("skyrl-example", "yaml"))
    monkeypatch.chdir(tmp_path)  # the example's paths are relative to where lit-rlvr runs
    fit(tiny_run(tmp_path, tiny_model_dir), "skyrl.yaml")
    metrics = logged(tmp_path)
    assert metrics["train/turns"] >= 1 and metrics["train/tool_calls"] == 0.0  # 8 tokens hold no <sql>…</sql>
    assert metrics["train/tool_errors"] > 0  # each turn before the last is an invalid action


@pytest.mark.timeout(300)
def test_the_trl_example_trains_with_the_hub_less_chat_tokenizer(tmp_path, monkeypatch):
    """The recipe builds the policy, the class and config run as written (TRL-format text prompts, so the
    tools must reach them through the chat template), and the class's get_reward scores the rows."""
    pytest.importorskip("trl")
    monkeypatch.chdir(tmp_path)
    exec(compile(block("trl-tokenizer-example", "python"), "docs/agents.md", "exec"), {})  # noqa: S102 (the docs' own example)
    code, config = re.search(r"<!-- trl-example -->\n```python\n(.*?)```\n\n```yaml\n(.*?)```", DOC, re.DOTALL).groups()
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs/counter.py").write_text(code)
    (tmp_path / "trl.yaml").write_text(config)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"prompt": f"Count to {i}"}) + "\n" for i in range(2)))
    (tmp_path / "data.yaml").write_text(
        yaml.safe_dump({"data": {"train": {"files": "train.jsonl", "adapter": "trl"}, "max_prompt_tokens": 4096}})
    )
    fit(tiny_run(tmp_path, tmp_path / "artifacts/tiny_chat"), "trl.yaml", "data.yaml")
    assert "train/reward" in logged(tmp_path) and "train/turns" in logged(tmp_path)

    from transformers import AutoTokenizer

    from lit_rlvr.data.prompts import PromptFormat, encode_prompt

    tok = AutoTokenizer.from_pretrained(tmp_path / "artifacts/tiny_chat")
    ids = encode_prompt(
        {"prompt": "Count to 7"}, tok, PromptFormat(**yaml.safe_load(config)["data"]["prompt"]), raw_text=True
    )
    assert '"name": "increment"' in tok.decode(ids)  # the trl adapter's text prompt lists the tools


@pytest.mark.timeout(300)
def test_the_python_example_trains_in_the_countdown_checker_and_logs_to_csv(tiny_model_dir, tmp_path, monkeypatch):
    from lit_rlvr.demo.data import countdown_rows

    code = block("agents-python-example", "python")
    for shown, run in {
        '"artifacts/demo_agents/base"': repr(str(tiny_model_dir)),
        "max_steps=30": "max_steps=1",
        "n=8": "n=2",
        "batch_size=8": "batch_size=2",
    }.items():
        assert code.count(shown) == 1, shown
        code = code.replace(shown, run)
    data = tmp_path / "artifacts/demo/data"
    data.mkdir(parents=True)
    rows = [{k: v for k, v in r.items() if k != "reward"} for r in countdown_rows([("357", 26), ("129", 11)])]
    (data / "agents_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/agents.md", "exec"), scope)  # noqa: S102 (the docs' own example)
    assert scope["trainer"].global_step == 1
    columns = (tmp_path / "runs/lightning_logs/version_0/metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/reward", "train/turns", "train/tool_calls", "train/tool_errors"} <= set(columns), columns
