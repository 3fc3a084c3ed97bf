"""Warm start: example stream, completion-only labels, HF save/reload, reuse without retraining."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

from lit_rlvr.demo import warmstart as ws
from lit_rlvr.demo.countdown import countdown_reward, split_countdown
from lit_rlvr.demo.data import DEMO_CHARS
from lit_rlvr.demo.tiny import build_char_tokenizer

REPO = Path(__file__).resolve().parents[2]
TINY = dict(
    steps=3,
    hidden_size=32,
    num_layers=1,
    num_heads=1,
    head_dim=32,
    intermediate_size=64,
    batch_size=8,
    warmup_steps=1,
    eval_samples=2,
    progress_bar=False,
)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer(DEMO_CHARS)


@pytest.mark.parametrize("seed", [0, 1])
def test_examples_are_valid_and_never_held_out(seed):
    rng = random.Random(seed)
    train, held = split_countdown(seed)
    held_keys = set(held)
    for _ in range(300):
        row, completion = ws.countdown_example(rng, train)
        assert countdown_reward(completion, row["answer"], digits=row["digits"]) == 1.0
        assert ("".join(sorted(row["digits"])), int(row["answer"])) not in held_keys


def test_every_base_seed_holds_out_the_data_files_prompts(tok, tmp_path):
    """Another warm-start seed is another base on the same split: the data files' held-out prompts stay out."""
    from lit_rlvr.demo.data import addition_val_pairs, read_rows, write_demo_data

    paths = write_demo_data(tmp_path)  # the demo's files (seed 0)
    held = {("".join(sorted(r["digits"])), int(r["answer"])) for r in read_rows(paths["countdown_val"])}
    additions = {(r["a"], r["b"]) for r in read_rows(paths["addition_val"])}
    for seed in (0, 1, 2):
        data = ws.WarmStartData(tok, batch_size=8, seed=seed)
        assert not held & set(data.train_pairs) and set(data.val_pairs) == held
        assert data.addition_exclude == additions == set(addition_val_pairs(0))
    assert (
        ws.WarmStartData(tok, batch_size=8, seed=1, data_seed=1).train_pairs != data.train_pairs
    )  # data_seed moves the split


def test_addition_examples_skip_excluded_pairs():
    exclude = frozenset((a, b) for a in range(10) for b in range(10) if (a + b) % 2)  # half of all 1-digit pairs
    rng = random.Random(0)
    for _ in range(200):
        row, completion = ws.addition_example(rng, 1, exclude)
        a, b = int(row["prompt"][1]), int(row["prompt"][3])
        assert (a, b) not in exclude and completion == "\\boxed{" + f"{a + b:02d}" + "}" and row["answer"] == str(a + b)


def test_stream_labels_cover_completion_only(tok):
    data = ws.WarmStartData(tok, batch_size=16, seed=0)
    batch = next(iter(data.train_dataloader()))
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert ids.shape == mask.shape == labels.shape and ids.shape[0] == 16
    for b in range(16):
        text = tok.decode(ids[b][mask[b].bool()].tolist())
        target = labels[b][labels[b] != ws.IGNORE_INDEX].tolist()
        prompt, completion = text.split("\n", 1)  # default PromptFormat ends the prompt with "\n"
        assert target[-1] == tok.eos_token_id
        assert tok.decode(target[:-1]) == completion.removesuffix("<eos>")
        assert prompt[0] in "CA" and completion.endswith("<eos>")
        n_prompt = len(tok(prompt + "\n", add_special_tokens=False).input_ids)
        assert (labels[b, :n_prompt] == ws.IGNORE_INDEX).all()


