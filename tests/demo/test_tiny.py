"""The Hub-less tokenizers and model: the chat tokenizer is one whose tool calls TRL parses and renders."""

from __future__ import annotations

import pytest


def test_the_chat_tokenizer_has_qwen25s_template_which_trl_parses_and_a_saved_policy_reloads(tmp_path):
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import add_response_schema, parse_response, qwen2_5_chat_template

    from lit_rlvr.demo.tiny import build_chat_tokenizer, build_tiny_llama, save_tiny_model

    tok = build_chat_tokenizer()
    assert tok.chat_template == qwen2_5_chat_template  # TRL recognises the template by its text

    def increment(step: int) -> int:
        """Add to the counter.

        Args:
            step: how much to add.
        """
        return step

    call = '<tool_call>\n{"name": "increment", "arguments": {"step": 3}}\n</tool_call><|im_end|>'
    parsed = parse_response(
        add_response_schema(tok), tok(call, add_special_tokens=False).input_ids, prefix=[], tools=[increment]
    )
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "increment", "arguments": {"step": 3}}}]

    prompt = tok.apply_chat_template([{"role": "user", "content": "Count"}], tools=[increment], tokenize=False)
    assert '"name": "increment"' in prompt and "<tools>" in prompt
    path = save_tiny_model(tmp_path / "policy", build_tiny_llama(tok), tok)
    again = AutoTokenizer.from_pretrained(path)
    assert again.chat_template == qwen2_5_chat_template and again(call).input_ids == tok(call).input_ids
    assert AutoModelForCausalLM.from_pretrained(path).config.vocab_size == len(tok)
