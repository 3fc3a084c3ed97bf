"""Reading the reference cache: verified on open, streamed with ``os.pread``, checked against the run.

Only per-prompt and per-sample bookkeeping (ids, offsets, rewards, pass counts: a few bytes per
sample) is held in memory; token ids and log-probs are read on demand by byte range, so memory
stays flat as the cache grows (``benchmarks/cache_memory.py`` measures it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lit_rlvr.cache.builder import verify_shard
from lit_rlvr.cache.format import (
    FORMAT_VERSION,
    MANIFEST,
    CacheCorruptError,
    CacheError,
    CacheMismatchError,
    model_fingerprint,
    pread_array,
    read_safetensors_header,
    tokenizer_fingerprint,
)
from lit_rlvr.contracts import AnchorBatch
from lit_rlvr.rollout.types import Rollouts


@dataclass(frozen=True)
class CachedSample:
    """One stored π_ref sample.

    Attributes:
        prompt_id: the row id of its prompt.
        prompt_ids: prompt token ids.
        completion_ids: ``(T,)`` int32 completion token ids.
        ref_logprobs: ``(T,)`` float32 log π_ref of each completion token (temperature 1.0).
        reward: its reward.
        finished: True if it stopped (EOS/stop string), False if cut at the length cap.
        loss_mask: ``(T,)`` uint8 of a multi-turn cache's trajectory: 1 on the model's tokens, 0 on the
            environment's (None in a single-turn cache).
    """

    prompt_id: str
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    ref_logprobs: np.ndarray
    reward: float
    finished: bool
    loss_mask: np.ndarray | None = None


class _Shard:
    """One shard file: open descriptor, header, and its small bookkeeping arrays in memory."""

    def __init__(self, path: Path):
        self.path = path
        self.header, self.data_start = read_safetensors_header(path)
        self.fd = os.open(path, os.O_RDONLY)
        info = json.loads(self.header.get("__metadata__", {}).get("lit_rlvr", "{}"))
        if "ids" not in info:
            raise CacheCorruptError(f"{path}: not a lit_rlvr cache shard (no 'lit_rlvr' metadata)")
        self.ids: list[str] = info["ids"]
        self.status_counts: dict[str, int] = info["status_counts"]
        small = ("prompt_offsets", "sample_offsets", "rewards", "finished", "pass_counts")
        for name in small:
            setattr(self, name, pread_array(self.fd, self.header[name], self.data_start).copy())

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        return pread_array(self.fd, self.header[name], self.data_start, start, stop)

    def close(self) -> None:
        os.close(self.fd)


class ReferenceCache:
    """A built reference cache, opened read-only.

    Args:
        path: the cache directory.
        verify: ``"sha256"`` (default) re-hashes every shard; ``"size"`` only checks sizes.

    Raises:
        CacheCorruptError: a shard is missing, truncated or altered, or the build is incomplete.
        CacheMismatchError: the format version is not this library's.

    Samples are numbered globally: sample ``j`` of the ``i``-th prompt (dataset order) is
    ``i · n + j``.
    """

    def __init__(self, path: str | Path, verify: str = "sha256"):
        if verify not in ("sha256", "size"):
            raise ValueError(f"verify must be 'sha256' or 'size', got {verify!r}")
        self.path = Path(path)
        manifest_path = self.path / MANIFEST
        if not manifest_path.is_file():
            raise CacheError(f"no reference cache at {self.path} ({MANIFEST} missing); build one with `lit-rlvr cache`")
        self.manifest = json.loads(manifest_path.read_text())
        if self.manifest.get("format_version") != FORMAT_VERSION:
            raise CacheMismatchError(
                f"{self.path}: cache format version {self.manifest.get('format_version')!r}, this library reads "
                f"{FORMAT_VERSION}; build the cache again with this version's `lit-rlvr cache`"
            )
        if not self.manifest.get("complete"):
            done = sum(e["num_prompts"] for e in self.manifest["shards"])
            raise CacheCorruptError(
                f"{self.path}: the build is incomplete ({done} of {self.manifest['num_prompts']} prompts); "
                "run the same `lit-rlvr cache` command again to resume it"
            )
        self._shards: list[_Shard] = []
        for entry in self.manifest["shards"]:
            verify_shard(self.path, entry, check_sha256=verify == "sha256")
            self._shards.append(_Shard(self.path / entry["file"]))
        self.n: int = self.manifest["n"]
        self.prompts_per_shard: int = self.manifest["prompts_per_shard"]
        self.ids: list[str] = [i for s in self._shards for i in s.ids]
        if len(self.ids) != self.manifest["num_prompts"]:
            raise CacheCorruptError(
                f"{self.path}: shards hold {len(self.ids)} prompts, manifest says {self.manifest['num_prompts']}"
            )
        self.pass_counts: np.ndarray = np.concatenate([s.pass_counts for s in self._shards])  # (num_prompts,)
        self.rewards: np.ndarray = np.concatenate([s.rewards for s in self._shards])  # (num_prompts · n,)
        self.index: dict[str, int] = {pid: i for i, pid in enumerate(self.ids)}

    @property
    def multi_turn(self) -> bool:
        """Whether the samples are multi-turn trajectories (sampled with an environment)."""
        return self.manifest.get("environment") is not None

    # ----------------------------------------------------------------------------- identity
    def check(
        self, *, tokenizer=None, dataset_fingerprint: str | None = None, model=None, environment: Any = ...
    ) -> None:
        """Raise :class:`CacheMismatchError` naming every way the run differs from the cache.

        Args:
            tokenizer: the run's tokenizer (its fingerprint must match).
            dataset_fingerprint: :func:`lit_rlvr.cache.format.dataset_fingerprint` of the run's
                training rows and prompt ids.
            model: the run's initial policy (its weight hash must match; costs one pass over the weights).
            environment: the run's environments and turn limits
                (:meth:`~lit_rlvr.rollout.turns.EnvironmentOptions.identity`; None: single-turn
                rollouts; not given: not checked). A cache sampled in another environment, another
                version of it, or without one (or a multi-turn cache for a single-turn run) is refused.
        """
        m, diffs = self.manifest, []
        if tokenizer is not None and (t := tokenizer_fingerprint(tokenizer)) != m["tokenizer_sha256"]:
            diffs.append(f"tokenizer: cache built with tokenizer sha256 {m['tokenizer_sha256'][:12]}…, got {t[:12]}…")
        if dataset_fingerprint is not None and dataset_fingerprint != m["dataset_fingerprint"]:
            diffs.append(
                f"dataset: cache built for {m['num_prompts']} prompts with fingerprint {m['dataset_fingerprint'][:12]}…, "
                f"got {dataset_fingerprint[:12]}… (different files, adapter, prompt template or tokenizer)"
            )
        if model is not None:
            got = model_fingerprint(model)
            if got["weights_sha256"] != m["model"]["weights_sha256"]:
                diffs.append(
                    f"model: cache built with {m['model']['name_or_path']!r} (weights sha256 "
                    f"{m['model']['weights_sha256'][:12]}…), got {got['name_or_path']!r} (weights sha256 {got['weights_sha256'][:12]}…)"
                )
        if environment is not ... and environment != (found := m.get("environment")):
            diffs.append(
                f"environment: cache sampled {_environment(found)}, this run samples {_environment(environment)} "
                "(build the cache with the run's model.environment as its environment)"
                + _option_differences(found, environment)
            )
        if diffs:
            raise CacheMismatchError(f"reference cache {self.path} does not match this run:\n  " + "\n  ".join(diffs))

    # ----------------------------------------------------------------------------- access
    @property
    def num_prompts(self) -> int:
        return len(self.ids)

    @property
    def num_samples(self) -> int:
        return len(self.ids) * self.n

    def base_pass_counts(self) -> dict[str, int]:
        """Each prompt's pass count (of n) under π_ref: the base for the retention metric."""
        return dict(zip(self.ids, self.pass_counts.tolist()))

    def status_counts(self) -> dict[str, int]:
        """Scorer statuses (``ok``, ``no_answer``, ``timeout``, ``error``) over all samples."""
        total: dict[str, int] = {}
        for s in self._shards:
            for k, v in s.status_counts.items():
                total[k] = total.get(k, 0) + v
        return dict(sorted(total.items()))

    def sample(self, index: int) -> CachedSample:
        """The sample with global index ``index`` (prompt ``index // n``, sample ``index % n``)."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample index {index} out of range [0, {self.num_samples})")
        prompt, j = divmod(index, self.n)
        shard, local = divmod(prompt, self.prompts_per_shard)
        s = self._shards[shard]
        row = local * self.n + j
        p0, p1 = s.prompt_offsets[local], s.prompt_offsets[local + 1]
        t0, t1 = s.sample_offsets[row], s.sample_offsets[row + 1]
        return CachedSample(
            prompt_id=s.ids[local],
            prompt_ids=s.read("prompt_tokens", p0, p1),
            completion_ids=s.read("completion_ids", t0, t1),
            ref_logprobs=s.read("ref_logprobs", t0, t1),
            reward=float(s.rewards[row]),
            finished=bool(s.finished[row]),
            loss_mask=s.read("loss_mask", t0, t1) if "loss_mask" in s.header else None,
        )

    def iter_samples(self) -> Iterator[CachedSample]:
        """Every sample in order, streamed (one sample in memory at a time)."""
        for i in range(self.num_samples):
            yield self.sample(i)

    def sample_indices(self, prompt_ids: Sequence[str], which: str = "correct") -> np.ndarray:
        """Global indices of the samples of ``prompt_ids``: all of them, or only the correct ones.

        Args:
            prompt_ids: row ids (e.g. D_pef).
            which: ``"correct"`` (reward >= the build's ``correct_threshold``) or ``"all"``.
        """
        if which not in ("correct", "all"):
            raise ValueError(f"which must be 'correct' or 'all', got {which!r}")
        missing = [p for p in prompt_ids if p not in self.index]
        if missing:
            raise KeyError(f"{len(missing)} prompt ids are not in the cache, e.g. {missing[:3]}")
        prompts = np.sort(np.asarray([self.index[p] for p in prompt_ids], dtype=np.int64))
        idx = (prompts[:, None] * self.n + np.arange(self.n)[None, :]).reshape(-1)
        if which == "correct":
            idx = idx[self.rewards[idx] >= self.manifest["correct_threshold"]]
        return idx

    def anchor_batch(self, indices: Sequence[int], pad_id: int) -> AnchorBatch:
        """The given samples as an :class:`~lit_rlvr.contracts.AnchorBatch`, in the policy's layout
        (prompts left-, completions right-padded; ``ref_logprobs`` 0 on padding)."""

        samples = [self.sample(int(i)) for i in indices]
        padded = Rollouts(
            prompt_ids=[s.prompt_ids.tolist() for s in samples],
            completion_ids=[s.completion_ids.tolist() for s in samples],
            sampler_logprobs=[s.ref_logprobs.tolist() for s in samples],
            finish_reasons=["stop" if s.finished else "length" for s in samples],
            n=1,
            loss_mask=[s.loss_mask.tolist() for s in samples] if self.multi_turn else None,
        ).to_padded(pad_id)
        return AnchorBatch(
            input_ids=padded["input_ids"],
            attention_mask=padded["attention_mask"],
            response_mask=padded["response_mask"],
            ref_logprobs=padded["old_logprobs"],
            rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
            loss_mask=padded.get("loss_mask"),
        )

    def close(self) -> None:
        for s in self._shards:
            s.close()
        self._shards = []

    def __enter__(self) -> ReferenceCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_shards", None):
            self.close()


def _environment(identity: dict | None) -> str:
    """A cache's or a run's environment record, in words."""
    if identity is None:
        return "single-turn completions (no environment)"
    options = f" and options {identity['options']}" if identity.get("options") else ""
    return f"trajectories in {', '.join(identity['environments'])} with turns {identity['turns']}{options}"


def _option_differences(cache: dict | None, run: dict | None) -> str:
    """The environment options in which a run differs from its cache, each named; "" when none do.

    Example:
        >>> _option_differences({"options": {"sql@1": {"max_rows": 20}}}, {"options": {"sql@1": {"max_rows": 5}}})
        '; options differ: sql@1 max_rows: cache 20, this run 5'
    """
    if cache is None or run is None:
        return ""
    ours, theirs = cache.get("options") or {}, run.get("options") or {}

    def shown(options: dict, env: str, key: str) -> str:
        return repr(options[env][key]) if key in options.get(env, {}) else "not set"

    diffs = [
        f"{env} {key}: cache {shown(ours, env, key)}, this run {shown(theirs, env, key)}"
        for env in sorted({*ours, *theirs})
        for key in sorted({*ours.get(env, {}), *theirs.get(env, {})})
        if shown(ours, env, key) != shown(theirs, env, key)
    ]
    return f"; options differ: {'; '.join(diffs)}" if diffs else ""