def test_warmstart_saves_reloads_and_reuses(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    out = ws.warmstart(tmp_path / "base", **TINY)
    info = json.loads((out / ws.INFO_FILE).read_text())
    assert info["steps_done"] == 3 and info["settings"]["steps"] == 3
    for name in ("countdown_val", "addition_val"):
        m = info["metrics"][name]
        assert 0.0 <= m["pass@1"] <= 1.0 and m["prompts"] == (142 if name == "countdown_val" else 200)
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("C375=026:").input_ids == build_char_tokenizer(DEMO_CHARS)("C375=026:").input_ids
    assert model.config.head_dim == 32 and model.config.tie_word_embeddings

    def no_training(*args, **kwargs):
        raise AssertionError("a finished warm start with the same settings must be reused")

    monkeypatch.setattr(ws.pl, "Trainer", no_training)
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert ws.warmstart(tmp_path / "base", **TINY) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    with pytest.raises(AssertionError, match="must be reused"):  # other settings: trains again
        ws.warmstart(tmp_path / "base", **{**TINY, "steps": 4})


def test_measure_summary(tok):
    from lit_rlvr.demo.tiny import build_tiny_llama

    model = build_tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=1, head_dim=32, intermediate_size=32)
    rows = [{"id": "a", "prompt": "C375=026:", "answer": "26"}, {"id": "b", "prompt": "A001+002=", "answer": "3"}]
    all_ok = ws.measure(model, tok, rows, lambda c, a, **r: 1.0, n_samples=4, ks=(1, 4), max_new_tokens=3)
    assert all_ok["pass@1"] == all_ok["pass@4"] == all_ok["solved"] == 1.0 and all_ok["prompts"] == 2
    assert 1.0 <= all_ok["distinct_correct"] <= 4.0
    none_ok = ws.measure(model, tok, rows, lambda c, a, **r: 0.0, n_samples=4, ks=(1,), max_new_tokens=3)
    assert none_ok["pass@1"] == none_ok["distinct_correct"] == none_ok["solved"] == 0.0


def test_shipped_config_parses():
    parser = ws.build_parser()
    cfg = parser.instantiate(parser.parse_args(["--config", str(REPO / "configs/demo/warmstart.yaml"), "--steps", "7"]))
    assert cfg.steps == 7 and cfg.num_layers == 5 and cfg.head_dim == 32 and cfg.eval_samples == 32
    assert cfg.prompt_format == ws.PromptFormat()
    other = parser.parse_args(
        ["--config", str(REPO / "configs/demo/warmstart.yaml"), "--seed", "1"]
    )  # docs/demo.md: another base
    assert (
        other.seed == 1 and other.data_seed == 0 and other.steps == 200
    )  # the demo's regime (benchmarks/results/study2_plan.md)


def test_checker_trajectories_train_the_models_turns_only_on_training_pairs():
    """The warm start's multi-turn examples: the checker's answers are its own, in the prompt's context,
    but not trained on; the model's turns are; the held-out pairs never appear; '?' joins the vocabulary."""
    from lit_rlvr.demo.agents import CHECK, CountdownChecker, checker_trajectory

    tok = build_char_tokenizer(DEMO_CHARS + CHECK)
    data = ws.WarmStartData(tok, batch_size=64, seed=0, countdown_share=0.0, checker_share=1.0, checker_turns=3)
    batch = next(iter(data.train_dataloader()))
    ids, labels = batch["input_ids"], batch["labels"]
    checks = 0
    for b in range(64):
        real = ids[b][batch["attention_mask"][b].bool()].tolist()
        trained = [t for t, label in zip(real, labels[b].tolist()) if label != ws.IGNORE_INDEX]
        text = tok.decode(real, skip_special_tokens=True)
        prompt, completion = text.split("\n", 1)
        env = CountdownChecker()
        env.reset({"answer": str(int(prompt[5:8])), "digits": prompt[1:4]}, 3)
        turns = [t + mark for t, mark in zip(re.split(r"[?;]", completion)[:-1], re.findall(r"[?;]", completion))]
        model_text, replay = "", ""
        for (
            turn
        ) in turns:  # replay the model's turns through the checker: its answers are the trajectory's environment text
            expression = turn.split("\n")[-1]
            model_text, replay = model_text + expression, replay + expression
            if turn.endswith(CHECK):
                replay += env.step(expression).observation
                checks += 1
        assert replay == completion and tok.decode(trained, skip_special_tokens=True) == model_text
        assert (
            trained[-1] == tok.eos_token_id
            and countdown_reward(turns[-1].split("\n")[-1], str(int(prompt[5:8])), digits=prompt[1:4]) == 1.0
        )
        assert ("".join(sorted(prompt[1:4])), int(prompt[5:8])) not in set(data.val_pairs)
    assert checks > 10
    rng = random.Random(3)
    assert {
        len([p for p in checker_trajectory(rng, data.train_pairs, max_turns=2)[1] if not p[1]]) for _ in range(200)
    } == {0, 1}
