"""The adapters run the real libraries' environments unchanged: skyrl-gym's SQLEnv on Spider dev, a TRL environment class."""

from __future__ import annotations

import hashlib

import pytest

from lit_rlvr.envs import resolve_environment

pytest.importorskip("skyrl_gym")

GOLD = "SELECT count(*) FROM singer"
ACTIONS = [
    "<think>How many rows?</think>\n<sql>SELECT count(*) FROM singer</sql>",
    "<think>And the broken one</think>\n<sql>SELECT nope FROM singer</sql>",
    "<think>no tags at all</think>",
    f"<think>done</think>\n<solution>{GOLD}</solution>",
]


def skyrl_direct(root, actions, max_turns=5):
    """SkyRL's own SQLEnv, as SkyRL's generator drives it: its observations, rewards and done flags."""
    from omegaconf import OmegaConf
    from skyrl_gym.envs.sql.env import SQLEnv

    env = SQLEnv(
        OmegaConf.create({"db_path": str(root)}),
        extras={
            "db_id": "concert_singer",
            "reward_spec": {"method": "rule", "ground_truth": GOLD},
            "data": "spider",
            "max_turns": max_turns,
        },
    )
    prompt = [{"role": "user", "content": "How many singers do we have?"}]
    assert env.init(prompt)[0] == prompt
    out = []
    for action in actions:
        step = env.step(action)
        out.append((step["observations"], step["reward"], step["done"]))
        if step["done"]:
            break
    return out


@pytest.mark.parametrize("conversation", [False, True])
def test_skyrl_sqlenv_runs_unchanged_on_spider_dev(skyrl_sql_root, spider_dev, conversation):
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (spider_dev / "database").rglob("*.sqlite")}
    spec = resolve_environment(
        "skyrl", {"env": "text2sql", "env_config": {"db_path": str(skyrl_sql_root)}, "conversation": conversation}
    )
    env = spec.make()
    row = {
        "id": "spider-0",
        "prompt": "How many singers do we have?",
        "answer": GOLD,
        "db_id": "concert_singer",
        "data": "spider",
    }
    assert env.reset(row, max_turns=5) is None
    ours = [env.step(a) for a in ACTIONS]
    env.close()
    theirs = skyrl_direct(skyrl_sql_root, ACTIONS)
    assert len(theirs) == len(ours) == 4
    for step, (observations, reward, done) in zip(ours, theirs):
        assert step.observation == (observations if conversation else "".join(m["content"] for m in observations))
        assert (step.done, step.reward) == (done, reward)
    text = [
        step.observation if isinstance(step.observation, str) else step.observation[0]["content"] for step in ours[:2]
    ]
    assert "<observation> 0\n 6\n<reminder>" in text[0] and "no such column: nope" in text[1]
    assert ours[0].tool_call == "sql('concert_singer', 'SELECT count(*) FROM singer', 4)"
    assert [(s.tool_call is None, s.tool_error) for s in ours[1:3]] == [
        (False, False),
        (True, True),
    ]  # no <sql>: invalid
    assert (ours[-1].done, ours[-1].reward) == (True, 1.0)
    assert spec.version.startswith("skyrl_gym-0.4") and spec.version.split(":")[1] == "text2sql"
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in before} == before


def test_skyrl_sums_step_rewards_and_refuses_a_rewritten_prompt(skyrl_sql_root):
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    class Rewriting(BaseTextEnv):
        def __init__(self, env_config, extras):
            super().__init__()

        def init(self, prompt):
            return [{"role": "system", "content": "new"}, *prompt], {}

    class Appending(Rewriting):
        def init(self, prompt):
            return [*prompt, {"role": "user", "content": "board: ....."}], {}

        def step(self, action):
            return {
                "observations": [{"role": "user", "content": "ok"}],
                "reward": 0.25,
                "done": action == "stop",
                "metadata": {},
            }

    import sys
    import types

    module = types.ModuleType("_lit_rlvr_test_skyrl_envs")
    module.Rewriting, module.Appending = Rewriting, Appending
    sys.modules[module.__name__] = module
    try:
        env = resolve_environment("_lit_rlvr_test_skyrl_envs:Appending").make()
        assert env.reset({"prompt": "hi"}, 3) == "board: ....."
        assert [env.step(a).reward for a in ("go", "stop")] == [0.25, 0.5]
        with pytest.raises(ValueError, match="Rewriting.init changed the prompt's messages"):
            resolve_environment("_lit_rlvr_test_skyrl_envs:Rewriting").make().reset({"prompt": "hi"}, 3)
    finally:
        del sys.modules[module.__name__]


