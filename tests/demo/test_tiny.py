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


def test_the_bpe_tokenizer_is_deterministic_spells_digits_and_keeps_each_word_one_token(tmp_path):
    from transformers import AutoTokenizer

    from lit_rlvr.demo.tiny import DEFAULT_CHARS, SPECIAL_TOKENS, build_bpe_tokenizer

    texts = [
        "<sql>SELECT name FROM sqlite_master</sql>",
        "<solution>SELECT max(a) FROM lamps WHERE g=10</solution>",
    ] * 40
    tok = build_bpe_tokenizer(texts, 140, words=["lamps", "birds"])
    assert build_bpe_tokenizer(texts, 140, words=["lamps", "birds"]).get_vocab() == tok.get_vocab()
    assert len(tok) == 142 and tok.convert_ids_to_tokens(list(range(4))) == list(SPECIAL_TOKENS)
    text = "<solution>SELECT max(a) FROM birds WHERE g=1024</solution>"
    pieces = tok.tokenize(text)
    assert "birds" in pieces and [p for p in pieces if any(c.isdigit() for c in p)] == ["1", "0", "2", "4"]
    assert len(pieces) < len(text) / 3 and tok.decode(tok(text).input_ids) == text
    assert all(tok.tokenize(c) == [c] for c in DEFAULT_CHARS)  # any text is still written
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text).input_ids == tok(text).input_ids and again.eos_token == "<eos>"
    with pytest.raises(ValueError, match="vocab_size must cover the special tokens and the 96 characters; got 50"):
        build_bpe_tokenizer(texts, 50)
