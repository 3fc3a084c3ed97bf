"""A user's own package plugs its rewards, estimator, divergence, adapter and module subclass into
``lit-rlvr fit`` from YAML (``imports:``) or an entry point, and its reward runs in the workers."""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest
import yaml

PLUGIN = '''
"""myproj.plugin: what a user's package registers with lit_rlvr."""
import os
from pathlib import Path

import torch

from lit_rlvr.data import ADAPTERS
from lit_rlvr.functional import register_advantage, register_divergence
from lit_rlvr.rewards import register_reward


@register_reward("myproj_has_digit")
def has_digit(completion, answer, **row):
    """1 if the completion holds the gold digit; records which process scored it."""
    marker = os.environ.get("MYPROJ_MARKER")
    if marker:
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\\n")
    return float(str(answer) in completion)


@register_advantage("myproj_centered")
def centered(rewards, group_ids, *, scale: float = 1.0):
    """Reward minus its group mean, times ``scale``."""
    ids, inverse = torch.unique(group_ids, return_inverse=True)
    means = torch.zeros(len(ids)).scatter_add(0, inverse, rewards.float()) / torch.bincount(inverse).float()
    return (rewards.float() - means[inverse]) * scale


@register_divergence("myproj_squared_log")
def squared_log(log_ratio):
    return 0.5 * log_ratio.square()


@ADAPTERS.register("myproj_lines")
def lines(record, *, index, name, source, reward="myproj_has_digit"):
    return {"id": f"{name}/{index}", "prompt": record["q"], "answer": str(record["a"]), "reward": reward}
'''

MODULE = '''
from lit_rlvr.module import RLVRModule


class TaggedModule(RLVRModule):
    """A user's subclass with an extra constructor argument."""

    def __init__(self, tag: str = "none", **kwargs):
        super().__init__(**kwargs)
        self.tag = tag
'''

ENTRY_POINT_PLUGIN = """
from lit_rlvr.rewards import register_reward


def register():
    register_reward("myproj_ep_always")(lambda completion, answer, **row: 1.0)
"""


ROOT = Path(__file__).resolve().parents[1]


def documented_module(doc: str, marker: str) -> str:
    """The python block after ``<!-- marker -->`` in ``doc`` (a path under the repository root)."""
    text = (ROOT / doc).read_text()
    return re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", text, re.DOTALL).group(1)


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """``myproj`` in a temporary folder on sys.path; the registries are restored afterwards."""
    from lit_rlvr import plugins
    from lit_rlvr.data import ADAPTERS
    from lit_rlvr.functional import ADVANTAGES, DIVERGENCES
    from lit_rlvr.rewards import REWARDS

    root = tmp_path / "userpkg"
    (root / "myproj").mkdir(parents=True)
    (root / "myproj" / "__init__.py").write_text("")
    (root / "myproj" / "plugin.py").write_text(PLUGIN)
    (root / "myproj" / "rewards.py").write_text(documented_module("README.md", "readme-reward-example"))
    (root / "myproj" / "extras.py").write_text(documented_module("docs/extending.md", "extending-example"))
    (root / "myproj" / "module.py").write_text(MODULE)
    (root / "myproj" / "ep_plugin.py").write_text(ENTRY_POINT_PLUGIN)
    monkeypatch.syspath_prepend(str(root))
    registries = [REWARDS, ADVANTAGES, DIVERGENCES, ADAPTERS]
    before = [set(r) for r in registries]
    loaded = list(plugins._LOADED)
    yield root
    for registry, names in zip(registries, before):
        for name in set(registry) - names:
            registry.pop(name)
    plugins._LOADED[:] = loaded
    import sys

    for name in [m for m in sys.modules if m == "myproj" or m.startswith("myproj.")]:
        del sys.modules[name]


