"""Fixtures for the environment tests: a tool-calling chat tokenizer, Spider laid out as skyrl-gym expects it."""

from __future__ import annotations

from pathlib import Path

import pytest

TOOL_CORPUS = [
    '<tool_call>\n{"name": "increment", "arguments": {"step": 3}}\n</tool_call>',
    '<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT count(*) FROM singer"}}\n</tool_call>',
    "You are a helpful assistant. What is the counter after adding 3 and 4? It is 7.",
    "# Tools You may call one or more functions to assist with the user query.",
    "<sql>SELECT count(*) FROM singer</sql> <solution>SELECT name FROM singer</solution> <think>count</think>",
]


@pytest.fixture(scope="session")
def tool_tokenizer():
    """A byte-level BPE tokenizer (trained here, 600 entries) with TRL's copy of Qwen2.5's chat
    template, which renders tools and tool calls and which TRL's ``add_response_schema`` knows."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen2_5_chat_template

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    backend.train_from_iterator(TOOL_CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=specials[1:], chat_template=qwen2_5_chat_template)  # fmt: skip


@pytest.fixture(scope="session")
def spider_dev(shared_data) -> Path:
    root = shared_data / "spider_dev"
    if not (root / "dev.json").is_file():
        pytest.skip(f"Spider dev not found under {root}")
    return root


@pytest.fixture
def skyrl_sql_root(spider_dev, tmp_path) -> Path:
    """A folder laid out as skyrl-gym's SQLEnv reads Spider (``<root>/spider/database/<db>/<db>.sqlite``),
    linking to the read-only data (nothing copied)."""
    (tmp_path / "spider").mkdir()
    (tmp_path / "spider" / "database").symlink_to(spider_dev / "database")
    return tmp_path
