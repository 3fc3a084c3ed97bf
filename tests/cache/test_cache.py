"""Reference cache: stored log-probs are π_ref's, builds resume byte-identically, damage and mismatches are caught."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_rlvr.cache import (
    CacheCorruptError,
    CacheMismatchError,
    ReferenceCache,
    dataset_fingerprint,
    split_by_pass_count,
    summary,
    tokenizer_fingerprint,
)
from lit_rlvr.policy import sequence_logprob


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


class CountingEngine:
    def __init__(self, engine):
        self.engine, self.prompts = engine, 0

    def generate(self, prompt_ids, params):
        self.prompts += len(prompt_ids)
        return self.engine.generate(prompt_ids, params)


def test_stored_logprobs_equal_fresh_forward_pass(built_cache, tiny, toy_rows, kit):
    PARAMS, contains_any = kit.PARAMS, kit.contains_any
    model, tok = tiny
    rows, ids = toy_rows
    with ReferenceCache(built_cache) as cache:
        assert cache.num_samples == len(rows) * PARAMS.n
        for i, s in enumerate(cache.iter_samples()):
            row = rows[i // PARAMS.n]
            assert s.prompt_id == row["id"] and s.prompt_ids.tolist() == ids[i // PARAMS.n]
            assert 1 <= len(s.completion_ids) <= PARAMS.max_new_tokens
            fresh = sequence_logprob(model, ids[i // PARAMS.n], s.completion_ids.tolist())  # (T,) unpadded, fp32
            torch.testing.assert_close(torch.from_numpy(s.ref_logprobs.copy()), fresh, atol=1e-5, rtol=0)
            text = tok.decode(s.completion_ids.tolist(), skip_special_tokens=True)
            assert s.reward == contains_any(text, row["answer"])


def test_pass_counts_are_correct_samples_per_prompt(built_cache, toy_rows):
    with ReferenceCache(built_cache) as cache:
        rewards = np.array([s.reward for s in cache.iter_samples()]).reshape(-1, cache.n)
        assert cache.pass_counts.tolist() == (rewards >= 1.0).sum(1).tolist()
        assert cache.base_pass_counts() == dict(zip([r["id"] for r in toy_rows[0]], (rewards >= 1.0).sum(1).tolist()))
        hist = np.bincount(cache.pass_counts, minlength=cache.n + 1)
        assert hist[cache.n] > 0 and hist[: cache.n].sum() > 0, f"toy task should give a non-trivial split, got {hist}"
        assert "|D_pef| = " in summary(cache) and f"{cache.n}/{cache.n}:" in summary(cache)


@pytest.mark.parametrize("kill_after_calls", [1, 3, 4, 11])
def test_interrupted_build_resumes_to_byte_identical_cache(
    tmp_path, built_cache, tiny, toy_rows, kill_after_calls, kit
):
    build, make_engine = kit.build, kit.make_engine
    model, tok = tiny
    rows, ids = toy_rows
    out = tmp_path / "ref"
    with pytest.raises(KeyboardInterrupt):
        build(out, rows, ids, model, tok, engine=kit.FailAfter(make_engine(model, tok), kill_after_calls))
    done_shards = kill_after_calls // 3  # prompts_per_call=1, prompts_per_shard=3
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["complete"] and len(manifest["shards"]) == done_shards
    with pytest.raises(CacheCorruptError, match="incomplete"):
        ReferenceCache(out)
    # a kill inside a shard write leaves a temporary file and possibly an unlisted shard: both are redone
    (out / "shard-00003.safetensors.tmp").write_bytes(b"partial")
    (out / f"shard-{done_shards:05d}.safetensors").write_bytes(b"unlisted garbage")
    counter = CountingEngine(make_engine(model, tok))
    build(out, rows, ids, model, tok, engine=counter)
    assert counter.prompts == len(rows) - 3 * done_shards  # finished prompts are not recomputed
    assert _files(out) == _files(built_cache)


def test_corrupt_truncated_and_missing_shards_are_detected(tmp_path, built_cache, tiny, toy_rows, kit):
    build, make_engine = kit.build, kit.make_engine
    corrupt = shutil.copytree(built_cache, tmp_path / "corrupt")
    shard = corrupt / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF  # one flipped bit pattern inside the log-probs
    shard.write_bytes(bytes(data))
    ReferenceCache(corrupt, verify="size").close()  # same size: only the hash can see it
    with pytest.raises(CacheCorruptError, match="sha256"):
        ReferenceCache(corrupt)
    truncated = shutil.copytree(built_cache, tmp_path / "truncated")
    (truncated / "shard-00002.safetensors").write_bytes((built_cache / "shard-00002.safetensors").read_bytes()[:-10])
    with pytest.raises(CacheCorruptError, match="truncated"):
        ReferenceCache(truncated, verify="size")
    (truncated / "shard-00002.safetensors").unlink()
    with pytest.raises(CacheCorruptError, match="missing"):
        ReferenceCache(truncated)
    # rebuilding in place repairs the damaged shard and only it
    model, tok = tiny
    counter = CountingEngine(make_engine(model, tok))
    build(corrupt, *toy_rows, model, tok, engine=counter)
    assert counter.prompts == 3 and _files(corrupt) == _files(built_cache)
    # a manifest that is not one cannot be resumed: the build refuses it, naming it, before sampling
    (corrupt / "manifest.json").write_text("{not json")
    with pytest.raises(CacheMismatchError, match=r"manifest.json is not a reference cache manifest .*delete"):
        build(corrupt, *toy_rows, model, tok, engine=counter)
    assert counter.prompts == 3


def test_mismatched_model_tokenizer_and_dataset_are_named(tmp_path, built_cache, tiny, toy_rows, kit):
    PARAMS, make_engine = kit.PARAMS, kit.make_engine
    from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama

    model, tok = tiny
    rows, ids = toy_rows
    with ReferenceCache(built_cache) as cache:
        cache.check(tokenizer=tok, dataset_fingerprint=dataset_fingerprint(rows, ids), model=model)
        other_model = build_tiny_llama(build_char_tokenizer(), seed=1)
        with pytest.raises(CacheMismatchError, match=r"model: cache built with .*weights sha256"):
            cache.check(model=other_model)
        with pytest.raises(CacheMismatchError, match="tokenizer"):
            cache.check(tokenizer=build_char_tokenizer("abc"))
        with pytest.raises(CacheMismatchError, match="dataset"):
            cache.check(dataset_fingerprint=dataset_fingerprint(rows, [i + [5] for i in ids]))
    # resuming into a directory built with other settings refuses instead of mixing caches
    clash = shutil.copytree(built_cache, tmp_path / "clash")
    with pytest.raises(CacheMismatchError, match="seed"):
        from lit_rlvr.cache import build_reference_cache

        build_reference_cache(
            clash,
            rows,
            ids,
            engine=make_engine(model, tok),
            scorer=None,
            model=model,
            tokenizer=tok,
            params=replace(PARAMS, seed=8),
            prompts_per_shard=3,
            progress=False,
        )


def test_tokenizer_fingerprint_survives_save_and_reload(tmp_path, tiny):
    from transformers import AutoTokenizer

    _, tok = tiny
    tok.save_pretrained(tmp_path)
    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(tmp_path)) == tokenizer_fingerprint(tok)


@pytest.mark.parametrize("threshold", [None, 1, 2, 3, 4])
@pytest.mark.parametrize("which", ["correct", "all"])
def test_split_and_anchor_samples_are_exactly_the_right_rows(built_cache, threshold, which):
    with ReferenceCache(built_cache) as cache:
        samples = list(cache.iter_samples())
        n = cache.n
        passes = {p: sum(s.reward >= 1.0 for s in samples if s.prompt_id == p) for p in cache.ids}
        t = n if threshold is None else threshold
        split = split_by_pass_count(cache.ids, cache.pass_counts, n, threshold)
        assert list(split.pef) == [p for p in cache.ids if passes[p] >= t]
        assert list(split.exp) == [p for p in cache.ids if passes[p] < t]
        want = [i for i, s in enumerate(samples) if s.prompt_id in split.pef and (which == "all" or s.reward >= 1.0)]
        assert cache.sample_indices(split.pef, which).tolist() == want


def test_anchor_batch_holds_the_stored_samples(built_cache):
    with ReferenceCache(built_cache) as cache:
        idx = [5, 0, 17, 47]
        batch = cache.anchor_batch(idx, pad_id=0).tensors()
        A = len(idx)
        assert batch["input_ids"].shape[0] == A and batch["ref_logprobs"].shape == batch["response_mask"].shape
        Lp = batch["input_ids"].shape[1] - batch["response_mask"].shape[1]
        for a, i in enumerate(idx):
            s = cache.sample(i)
            mask = batch["attention_mask"][a].bool()
            assert batch["input_ids"][a][mask].tolist() == s.prompt_ids.tolist() + s.completion_ids.tolist()
            resp = batch["response_mask"][a].bool()
            assert batch["input_ids"][a, Lp:][resp].tolist() == s.completion_ids.tolist()
            assert torch.equal(batch["ref_logprobs"][a][resp], torch.from_numpy(s.ref_logprobs.copy()))
            assert batch["rewards"][a].item() == s.reward


def test_split_rejects_threshold_out_of_range():
    with pytest.raises(ValueError, match=r"perfect_threshold must be in \[1, n=8\], got 9"):
        split_by_pass_count(["a"], [8], n=8, perfect_threshold=9)