@pytest.mark.timeout(240)
def test_fit_from_yaml_with_a_users_reward_estimator_divergence_adapter_and_subclass(
    user_package, tiny_model_dir, tmp_path, monkeypatch
):
    from lit_rlvr.cli import main

    marker = tmp_path / "scored_by.txt"
    monkeypatch.setenv("MYPROJ_MARKER", str(marker))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"q": f"C{i}{i + 1}=0{i}:", "a": 7}) + "\n" for i in range(6)))
    config = {
        "imports": ["myproj.plugin"],
        "trainer": {
            "accelerator": "cpu",
            "max_steps": 2,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "default_root_dir": str(tmp_path / "run"),
        },
        "model": {
            "class_path": "myproj.module.TaggedModule",
            "init_args": {
                "tag": "from-yaml",
                "policy": {"path": str(tiny_model_dir)},
                "sampling": {"n": 4, "max_new_tokens": 6, "seed": 0},
                "loss": {"advantage": "myproj_centered", "advantage_options": {"scale": 2.0}},
                "scoring": {"workers": 1},
            },
        },
        "rollout": {"init_args": {"engine": "hf"}},
        "data": {"train": {"files": str(prompts), "adapter": "myproj_lines", "name": "user"}, "batch_size": 2},
    }
    path = tmp_path / "user.yaml"
    path.write_text(yaml.safe_dump(config))
    cli_state = {}

    import lit_rlvr.callbacks.rollout as rollout_module

    original = rollout_module.RolloutCallback.on_fit_start

    def spy(self, trainer, pl_module):
        cli_state["module"] = pl_module
        return original(self, trainer, pl_module)

    monkeypatch.setattr(rollout_module.RolloutCallback, "on_fit_start", spy)
    main(["fit", "--config", str(path)])
    module = cli_state["module"]
    assert type(module).__name__ == "TaggedModule" and module.tag == "from-yaml"
    assert module.advantage_name == "myproj_centered" and module.advantage_options == {"scale": 2.0}
    from lit_rlvr.options import AnchorOptions

    AnchorOptions(divergence="myproj_squared_log", coef=1.0)  # the plug-in's divergence is a valid anchor
    assert module.trainer.global_step == 2
    assert 0.0 <= float(module.trainer.callback_metrics["train/reward"]) <= 1.0
    pids = {int(p) for p in marker.read_text().split()}
    assert pids and os.getpid() not in pids  # the user's reward ran in the reward worker processes


def test_an_unknown_plugin_module_is_a_clear_start_up_error(user_package, tiny_model_dir, tmp_path):
    from lit_rlvr.cli import main

    with pytest.raises(ImportError, match="imports: cannot import plug-in module 'myproj.nope'"):
        main(
            [
                "fit",
                "--imports=[myproj.nope]",
                f"--model.policy.path={tiny_model_dir}",
                f"--data.train.files={tmp_path / 'p.jsonl'}",
                "--trainer.accelerator=cpu",
                "--trainer.max_steps=1",
                "--trainer.logger=false",
                f"--trainer.default_root_dir={tmp_path}",
            ]
        )


