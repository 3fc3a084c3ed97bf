"""PromptDataModule with a reference cache: D_exp prompts for RL, D_pef correct samples as anchors."""

from __future__ import annotations

import json

import pytest
import torch

from lit_rlvr.cache import CacheMismatchError, ReferenceCache
from lit_rlvr.data import CacheOptions, DatasetSpec, PromptDataModule, PromptFormat


@pytest.fixture
def toy_jsonl(tmp_path, toy_rows):
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps({k: r[k] for k in ("prompt", "answer", "reward")}) + "\n" for r in toy_rows[0]))
    return str(path)


def _dm(tiny_model_dir, path, cache, **kw):
    kw.setdefault("batch_size", 3)
    cache_kw = {k: kw.pop(k) for k in ("perfect_threshold", "anchor_samples") if k in kw}
    return PromptDataModule(
        str(tiny_model_dir),
        train=DatasetSpec(path, "jsonl", name="toy"),
        cache=CacheOptions(str(cache), anchor_batch_size=5, **cache_kw),
        **kw,
    )


def _stored(cache: ReferenceCache) -> dict[tuple, tuple]:
    """(prompt ids, completion ids) -> (prompt id, reward, ref log-probs) for every cached sample."""
    return {
        (tuple(s.prompt_ids.tolist()), tuple(s.completion_ids.tolist())): (
            s.prompt_id,
            s.reward,
            s.ref_logprobs.tolist(),
        )
        for s in cache.iter_samples()
    }


@pytest.mark.parametrize(("threshold", "which"), [(None, "correct"), (3, "correct"), (3, "all")])
def test_train_batches_are_d_exp_and_anchors_are_d_pef_samples(
    tiny_model_dir, toy_jsonl, built_cache, threshold, which
):
    dm = _dm(tiny_model_dir, toy_jsonl, built_cache, perfect_threshold=threshold, anchor_samples=which)
    dm.setup("fit")
    cache = dm.reference_cache
    n = cache.n
    t = n if threshold is None else threshold
    pef = {p for p, c in cache.base_pass_counts().items() if c >= t}
    exp = set(cache.ids) - pef
    assert set(dm.split.pef) == pef and set(dm.split.exp) == exp and pef and exp
    stored = _stored(cache)
    loader = dm.train_dataloader()
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        ids = []
        for batch in loader:
            ids += [r["id"] for r in batch.rows]
            a = batch.anchor.tensors()
            assert a["input_ids"].shape[0] == 5 and a["ref_logprobs"].shape == a["response_mask"].shape
            Lp = a["input_ids"].shape[1] - a["response_mask"].shape[1]
            for k in range(5):
                prompt = a["input_ids"][k, :Lp][a["attention_mask"][k, :Lp].bool()].tolist()
                resp = a["response_mask"][k].bool()
                completion = a["input_ids"][k, Lp:][resp].tolist()
                pid, reward, logprobs = stored[(tuple(prompt), tuple(completion))]
                assert pid in pef and (which == "all" or reward >= 1.0)
                assert a["ref_logprobs"][k][resp].tolist() == pytest.approx(logprobs, abs=0)
        assert sorted(ids) == sorted(exp)  # every D_exp prompt once per epoch, no D_pef prompt
    want = sum(1 for (pid, r, _) in stored.values() if pid in pef and (which == "all" or r >= 1.0))
    assert len(dm._anchor_index) == want


def test_anchor_stream_and_prompts_resume_exactly(tiny_model_dir, toy_jsonl, built_cache):
    def make():
        dm = _dm(tiny_model_dir, toy_jsonl, built_cache, perfect_threshold=3, batch_size=2)
        dm.setup("fit")
        return dm, dm.train_dataloader()

    dm, loader = make()
    full = []
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        full += [dm.on_before_batch_transfer(b, 0) for b in loader]
    E = len(loader)
    for consumed in range(1, len(full)):
        first, loader1 = make()
        batches = (b for e in range(2) if loader1.sampler.set_epoch(e) is None for b in loader1)
        for _ in range(consumed):  # what training took before the checkpoint
            first.on_before_batch_transfer(next(batches), 0)
        second, loader2 = make()
        second.load_state_dict(first.state_dict())
        loader2.sampler.set_epoch(consumed // E)  # the epoch Lightning resumes in
        nxt = next(iter(loader2))
        assert [r["id"] for r in nxt.rows] == [r["id"] for r in full[consumed].rows]
        assert all(
            torch.equal(a, b) for a, b in zip(nxt.anchor.tensors().values(), full[consumed].anchor.tensors().values())
        )


def test_cache_of_other_prompts_or_tokenizer_is_refused(tmp_path, tiny_model_dir, toy_jsonl, built_cache):
    dm = _dm(tiny_model_dir, toy_jsonl, built_cache, prompt=PromptFormat(instruction="Question: {prompt}"))
    with pytest.raises(CacheMismatchError, match="dataset: cache built for 12 prompts"):
        dm.setup("fit")
    from lit_rlvr.demo.tiny import build_char_tokenizer

    build_char_tokenizer("0123456789qsay: ").save_pretrained(tmp_path / "tok")
    with pytest.raises(CacheMismatchError, match="tokenizer"):
        PromptDataModule(
            str(tmp_path / "tok"), train=DatasetSpec(toy_jsonl, name="toy"), cache=CacheOptions(str(built_cache))
        ).setup("fit")


def test_base_pass_counts_exposed_for_retention(tiny_model_dir, toy_jsonl, built_cache):
    dm = _dm(tiny_model_dir, toy_jsonl, built_cache)
    dm.setup("fit")
    counts = dm.base_pass_counts
    with ReferenceCache(built_cache) as cache:
        by_prompt = {}
        for s in cache.iter_samples():
            by_prompt[s.prompt_id] = by_prompt.get(s.prompt_id, 0) + (s.reward >= 1.0)
    assert counts == by_prompt and set(counts) == {f"toy/{i}" for i in range(12)}


def _truncate_a_shard(folder):
    shard = sorted(folder.glob("shard-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])


DAMAGE = {
    "missing": (None, r"no reference cache at .*manifest.json missing.*build one with `lit-rlvr cache`"),
    "a truncated shard": (_truncate_a_shard, r"truncated.*run the `lit-rlvr cache` command that built it again"),
    "a manifest that is not JSON": (
        lambda folder: (folder / "manifest.json").write_text("{not json"),
        r"not a reference cache lit_rlvr can read \(JSONDecodeError.*build it again with `lit-rlvr cache`",
    ),
    "a manifest of another format": (
        lambda folder: (folder / "manifest.json").write_text("[1, 2]"),
        r"not a reference cache lit_rlvr can read \(AttributeError.*build it again with `lit-rlvr cache`",
    ),
}


@pytest.mark.parametrize(("damage", "match"), DAMAGE.values(), ids=DAMAGE)
def test_a_cache_that_is_missing_or_damaged_is_a_start_up_error_naming_its_path(
    tmp_path, tiny_model_dir, toy_jsonl, built_cache, damage, match
):
    """Refused at set-up with what to do (``lit-rlvr`` exits 2 with the message), not a traceback."""
    import shutil

    from lit_rlvr.contracts import StartupError

    folder = tmp_path / "cache"
    if damage is not None:
        shutil.copytree(built_cache, folder)
        damage(folder)
    with pytest.raises(StartupError, match=match) as refused:
        _dm(tiny_model_dir, toy_jsonl, folder).setup("fit")
    assert str(refused.value).startswith(f"data.cache.path={str(folder)!r}: ")
