"""`lit-rlvr cache`: a YAML config builds the cache a training DataModule with the same data section accepts."""

from __future__ import annotations

import json

import pytest

from lit_rlvr.cache import ReferenceCache
from lit_rlvr.data import CacheOptions, DatasetSpec, PromptDataModule, PromptFormat
from lit_rlvr.tools.cache import main


@pytest.mark.timeout(120)
def test_cache_command_from_yaml_builds_a_cache_the_datamodule_accepts(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i), "reward": "math"}) + "\n" for i in range(5)))
    out = tmp_path / "cache"
    config = tmp_path / "cache.yaml"
    config.write_text(
        f"policy: {{path: {tiny_model_dir}}}\ndata:\n  train: {{files: {data}, adapter: jsonl, name: toy}}\n"
        f"  prompt: {{instruction: 'Sum: {{prompt}}'}}\n  cache: {{path: {out}}}\nsampling: {{n: 3, max_new_tokens: 6}}\n"
        "scoring: {workers: 0}\nprompts_per_shard: 2\nprogress: false\n"
    )
    text = main(["--config", str(config)])
    printed = capsys.readouterr().out
    assert text in printed and "5 prompts × n=3 samples" in text and "|D_pef| = " in text
    with ReferenceCache(out) as cache:
        assert cache.num_samples == 15 and len(cache.manifest["shards"]) == 3 and cache.manifest["rewards"] == ["math"]
        statuses = cache.status_counts()
        assert sum(statuses.values()) == 15 and set(statuses) <= {"ok", "no_answer", "timeout", "error"}
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    main(["--config", str(config)])  # a second run finds everything done and changes nothing
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    dm = PromptDataModule(str(tiny_model_dir), train=DatasetSpec(str(data), "jsonl", name="toy"), prompt=PromptFormat(instruction="Sum: {prompt}"),
                          cache=CacheOptions(str(out)))  # fmt: skip
    dm.setup("fit")
    assert set(dm.base_pass_counts) == {f"toy/{i}" for i in range(5)}


@pytest.mark.timeout(120)
def test_with_several_rewards_the_cache_stores_the_correctness_reward(tmp_path, tiny_model_dir):
    """TRL rows (no lit_rlvr reward or answer) and two TRL reward functions from a file, in a worker:
    the cache's rewards and pass counts are the `correctness` reward's alone, and the manifest names it."""
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(
        "def parity(completions, index, **kwargs):\n    return [float(i % 2 == 0) for i in index]\n\n\n"
        "def bonus(completions, **kwargs):\n    return [0.5 for _ in completions]\n"
    )
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "index": i}) + "\n" for i in range(4)))
    out = tmp_path / "cache"
    config = tmp_path / "cache.yaml"
    config.write_text(
        f"policy: {{path: {tiny_model_dir}}}\ndata:\n  train: {{files: {data}, adapter: trl, name: toy}}\n  cache: {{path: {out}}}\n"
        "sampling: {n: 2, max_new_tokens: 4}\nprogress: false\n"
        f"scoring: {{workers: 1, reward_funcs: ['{rewards}:parity', '{rewards}:bonus'], reward_weights: [1.0, 1.0], correctness: parity}}\n"
    )
    main(["--config", str(config)])
    with ReferenceCache(out) as cache:
        assert cache.manifest["rewards"] == [f"{rewards}:parity"]
        assert cache.rewards.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]  # parity only: no +0.5 bonus
        assert cache.base_pass_counts() == {"toy/0": 2, "toy/1": 0, "toy/2": 2, "toy/3": 0}