def test_entry_point_plugins_load_in_the_parent_and_in_reward_workers(user_package):
    from lit_rlvr.plugins import ENTRY_POINT_GROUP, load_plugins
    from lit_rlvr.rewards import REWARDS, BatchScorer

    dist = user_package / "myproj-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myproj\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(f"""\
        [{ENTRY_POINT_GROUP}]
        myproj = myproj.ep_plugin:register
        """)
    )
    assert "myproj_ep_always" not in REWARDS
    assert "myproj.ep_plugin" in load_plugins()
    assert REWARDS["myproj_ep_always"]("anything", "x") == 1.0
    row = {"id": "e", "reward": "myproj_ep_always", "answer": "x"}
    with BatchScorer(workers=1, timeout_s=5.0) as scorer:  # the worker loads the entry point itself
        assert [r.reward for r in scorer.score(["a", "b"], [row, row])] == [1.0, 1.0]
        assert scorer.local_only == {}  # a lambda: only reachable because the worker ran register()


@pytest.mark.timeout(240)
def test_the_documented_plugin_modules_train_from_yaml(user_package, tiny_model_dir, tmp_path, monkeypatch):
    """The README's reward (in a worker) and docs/extending.md's adapter, estimator and divergence, verbatim, through `lit-rlvr fit`."""
    from lit_rlvr.cli import main

    prompts = tmp_path / "qa.jsonl"
    prompts.write_text("".join(json.dumps({"q": f"C{i}{i + 1}=0{i}:", "a": "7"}) + "\n" for i in range(4)))
    config = {
        "imports": ["myproj.rewards", "myproj.extras"],
        "trainer": {
            "accelerator": "cpu",
            "max_steps": 1,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "default_root_dir": str(tmp_path / "run"),
        },
        "model": {
            "class_path": "myproj.module.TaggedModule",
            "init_args": {
                "policy": {"path": str(tiny_model_dir)},
                "sampling": {"n": 2, "max_new_tokens": 4, "seed": 0},
                "loss": {"advantage": "mean_baseline", "advantage_options": {"scale": 2.0}},
                "scoring": {"workers": 1},
            },
        },
        "rollout": {"init_args": {"engine": "hf"}},
        "data": {"train": {"files": str(prompts), "adapter": "qa_pairs"}, "batch_size": 2},
    }
    path = tmp_path / "qa.yaml"
    path.write_text(yaml.safe_dump(config))
    seen = {}
    import lit_rlvr.callbacks.rollout as rollout_module

    original = rollout_module.RolloutCallback.on_fit_start
    monkeypatch.setattr(
        rollout_module.RolloutCallback,
        "on_fit_start",
        lambda self, trainer, pl_module: (
            seen.update(module=pl_module, config=pl_module.scorer._config, shipped=pl_module.scorer.shipped),
            original(self, trainer, pl_module),
        ),
    )
    main(["fit", "--config", str(path)])
    module = seen["module"]
    assert module.trainer.global_step == 1 and float(module.trainer.callback_metrics["train/reward_status/ok"]) == 1.0
    from lit_rlvr.options import AnchorOptions

    AnchorOptions(
        divergence="neyman_chi2", coef=0.1
    )  # docs/extending.md's divergence is a valid anchor (with data.cache)
    # the workers imported myproj.rewards themselves (a worker that cannot import it fails to start)
    *_, plugin_modules, _ = seen["config"]
    assert "myproj.rewards" in plugin_modules and "exact_match" not in seen["shipped"]


LOADABLE = """
from lit_rlvr.envs import EnvironmentBase, Step


def exact(completion, answer, **row):
    return float(completion == answer)


class Echo(EnvironmentBase):
    def step(self, action):
        return Step(action, done=True)
"""


def test_one_import_path_loader_serves_rewards_environments_and_data(tmp_path):
    """Rewards, environments and data all load an import path through ``lit_rlvr.plugins``: one cache
    (a file is imported once, whoever names it first), one set of errors naming what was asked for."""
    import lit_rlvr.data.prompts
    import lit_rlvr.envs.base
    import lit_rlvr.envs.skyrl
    import lit_rlvr.envs.trl
    import lit_rlvr.rewards.combine
    import lit_rlvr.rewards.conventions
    from lit_rlvr import plugins
    from lit_rlvr.envs import resolve_environment
    from lit_rlvr.rewards import RewardFunc

    for module in (
        lit_rlvr.data.prompts,
        lit_rlvr.envs.base,
        lit_rlvr.envs.skyrl,
        lit_rlvr.envs.trl,
        lit_rlvr.rewards.combine,
        lit_rlvr.rewards.conventions,
    ):
        assert getattr(module, "load_function", plugins.load_function) is plugins.load_function, module.__name__
    file = tmp_path / "mine.py"
    file.write_text(LOADABLE)
    echo = plugins.load_function(f"{file}:Echo", "environment")
    assert resolve_environment(f"{file}:Echo").factory is echo
    assert RewardFunc(f"{file}:exact").fn is plugins.load_function(f"{file}:exact", "reward function")
    assert plugins.is_import_path(f"{file}:Echo") and not plugins.is_import_path("sql")
    with pytest.raises(ImportError, match=r"^environment 'mine_nope\.Echo': No module named 'mine_nope'"):
        plugins.load_function("mine_nope.Echo", "environment")
    with pytest.raises(TypeError, match=r"reward function 'lit_rlvr.plugins.ENTRY_POINT_GROUP' is a str"):
        plugins.load_function("lit_rlvr.plugins.ENTRY_POINT_GROUP", "reward function")