def test_trl_environment_class_runs_its_tools_and_reward(tool_tokenizer, trl_counter):
    spec = resolve_environment(trl_counter.path)
    assert spec.name == "trl" and spec.version.startswith(f"trl:{trl_counter.path}:src-")
    env = spec.make(tokenizer=tool_tokenizer)
    assert env.reset({"id": "t", "prompt": "Count to 7", "answer": "7"}, max_turns=4) is None
    first = env.step(trl_counter.call(3))
    assert first.observation == [{"role": "tool", "name": "increment", "content": "3"}]
    assert (first.tool_call, first.tool_error, first.done, first.reward) == (
        "increment({'step': 3})",
        False,
        False,
        0.0,
    )
    failed = env.step(trl_counter.call(500))
    assert failed.tool_error and failed.observation[0]["content"] == "{'error': 'step too large'}"
    assert env.step(trl_counter.call(4)).reward == 1.0
    final = env.step("The counter is 7.<|im_end|>")  # no tool call: the episode ends
    assert (final.done, final.reward, final.tool_call) == (True, 1.0, None)
    env.reset({"id": "t", "answer": "3"}, max_turns=1)
    last = env.step(trl_counter.call(3))  # the last turn allowed: its call is not run (TRL's last iteration)
    assert (last.done, last.reward) == (True, 0.0)
    with pytest.raises(ValueError, match="needs the policy's tokenizer"):
        spec.make()


def test_the_docs_worked_examples_configure_the_adapters_they_say(tool_tokenizer, trl_counter, tmp_path, monkeypatch):
    """docs/agents.md's skyrl-gym and TRL examples, as a user copies them: the configs resolve to the
    adapters, the TRL class runs its tool, and its tools are listed in the prompt."""
    import re
    from pathlib import Path

    import yaml

    from lit_rlvr.data.prompts import PromptFormat, encode_prompt
    from lit_rlvr.options import EnvironmentOptions

    doc = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    skyrl = yaml.safe_load(re.search(r"<!-- skyrl-example -->\n```yaml\n(.*?)```", doc, re.DOTALL).group(1))
    spec = EnvironmentOptions(**skyrl["model"]["environment"]).specs([{"id": "q"}])[0]
    assert (
        spec.name == "skyrl"
        and spec.identity.startswith("skyrl@skyrl_gym-0.4")
        and spec.options["env_config"]["db_path"]
    )
    code, config = re.search(r"<!-- trl-example -->\n```python\n(.*?)```\n\n```yaml\n(.*?)```", doc, re.DOTALL).groups()
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "counter.py").write_text(code)
    monkeypatch.chdir(tmp_path)  # the example's paths are relative to where lit-rlvr runs
    config = yaml.safe_load(config)
    environment = EnvironmentOptions(**config["model"]["environment"])
    env = environment.specs([{"id": "t"}])[0].make(tokenizer=tool_tokenizer)
    env.reset({"id": "t", "prompt": "Count to 7"}, max_turns=environment.max_turns)
    first = env.step(trl_counter.call(7))
    assert first.observation == [{"role": "tool", "name": "increment", "content": "7"}] and first.reward == 1.0
    prompt = tool_tokenizer.decode(
        encode_prompt({"prompt": "Count to 7"}, tool_tokenizer, PromptFormat(**config["data"]["prompt"]))
    )
    assert '"name": "increment"' in prompt and "how much to add" in prompt


def test_a_trl_environment_that_cannot_parse_the_policys_tool_calls_is_a_start_up_error(
    tool_tokenizer, trl_counter, tiny_model_dir
):
    """The char tokenizer has no chat template TRL knows: every trajectory would fail (env_error) and
    train nothing, so the start-up check refuses it, naming the environment and why; Qwen's passes."""
    from transformers import AutoTokenizer

    from lit_rlvr.contracts import check_prompt_data
    from lit_rlvr.rewards.combine import RewardMix
    from lit_rlvr.rollout.turns import EnvironmentOptions

    rows = [{"id": "t", "prompt": "Count to 7", "answer": "7"}]
    environment = EnvironmentOptions(trl_counter.path)
    environment.check_tokenizer(rows, tool_tokenizer)
    char = AutoTokenizer.from_pretrained(tiny_model_dir)
    refused = r"model.environment: environment 'trl' cannot work with the policy's tokenizer: .*cannot parse this tokenizer's tool calls"
    with pytest.raises(ValueError, match=refused):
        environment.check_tokenizer(rows, char)

    class Data:  # what check_prompt_data reads of a DataModule
        tokenizer, reference_cache, train_rows = char, None, rows
        base_pass_counts, val_samples_per_prompt = None, {}

        def all_rows(self):
            return rows

        def fit_context(self, *args):
            pass

    with pytest.raises(ValueError, match=refused):
        check_prompt_data(Data(), char, RewardMix(), "grpo", environment)
