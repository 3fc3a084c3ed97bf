"""Model construction helpers (tiny local models for tests and the CPU demo)."""

from lit_rlvr.models.tiny import build_char_tokenizer, build_tiny_llama, save_tiny_model

__all__ = ["build_char_tokenizer", "build_tiny_llama", "save_tiny_model"]
