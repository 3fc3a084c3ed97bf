"""`lit-rlvr cache --devices N`: N processes build disjoint shards of the same cache as one process;
a rank that dies fails the build clearly, and the same command resumes it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import processes

PLUGIN = '''
import os

from lit_rlvr.rewards import register_reward


@register_reward("crashy_contains")
def crashy_contains(completion, answer, **row):
    """1 if the completion holds a character of the answer; rank 1 dies on prompt 7 when asked to."""
    if "CRASH_RANK" in os.environ and os.environ["CRASH_RANK"] == os.environ.get("RANK") and row["id"].endswith("/7"):
        os._exit(9)
    return float(any(ch in completion for ch in answer))
'''


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def cache_command(tmp_path: Path, tiny_model_dir, out: Path, devices: int, crash_rank: int | None = None):
    (tmp_path / "crashy_plugin.py").write_text(PLUGIN)
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{i}+{i}=", "answer": "0123456789", "reward": "crashy_contains"}) + "\n"
            for i in range(8)
        )
    )
    config = tmp_path / "cache.yaml"
    config.write_text(
        f"imports: [crashy_plugin]\npolicy: {{path: {tiny_model_dir}}}\ndata:\n  train: {{files: {data}, name: toy}}\n"
        "sampling: {n: 2, max_new_tokens: 4}\nscoring: {workers: 0}\nprompts_per_shard: 2\nprogress: false\ndevice: cpu\nengine: hf\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    env.pop("CRASH_RANK", None)
    if crash_rank is not None:
        env["CRASH_RANK"] = str(crash_rank)
    return processes.run_cli(
        ["cache", "--config", str(config), f"--data.cache.path={out}", "--devices", str(devices)], env=env, timeout=240
    )


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_rank_build_equals_one_rank_and_resumes_after_a_rank_dies(tmp_path, tiny_model_dir):
    one = cache_command(tmp_path, tiny_model_dir, tmp_path / "one", devices=1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = cache_command(tmp_path, tiny_model_dir, tmp_path / "two", devices=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "|D_pef| = " in two.stdout
    assert files(tmp_path / "two") == files(tmp_path / "one")  # byte-identical, manifest included
    # rank 1 (shards 1 and 3) dies on shard 3 (prompts 6, 7): clear failure, the finished shards are kept
    crashed = cache_command(tmp_path, tiny_model_dir, tmp_path / "crash", devices=2, crash_rank=1)
    assert crashed.returncode != 0
    assert (
        "rank 1 of 2 exited with code 9" in crashed.stderr and "run the same command again to resume" in crashed.stderr
    )
    manifest = json.loads((tmp_path / "crash" / "manifest.json").read_text())
    assert not manifest["complete"]
    built = {p.name for p in (tmp_path / "crash").glob("shard-*.safetensors")}
    assert built == {"shard-00000.safetensors", "shard-00001.safetensors", "shard-00002.safetensors"}
    resumed = cache_command(tmp_path, tiny_model_dir, tmp_path / "crash", devices=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert files(tmp_path / "crash") == files(tmp_path / "one")
    # and the 2-rank cache serves a 1-rank DataModule
    from lit_rlvr.data import CacheOptions, DatasetSpec, PromptDataModule

    sys.path.insert(0, str(tmp_path))
    try:
        from lit_rlvr.plugins import load_plugins

        load_plugins(["crashy_plugin"])
        dm = PromptDataModule(
            str(tiny_model_dir),
            train=DatasetSpec(str(tmp_path / "train.jsonl"), name="toy"),
            cache=CacheOptions(str(tmp_path / "two"), train_split="all"),
        )
        dm.setup("fit")
        assert set(dm.base_pass_counts) == {f"toy/{i}" for i in range(8)}
    finally:  # later tests' reward workers must not be sent a reward from this temporary module
        from lit_rlvr.rewards import REWARDS

        REWARDS.pop("crashy_contains", None)
        sys.modules.pop("crashy_plugin", None)
        sys.path.remove(str(tmp_path))
