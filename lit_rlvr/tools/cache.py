"""``lit-rlvr cache``: build (or resume) the DPH-RL reference cache from a DataModule config.

The prompts come from the same :class:`~lit_rlvr.data.PromptDataModule` settings the training
run uses (files, adapter, tokenizer, template, ``max_prompt_tokens``), so the cache's dataset
fingerprint matches the run's; give training the same ``data`` section plus ``cache: <out>``.

Example config (``lit-rlvr cache --config cache.yaml``)::

    data:
      tokenizer: Qwen/Qwen2.5-Math-1.5B
      train: {files: data/train.jsonl, adapter: gsm8k}
      instruction: "{prompt}\\nPut the final answer in \\\\boxed{{}}."
    model: Qwen/Qwen2.5-Math-1.5B   # the initial policy (π_ref)
    out: caches/gsm8k-qwen-n8
    n: 8                            # samples per prompt (paper: 8)
    engine: vllm                    # or hf
    max_new_tokens: 1024

Running the same command again after an interruption resumes the build; the end prints the
pass-count histogram and |D_pef| / |D_exp|.
"""

from __future__ import annotations

from typing import Any

from jsonargparse import ActionConfigFile, ArgumentParser

from lit_rlvr.data.datamodule import PromptDataModule
from lit_rlvr.plugins import load_plugins


def build_cache(
    data: PromptDataModule,
    model: str,
    out: str,
    n: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_new_tokens: int = 512,
    stop: list[str] | None = None,
    seed: int = 0,
    engine: str = "hf",
    engine_options: dict[str, Any] | None = None,
    dtype: str = "float32",
    device: str = "auto",
    num_workers: int = 2,
    timeout_s: float = 5.0,
    prompts_per_shard: int = 256,
    prompts_per_call: int = 1,
    logprob_batch_size: int = 16,
    correct_threshold: float = 1.0,
    perfect_threshold: int | None = None,
    progress: bool = True,
) -> str:
    """Build the reference cache of ``data``'s training prompts under the initial policy ``model``.

    Args:
        data: the training run's DataModule settings (its ``cache`` option is ignored here).
        model: path or hub name of the initial policy π_ref.
        out: cache directory (resumed if a partial build is there).
        n: samples per prompt.
        temperature: sampling temperature (the stored log-probs are always at 1.0).
        top_p: sampling nucleus mass.
        top_k: sampling top-k (0 = off).
        max_new_tokens: completion length cap.
        stop: stop strings.
        seed: run seed (each engine call is seeded from it and its prompt ids).
        engine: a rollout engine name (:data:`lit_rlvr.rollout.ENGINES`: ``hf``, ``vllm``, ``auto``).
        engine_options: keyword arguments for the engine (e.g. ``gpu_memory_utilization``).
        dtype: torch dtype of the policy used for the log-prob forward pass.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda``, ...
        num_workers: reward scorer worker processes.
        timeout_s: per-completion reward deadline.
        prompts_per_shard: prompts per shard (unit of resumption).
        prompts_per_call: prompts per engine call.
        logprob_batch_size: completions per log-prob forward pass.
        correct_threshold: reward counted as a pass.
        perfect_threshold: pass count for D_pef in the printed summary (None = n).
        progress: show a progress bar.

    Returns:
        The printed summary.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from lit_rlvr.cache.builder import build_reference_cache
    from lit_rlvr.cache.reader import ReferenceCache
    from lit_rlvr.cache.split import summary
    from lit_rlvr.rewards import BatchScorer
    from lit_rlvr.rollout import ENGINES, build_engine
    from lit_rlvr.rollout.types import SamplingParams

    ENGINES.get_checked(engine, "engine")  # before any loading
    data.cache_path = None
    data.setup("fit")
    if not data.train_rows:
        raise ValueError("data.train is required: the cache covers the training prompts")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).to(device).eval()
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens, stop=tuple(stop or ()))
    rollout_engine = build_engine(engine, model=policy, tokenizer=data.tokenizer, model_path=model, **(engine_options or {}))
    try:
        with BatchScorer(num_workers=num_workers, timeout_s=timeout_s) as scorer:
            build_reference_cache(
                out, data.train_rows, data.train_prompt_ids, engine=rollout_engine, scorer=scorer, model=policy,
                tokenizer=data.tokenizer, params=params, seed=seed, prompts_per_shard=prompts_per_shard,
                prompts_per_call=prompts_per_call, logprob_batch_size=logprob_batch_size,
                correct_threshold=correct_threshold, progress=progress,
            )  # fmt: skip
    finally:
        if hasattr(rollout_engine, "close"):
            rollout_engine.close()
    with ReferenceCache(out) as cache:
        text = summary(cache, perfect_threshold)
    print(text)
    return text


def build_parser() -> ArgumentParser:
    """The ``lit-rlvr cache`` parser: ``--data.*`` (PromptDataModule) plus :func:`build_cache`'s arguments."""
    parser = ArgumentParser(prog="lit-rlvr cache", description="Build or resume the DPH-RL reference cache.")
    parser.add_argument("--config", action=ActionConfigFile, help="YAML file with any of the options below")
    parser.add_argument("--imports", type=list[str], default=[], help="plug-in modules to import first (lit_rlvr.plugins)")
    parser.add_class_arguments(PromptDataModule, "data")
    parser.add_function_arguments(build_cache, skip={"data"})
    return parser


def main(argv: list[str] | None = None) -> str:
    """Entry point of ``lit-rlvr cache``; returns the summary it printed."""
    parser = build_parser()
    cfg = parser.parse_args(argv)
    load_plugins(cfg.imports)
    init = parser.instantiate(cfg)
    kwargs = {k: v for k, v in vars(init).items() if k not in ("config", "imports", "data", "__default_config__")}
    return build_cache(init.data, **kwargs)
