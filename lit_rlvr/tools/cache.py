"""``lit-rlvr cache``: build (or resume) the DPH-RL reference cache from a DataModule config.

The prompts come from the same :class:`~lit_rlvr.data.PromptDataModule` settings the training
run uses (files, adapter, tokenizer, template, ``max_prompt_tokens``), so the cache's dataset
fingerprint matches the run's; give training the same ``data`` section plus ``cache: <out>``.

Example config (``lit-rlvr cache --config cache.yaml``)::

    policy: {path: Qwen/Qwen2.5-Math-1.5B}        # the initial policy (π_ref); data.tokenizer follows it
    data:
      train: {files: data/train.jsonl, adapter: gsm8k}
      prompt: {instruction: "{prompt}\\nPut the final answer in \\\\boxed{{}}."}
      cache: {path: caches/gsm8k-qwen-n8, perfect_threshold: 8}   # where it goes; the summary's D_pef
    sampling: {n: 8, temperature: 1.0, max_new_tokens: 1024, seed: 0}   # n: samples per prompt (paper: 8)
    batching: {micro_batch_tokens: 16384}         # the log π_ref passes, as the run's model.batching
    engine: vllm                                  # or hf; default auto, as in training
    scoring: {workers: 4, timeout_s: 10.0}
    # environment: {name: sql, turns: {max_turns: 5}}   # a multi-turn cache: the run's model.environment

The option groups are the training run's (``policy``, ``sampling``, ``batching``, ``scoring``, ``environment``,
:mod:`lit_rlvr.options`) with the same defaults, as is the engine's (``auto``), and ``data`` is its
DataModule section: training reads the same ``data.cache`` that was built, and a cache built with
the defaults samples as a run with the defaults does (group size, temperature, length cap) and
stores the log π_ref that run's forward passes compute. Running the same command again after an
interruption resumes the build; the end prints the pass-count histogram and |D_pef| / |D_exp|.

Several processes build disjoint shards (each its own engine and reward scorer) and give the same
cache as one process: ``lit-rlvr cache --config cache.yaml --devices 4`` starts 3 more processes
itself (one device each: ``CUDA_VISIBLE_DEVICES`` per process on GPUs), or launch it with
``torchrun --nproc-per-node 4 -m lit_rlvr.cli cache --config cache.yaml`` (or SLURM's ``srun``
with ``RANK``/``WORLD_SIZE`` set) across nodes sharing the output directory. If a process dies,
the others' finished shards are kept and the same command resumes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from jsonargparse import ActionConfigFile, ArgumentParser

from lit_rlvr.contracts import StartupError
from lit_rlvr.data.datamodule import PromptDataModule
from lit_rlvr.flags import merge_mapping_flags
from lit_rlvr.options import (
    DEFAULT_SAMPLING,
    BatchingOptions,
    EnvironmentOptions,
    PolicyOptions,
    SamplingParams,
    ScoringOptions,
    completion_budget,
)
from lit_rlvr.plugins import load_plugins
from lit_rlvr.rollout.turns import rows_scored_by_rewards


def build_cache(
    data: PromptDataModule,
    policy: PolicyOptions,
    sampling: SamplingParams = DEFAULT_SAMPLING,
    batching: BatchingOptions = BatchingOptions(),
    engine: str = "auto",
    engine_options: dict[str, Any] | None = None,
    device: str = "auto",
    scoring: ScoringOptions = ScoringOptions(),
    environment: EnvironmentOptions | None = None,
    prompts_per_shard: int = 256,
    prompts_per_call: int = 1,
    correct_threshold: float = 1.0,
    progress: bool = True,
    rank: int = 0,
    world_size: int = 1,
) -> str:
    """Build the reference cache of ``data``'s training prompts under the initial policy, at ``data.cache.path``.

    Args:
        data: the training run's DataModule settings; its ``cache.path`` is where the cache goes
            and its ``cache.perfect_threshold`` the D_pef threshold of the printed summary.
        policy: the initial policy π_ref (:class:`~lit_rlvr.options.PolicyOptions`; its dtype is
            that of the log-prob forward pass; no LoRA: π_ref is the base).
        sampling: the reference samples (:class:`~lit_rlvr.options.SamplingParams`, training's
            defaults): ``n`` per prompt, ``temperature`` (the stored log-probs are always at 1.0),
            ``seed`` (each engine call is seeded from it and its prompt ids).
        batching: the log π_ref forward passes (:class:`~lit_rlvr.options.BatchingOptions`,
            training's group and defaults): ``micro_batch_size``, ``micro_batch_tokens`` and
            ``padding_free``, as in training's no-grad log-prob passes, so a run's ``model.batching``
            copied here gives the log-probs that run computes; ``ppo_epochs`` and
            ``mini_batch_size`` only concern training.
        engine: a rollout engine name (:data:`lit_rlvr.rollout.ENGINES`: ``auto``, as training's
            rollout callback: vLLM when importable, else ``hf``; ``vllm``, ``hf``).
        engine_options: the engine's options (e.g. ``gpu_memory_utilization``), as the rollout callback's.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda``, ...
        scoring: the rewards and their scorer (:class:`~lit_rlvr.options.ScoringOptions`), as in
            training; the cache stores the correctness reward (``scoring.correctness``).
        environment: multi-turn trajectories (:class:`~lit_rlvr.options.EnvironmentOptions`, the
            run's ``model.environment``: a run refuses a cache sampled in another environment);
            None: single-turn completions.
        prompts_per_shard: prompts per shard (unit of resumption).
        prompts_per_call: prompts per engine call.
        correct_threshold: reward counted as a pass.
        progress: show a progress bar.
        rank: this process's rank among ``world_size`` building the cache (set by :func:`main`).
        world_size: processes building the cache; rank 0 prints the summary once they all finished.

    Returns:
        The printed summary (empty on ranks other than 0, and on rank 0 of a multi-process build,
        whose caller finishes the manifest first).

    Raises:
        StartupError: before any loading, what ``fit`` would refuse at start-up, named by this
            command's keys (``lit-rlvr cache`` ends with its message and exit status 2).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from lit_rlvr.cache.builder import build_reference_cache
    from lit_rlvr.policy.loading import DTYPES
    from lit_rlvr.rollout import build_engine

    try:  # what fit checks at start-up, under this command's keys, before any loading
        target, mix, scored = _checked_setup(data, policy, sampling, engine, engine_options, scoring, environment)
    except StartupError:
        raise
    except ValueError as err:  # a setting, a row or an environment the build cannot use: a refusal, not a crash
        raise StartupError(str(err)) from err
    out = target.path
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(policy.path, dtype=DTYPES[policy.dtype]).to(device).eval()
    rollout_engine = build_engine(
        engine, model=model, tokenizer=data.tokenizer, model_path=policy.path, **(engine_options or {})
    )
    try:
        with scoring.scorer() as scorer:
            build_reference_cache(
                out,
                data.train_rows,
                data.train_prompt_ids,
                engine=rollout_engine,
                scorer=mix.correctness_scorer(scorer),
                reward_names=mix.correctness_sources(scored),
                model=model,
                tokenizer=data.tokenizer,
                params=sampling,
                prompts_per_shard=prompts_per_shard,
                prompts_per_call=prompts_per_call,
                batching=batching.micro_batching,
                correct_threshold=correct_threshold,
                progress=progress,
                rank=rank,
                world_size=world_size,
                environment=environment,
            )
    finally:
        if hasattr(rollout_engine, "close"):
            rollout_engine.close()
    return print_summary(out, target.perfect_threshold) if world_size == 1 else ""


def _checked_setup(
    data: PromptDataModule,
    policy: PolicyOptions,
    sampling: SamplingParams,
    engine: str,
    engine_options: dict[str, Any] | None,
    scoring: ScoringOptions,
    environment: EnvironmentOptions | None,
) -> tuple[Any, Any, list[dict]]:
    """:func:`build_cache`'s start-up checks (raising ``ValueError``), as ``fit`` runs them: the
    engine and its options, the cache's path, the prompts (``data.setup``), that every row can be
    scored, and that every environment works with the policy's tokenizer. Returns the cache's
    options, the reward mix and the rows its rewards score."""
    from lit_rlvr.rollout import ENGINES

    ENGINES.get_checked(engine, "engine", engine_options or {}, "engine_options")
    if data.cache is None:
        raise ValueError("data.cache.path is required: it is where the reference cache is built")
    if policy.lora is not None:
        raise ValueError("policy.lora: the reference cache samples π_ref, the base policy; remove the LoRA settings")
    completion_budget(sampling, environment, "sampling.max_new_tokens")  # one turn fits the trajectory's budget
    target = data.cache
    data.cache = None  # the cache is being built: the DataModule must not open it
    data.setup("fit")
    if not data.train_rows:
        raise ValueError("data.train is required: the cache covers the training prompts")
    mix = scoring.mix()  # the cache's rewards and pass counts are the correctness reward's, as validation's
    scored = rows_scored_by_rewards(data.train_rows, environment)  # every row has an environment
    mix.check_rows(scored, "data.train")
    if environment is not None:  # one that cannot work with the tokenizer would fail every trajectory
        environment.check_tokenizer(data.train_rows, data.tokenizer, "environment")
    return target, mix, scored


def print_summary(out: str, perfect_threshold: int | None) -> str:
    """Print (and return) the finished cache's pass-count summary."""
    from lit_rlvr.cache.reader import ReferenceCache
    from lit_rlvr.cache.split import summary

    with ReferenceCache(out) as cache:
        text = summary(cache, perfect_threshold)
    print(text)
    return text


def build_parser() -> ArgumentParser:
    """The ``lit-rlvr cache`` parser: ``--data.*`` (PromptDataModule) plus :func:`build_cache`'s arguments."""
    parser = ArgumentParser(
        prog="lit-rlvr cache", description="Build or resume the DPH-RL reference cache.", parser_mode="omegaconf"
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML file with any of the options below")
    parser.add_argument(
        "--imports", type=list[str], default=[], help="plug-in modules to import first (lit_rlvr.plugins)"
    )
    parser.add_class_arguments(PromptDataModule, "data")
    parser.add_function_arguments(build_cache, skip={"data", "rank", "world_size"})
    parser.link_arguments("policy.path", "data.tokenizer")  # one owner, as in `lit-rlvr fit`
    parser.add_argument(
        "--devices", type=int, default=1, help="processes building the cache (each one device); torchrun sets its own"
    )
    return parser


def main(argv: list[str] | None = None) -> str:
    """Entry point of ``lit-rlvr cache``; returns the summary it printed (rank 0)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    cfg = parser.parse_args(merge_mapping_flags(parser, argv))  # --engine_options='{…}' merges, as in `lit-rlvr fit`
    rank, world_size, children = _launch(cfg.devices, argv)
    load_plugins(cfg.imports)
    init = parser.instantiate(cfg)
    kwargs = {
        k: v for k, v in vars(init).items() if k not in ("config", "imports", "devices", "data", "__default_config__")
    }
    target = init.data.cache
    try:
        text = build_cache(init.data, **kwargs, rank=rank, world_size=world_size)
    except BaseException:
        for child in children:
            child.kill()
        raise
    if world_size == 1:
        return text
    _wait_for_ranks(children, world_size)
    if rank != 0:
        return ""
    from lit_rlvr.cache.builder import finish_manifest

    finish_manifest(target.path)
    return print_summary(target.path, target.perfect_threshold)


def _launch(devices: int, argv: list[str]) -> tuple[int, int, list[subprocess.Popen]]:
    """``(rank, world_size, children)``: from torchrun/SLURM's environment, or by starting ``devices - 1``
    copies of this command (this process is rank 0)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # launched by torchrun, srun, or our own rank 0
        rank = int(os.environ["RANK"])
        _one_device(int(os.environ.get("LOCAL_RANK", rank)))
        return rank, int(os.environ["WORLD_SIZE"]), []
    if devices < 1:
        raise ValueError(f"--devices must be >= 1, got {devices}")
    if devices == 1:
        return 0, 1, []
    children = []
    for r in range(1, devices):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(devices), LIT_RLVR_CACHE_SPAWNED="1")
        children.append(subprocess.Popen([sys.executable, "-m", "lit_rlvr.cli", "cache", *argv], env=env))
    _one_device(0)
    return 0, devices, children


def _one_device(local_rank: int) -> None:
    """On a GPU machine, give this process its own device (before CUDA is initialised)."""
    import torch

    if torch.cuda.is_available() and "," in os.environ.get("CUDA_VISIBLE_DEVICES", ","):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[local_rank % len(devices)]


def _wait_for_ranks(children: list[subprocess.Popen], world_size: int) -> None:
    """Rank 0 of a self-launched build waits for its children; torchrun ranks meet at a barrier."""
    if children:
        while any(c.poll() is None for c in children):
            time.sleep(0.2)
            failed = [(r, c.returncode) for r, c in enumerate(children, 1) if c.returncode not in (None, 0)]
            if failed:
                for c in children:
                    c.kill()
                raise RuntimeError(
                    f"reference cache build: rank {failed[0][0]} of {world_size} exited with code {failed[0][1]} "
                    "(its log is above); the finished shards are kept: run the same command again to resume"
                )
        failed = [(r, c.returncode) for r, c in enumerate(children, 1) if c.returncode != 0]
        if failed:
            raise RuntimeError(
                f"reference cache build: rank {failed[0][0]} of {world_size} exited with code {failed[0][1]}; "
                "run the same command again to resume"
            )
    elif os.environ.get("LIT_RLVR_CACHE_SPAWNED") != "1":  # torchrun / srun: every rank meets rank 0
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        dist.barrier()
