"""Building the reference cache: n samples per training prompt from π_ref, their rewards and log π_ref.

DPH-RL (arXiv 2509.07430, §3 and docs/methods.md §2) pre-samples the initial policy once so that
training needs no reference model: for every prompt, n completions at temperature 1.0, scored
by the verifiable reward, with per-token log π_ref stored. Departures from the released code:

- The stored log-probs come from the policy's own forward pass (:func:`lit_rlvr.policy.
  batched_completion_logprobs`) at temperature 1.0 over the full vocabulary, not from the sampler: a
  sampler may truncate (top-p/top-k) or run in another precision, and the divergence estimator
  needs the untruncated π_ref(y).
- The build is resumable and reproducible: prompts are processed in fixed shards, each engine
  call is seeded from the run seed and the ids of its prompts, and each finished shard is
  written atomically (temporary file + rename), then its manifest entry beside it
  (``shard-XXXXX.safetensors.entry.json``), before the manifest lists it. A build that is
  killed at any point and started again skips finished shards and ends byte-identical to an
  uninterrupted one.
- Multi-turn (``environment``): each sample is a trajectory of the initial policy with the
  environment (:class:`~lit_rlvr.rollout.turns.RolloutSampler`, the rollout callback's), scored as
  training scores one (the environment's reward when it gives one, else the reward on the final
  turn); the shard stores its loss mask and the manifest the environments' ``name@version``.
- Several ranks (``rank``/``world_size``) build disjoint shards (shard ``s`` on rank
  ``s mod world_size``) with the same per-call seeds, so an N-rank build is byte-identical to a
  1-rank build; rank 0 assembles the final manifest from the entries once every rank finished
  (:func:`finish_manifest`), and a rerun after any rank died resumes from the finished shards.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save
from tqdm.auto import tqdm

from lit_rlvr.atomic import atomic_file
from lit_rlvr.cache.format import (
    FORMAT_VERSION,
    MANIFEST,
    CacheCorruptError,
    CacheMismatchError,
    dataset_fingerprint,
    file_sha256,
    identity_diff,
    model_fingerprint,
    shard_name,
    tokenizer_fingerprint,
    write_json_atomic,
)
from lit_rlvr.policy import MicroBatching, batched_completion_logprobs
from lit_rlvr.rollout.engine import context_length
from lit_rlvr.rollout.turns import EnvironmentOptions, RolloutSampler, rows_scored_by_rewards
from lit_rlvr.rollout.types import DEFAULT_SAMPLING, Rollouts, SamplingParams

log = logging.getLogger(__name__)

DEFAULT_BATCHING = MicroBatching(padding_free="auto")
"""The log π_ref passes' default micro-batches: training's (``model.batching``'s defaults,
:attr:`lit_rlvr.options.BatchingOptions.micro_batching`, which sits above this module; a test keeps them equal)."""


def call_seed(seed: int, ids: list[str]) -> int:
    """The sampling seed of one engine call: a hash of the run seed and the call's prompt ids.

    Example:
        >>> call_seed(0, ["gsm8k/0"]) == call_seed(0, ["gsm8k/0"]), call_seed(0, ["a"]) == call_seed(1, ["a"])
        (True, False)
    """
    digest = hashlib.sha256(json.dumps([seed, ids]).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@torch.no_grad()
def reference_logprobs(
    model,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    batching: MicroBatching = DEFAULT_BATCHING,
) -> list[np.ndarray]:
    """log π_ref of each completion token given its prompt, at temperature 1.0, in micro-batches.

    Rows are grouped by length (``batching``: a row cap, a token budget, padding-free packing, as
    training's log-prob passes) and each forward is cropped to its longest row, so a short
    completion is not padded to the longest of the call.

    Args:
        model: the policy (a transformers causal LM), in eval mode.
        prompts: B prompt token-id lists (one per completion).
        completions: B completion token-id lists.
        pad_id: padding token id.
        batching: the forward passes' micro-batches (:class:`~lit_rlvr.policy.MicroBatching`).

    Returns:
        B float32 arrays, the i-th of length ``len(completions[i])``.
    """
    if not completions:
        return []
    device = next(model.parameters()).device
    padded = Rollouts(
        prompts, completions, [[0.0] * len(x) for x in completions], ["stop"] * len(completions), n=1
    ).to_padded(pad_id)
    logprobs, _ = batched_completion_logprobs(
        model,
        padded["input_ids"].to(device),
        padded["attention_mask"].to(device),
        padded["response_mask"].shape[1],
        batching=batching,
    )  # (B, T)
    logprobs = logprobs.float().cpu().numpy()
    return [logprobs[i, : len(x)].copy() for i, x in enumerate(completions)]


def _flat(lists: list, dtype) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in lists])
    values = np.concatenate([np.asarray(x, dtype=dtype) for x in lists]) if lists else np.zeros(0, dtype)
    return offsets, values.astype(dtype, copy=False)


def write_shard(
    path: Path,
    ids: list[str],
    prompt_ids,
    completions,
    logprobs,
    rewards,
    finished,
    n,
    correct_threshold,
    statuses=None,
    loss_masks=None,
) -> dict:
    """Write one shard atomically and return its manifest entry (file, bytes, sha256, counts).

    Args:
        path: destination ``shard-XXXXX.safetensors``.
        ids: P prompt row ids.
        prompt_ids: P prompt token-id lists.
        completions: P·n completion token-id lists (prompt-major).
        logprobs: P·n per-token log π_ref arrays.
        rewards: P·n rewards.
        finished: P·n booleans (stopped rather than cut at the length cap).
        n: samples per prompt.
        correct_threshold: a sample counts as passed when its reward is >= this.
        statuses: optional P·n scorer statuses, counted into the shard metadata.
        loss_masks: a multi-turn cache's P·n per-token masks (1: the model's token), else None.
    """
    rewards = np.asarray(rewards, dtype=np.float32)
    prompt_offsets, prompt_tokens = _flat(prompt_ids, np.int32)
    sample_offsets, completion_ids = _flat(completions, np.int32)
    _, ref_logprobs = _flat(logprobs, np.float32)
    arrays = {
        "prompt_offsets": prompt_offsets,
        "prompt_tokens": prompt_tokens,
        "sample_offsets": sample_offsets,
        "completion_ids": completion_ids,
        "ref_logprobs": ref_logprobs,
        "rewards": rewards,
        "finished": np.asarray(finished, dtype=np.uint8),
        "pass_counts": (rewards >= correct_threshold).reshape(len(ids), n).sum(1).astype(np.int32),
    }
    if loss_masks is not None:
        arrays["loss_mask"] = _flat(loss_masks, np.uint8)[1]
    # one metadata key: safetensors writes metadata from a hash map, in no fixed order
    info = {"ids": ids, "status_counts": dict(sorted(Counter(statuses or []).items()))}
    metadata = {"lit_rlvr": json.dumps(info, sort_keys=True)}
    data = save(arrays, metadata=metadata)
    with atomic_file(path, "the reference cache shard") as f:  # complete or absent; errors name it and the free space
        f.write(data)
    return {"file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "num_prompts": len(ids)}


def verify_shard(directory: Path, entry: dict, check_sha256: bool = True) -> None:
    """Raise :class:`CacheCorruptError` if a listed shard is missing, truncated or altered."""
    path = directory / entry["file"]
    if not path.is_file():
        raise CacheCorruptError(f"shard {path} listed in the manifest is missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise CacheCorruptError(f"shard {path} has {size} bytes, the manifest recorded {entry['bytes']} (truncated?)")
    if check_sha256 and (digest := file_sha256(path)) != entry["sha256"]:
        raise CacheCorruptError(
            f"shard {path} sha256 {digest[:12]}… does not match the manifest's {entry['sha256'][:12]}…"
        )


def build_reference_cache(
    out_dir: str | Path,
    rows: list[dict],
    prompt_ids: list[list[int]],
    *,
    engine,
    scorer,
    model,
    tokenizer,
    params: SamplingParams = DEFAULT_SAMPLING,
    prompts_per_shard: int = 256,
    prompts_per_call: int = 1,
    batching: MicroBatching = DEFAULT_BATCHING,
    correct_threshold: float = 1.0,
    progress: bool = True,
    rank: int = 0,
    world_size: int = 1,
    reward_names: list[str] | None = None,
    environment: EnvironmentOptions | None = None,
) -> Path:
    """Sample, score and store π_ref completions for every prompt; resume a partial build in place.

    Args:
        out_dir: cache directory (created; a partial build there is resumed).
        rows: prompt rows (``id``, ``answer``, ``reward``, extras), in dataset order.
        prompt_ids: the token ids of each row's prompt (from :func:`lit_rlvr.data.encode_prompt`).
        engine: has ``generate(prompt_ids, params) -> Rollouts`` (e.g. ``HFEngine``, ``VLLMEngine``).
        scorer: has ``score(completions, rows) -> list`` of results with ``.reward`` and ``.status``
            (e.g. ``lit_rlvr.rewards.BatchScorer``).
        model: the initial policy; its forward pass gives the stored log π_ref (set to eval mode).
        tokenizer: the policy's tokenizer (pad id, decoding when the engine gives no texts).
        params: sampling parameters (default: training's, :data:`~lit_rlvr.rollout.types.DEFAULT_SAMPLING`);
            ``params.n`` is the samples per prompt, ``params.seed`` the run seed: each engine call
            gets :func:`call_seed` of it and the call's prompt ids.
        prompts_per_shard: prompts per shard file (the unit of resumption).
        prompts_per_call: prompts per engine call (larger is faster on vLLM; part of the cache's
            identity because batching changes the sampled streams).
        batching: the log-prob passes' micro-batches (row cap, token budget, packing; default:
            training's, :data:`DEFAULT_BATCHING`).
        correct_threshold: reward at or above which a sample counts as passed.
        progress: show a tqdm progress bar (rank 0).
        rank: this process's rank of ``world_size`` building the cache together (each builds the
            shards ``s`` with ``s % world_size == rank``).
        world_size: ranks building the cache; with more than one, the manifest is only marked
            complete by :func:`finish_manifest` on rank 0 after every rank has returned.
        reward_names: what judges the samples, recorded in the manifest (part of the cache's
            identity; default: the ``reward`` names of the rows the environment does not score,
            :func:`~lit_rlvr.rollout.turns.rows_scored_by_rewards`). With several rewards, the
            correctness reward's (:meth:`~lit_rlvr.rewards.RewardMix.correctness_sources`).
        environment: sample multi-turn trajectories in this environment (None: single-turn
            completions); recorded in the manifest (:meth:`~lit_rlvr.rollout.turns.EnvironmentOptions.identity`).

    Returns:
        The cache directory.
    """
    if len(rows) != len(prompt_ids):
        raise ValueError(f"got {len(rows)} rows but {len(prompt_ids)} prompt token lists")
    if not rows:
        raise ValueError("cannot build a reference cache from zero prompts")
    if prompts_per_shard < 1 or prompts_per_call < 1:
        raise ValueError(
            f"prompts_per_shard and prompts_per_call must be >= 1, got {prompts_per_shard}, {prompts_per_call}"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if params.seed is None:
        raise ValueError("the reference cache needs a sampling seed (sampling.seed) to be reproducible and resumable")
    seed = params.seed
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    n = params.n
    manifest = {
        "format_version": FORMAT_VERSION,
        "model": model_fingerprint(model),
        "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
        "sampling": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(replace(params, seed=None)).items()},
        "rewards": list(reward_names)
        if reward_names is not None
        else sorted({str(r.get("reward")) for r in rows_scored_by_rewards(rows, environment)}),
        "dataset_fingerprint": dataset_fingerprint(rows, prompt_ids),
        "num_prompts": len(rows),
        "n": n,
        "seed": seed,
        "prompts_per_shard": prompts_per_shard,
        "prompts_per_call": prompts_per_call,
        "correct_threshold": correct_threshold,
        "environment": None if environment is None else environment.identity(rows),
        "logprob_temperature": 1.0,
        "complete": False,
        "shards": [],
    }
    done = _resume_shards(out, manifest)
    if rank == 0:
        manifest["shards"] = sorted(done.values(), key=lambda e: e["file"])
        write_json_atomic(out / MANIFEST, manifest)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    found = context_length(engine, model)
    sampler = RolloutSampler(tokenizer, environment, found[0] if found else None)
    num_shards = -(-len(rows) // prompts_per_shard)
    mine = [s for s in range(num_shards) if s % world_size == rank]
    finished_prompts = sum(e["num_prompts"] for e in done.values() if int(e["file"][6:11]) % world_size == rank)
    total = sum(min(prompts_per_shard, len(rows) - s * prompts_per_shard) for s in mine)
    bar = tqdm(
        total=total,
        initial=finished_prompts,
        desc=f"reference cache (rank {rank} of {world_size})" if world_size > 1 else "reference cache",
        unit="prompt",
        disable=not progress or rank != 0,
    )
    for s in mine:
        if shard_name(s) in done:
            continue
        lo, hi = s * prompts_per_shard, min((s + 1) * prompts_per_shard, len(rows))
        shard = {"completions": [], "logprobs": [], "rewards": [], "finished": [], "statuses": [], "loss_masks": []}
        for c in range(lo, hi, prompts_per_call):
            chunk = range(c, min(c + prompts_per_call, hi))
            _sample_chunk(
                chunk, rows, prompt_ids, sampler, engine, scorer, model, tokenizer, params, pad_id, batching, shard
            )
            bar.update(len(chunk))
        entry = write_shard(
            out / shard_name(s),
            [rows[i]["id"] for i in range(lo, hi)],
            prompt_ids[lo:hi],
            shard["completions"],
            shard["logprobs"],
            shard["rewards"],
            shard["finished"],
            n,
            correct_threshold,
            shard["statuses"],
            shard["loss_masks"] if environment is not None else None,
        )
        write_json_atomic(out / _entry_name(entry["file"]), entry)  # the shard's own record of itself
        done[entry["file"]] = entry
        if rank == 0:  # progress visible in the manifest; other ranks' shards are found by their entries
            manifest["shards"] = sorted(done.values(), key=lambda e: e["file"])
            write_json_atomic(out / MANIFEST, manifest)
    bar.close()
    if world_size == 1:
        finish_manifest(out)
    return out


def finish_manifest(out_dir: str | Path) -> dict:
    """Mark a build complete once every shard is there: list every verified shard and drop the entries.

    Called by rank 0 after all ranks returned (or by a 1-rank build at its end).

    Raises:
        CacheCorruptError: a shard is missing (some rank did not finish), naming the first.
    """
    out = Path(out_dir)
    manifest = json.loads((out / MANIFEST).read_text())
    done = _resume_shards(out, manifest)
    num_shards = -(-manifest["num_prompts"] // manifest["prompts_per_shard"])
    missing = [shard_name(s) for s in range(num_shards) if shard_name(s) not in done]
    if missing:
        raise CacheCorruptError(
            f"{out}: {len(missing)} of {num_shards} shards are not built (first: {missing[0]}); a rank did not "
            "finish: run the same command again to resume"
        )
    manifest["shards"] = sorted(done.values(), key=lambda e: e["file"])
    manifest["complete"] = True
    write_json_atomic(out / MANIFEST, manifest)
    for s in range(num_shards):
        (out / _entry_name(shard_name(s))).unlink(missing_ok=True)
    return manifest


def _entry_name(shard_file: str) -> str:
    return shard_file + ".entry.json"


def _sample_chunk(
    chunk, rows, prompt_ids, sampler, engine, scorer, model, tokenizer, params, pad_id, batching, shard
) -> None:
    """Generate (or run trajectories), score and compute log π_ref for the prompts in ``chunk``; append to ``shard``."""
    n = params.n
    ids = [rows[i]["id"] for i in chunk]
    rollouts = sampler(
        engine,
        [prompt_ids[i] for i in chunk],
        [rows[i] for i in chunk],
        replace(params, seed=call_seed(params.seed, ids)),
    )
    if len(rollouts.completion_ids) != n * len(chunk):
        raise RuntimeError(
            f"engine returned {len(rollouts.completion_ids)} completions for {len(chunk)} prompts × n={n}"
        )
    texts, _ = rollouts.final_turns()  # multi-turn: each trajectory's last turn, unless its environment scored it
    texts = texts or tokenizer.batch_decode(rollouts.completion_ids, skip_special_tokens=True)
    sample_rows = [rows[i] for i in chunk for _ in range(n)]
    given = rollouts.environment_rewards() or [None] * len(texts)
    todo = [b for b, g in enumerate(given) if g is None]
    scored = iter(scorer.score([texts[b] for b in todo], [sample_rows[b] for b in todo]) if todo else [])
    results = [next(scored) if g is None else _Given(float(g)) for g in given]
    sample_prompts = [prompt_ids[i] for i in chunk for _ in range(n)]
    shard["logprobs"] += reference_logprobs(model, sample_prompts, rollouts.completion_ids, pad_id, batching)
    shard["completions"] += [list(c) for c in rollouts.completion_ids]
    shard["rewards"] += [float(r.reward) for r in results]
    shard["statuses"] += [str(r.status).split(":")[0] for r in results]
    shard["finished"] += [f != "length" for f in rollouts.finish_reasons]
    shard["loss_masks"] += rollouts.loss_mask or []


@dataclass(frozen=True)
class _Given:
    """A trajectory's reward given by its environment (status ``ok``), in the place of a scorer's result."""

    reward: float
    status: str = "ok"


def _resume_shards(out: Path, manifest: dict) -> dict[str, dict]:
    """Finished shards of a previous build in ``out`` that are intact (listed in its manifest or
    recorded by their entry files); raise if it built something else."""
    path = out / MANIFEST
    if not path.is_file():
        return {}
    try:
        old = json.loads(path.read_text())
        entries = {e["file"]: e for e in old["shards"]}
    except (ValueError, KeyError, TypeError) as err:  # not JSON, or not a manifest's keys: not resumable
        raise CacheMismatchError(
            f"{path} is not a reference cache manifest lit_rlvr can read ({type(err).__name__}: {err}); "
            f"use another directory or delete {out}"
        ) from err
    if diffs := identity_diff(manifest, old):
        raise CacheMismatchError(
            f"{out} holds a reference cache built with different settings; use another directory or "
            "delete it. Differences:\n  " + "\n  ".join(diffs)
        )
    for sidecar in sorted(out.glob("shard-*.safetensors.entry.json")):
        try:
            entry = json.loads(sidecar.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # half-written: the shard is redone
        entries.setdefault(entry["file"], entry)
    done = {}
    for entry in entries.values():
        try:
            verify_shard(out, entry)
        except CacheCorruptError as e:
            log.warning("rebuilding shard: %s", e)
            continue
        done[entry["file"]] = entry
    return done
