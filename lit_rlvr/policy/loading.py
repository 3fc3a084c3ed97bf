"""Loading the policy: a transformers causal LM and its tokenizer, optionally wrapped with a peft LoRA adapter.

:class:`PolicyOptions` is the ``model.policy`` option group; :func:`load_policy` is the one place
a policy is loaded, and :func:`base_model` the one place a peft wrapper is seen through.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is a peft wrapper (has adapters that can be merged)."""
    return hasattr(model, "peft_config") and hasattr(model, "merge_adapter")


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (``model`` itself when it has none)."""
    return model.get_base_model() if is_peft_model(model) else model


@dataclass(frozen=True)
class LoraOptions:
    """peft LoRA settings (``peft.LoraConfig`` names).

    Args:
        r: rank.
        alpha: scaling numerator (``lora_alpha``).
        dropout: ``lora_dropout``.
        target_modules: module names, or ``"all-linear"``.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class PolicyOptions:
    """What to load as the policy (``model.policy``).

    Args:
        path: local directory or hub name of a transformers causal LM (its tokenizer too).
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        attn_implementation: passed to ``from_pretrained`` (``sdpa``, ``flash_attention_2``, …).
        gradient_checkpointing: trade compute for activation memory.
        lora: train a peft LoRA adapter instead of all weights (None = full fine-tuning).
    """

    path: str
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn_implementation: str | None = None
    gradient_checkpointing: bool = False
    lora: LoraOptions | None = None

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"model.policy.dtype: unknown dtype {self.dtype!r}; valid: {sorted(DTYPES)}")


def load_policy(options: PolicyOptions) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """Load the causal LM and its tokenizer that ``options`` name, with a LoRA adapter when asked.

    The policy comes back in train mode, as a trained module should be: transformers loads in eval
    mode, in which gradient checkpointing is off (it runs only while ``training``) and Lightning warns
    of modules left in eval mode. Each no-grad pass (rollouts, log-probs) switches to eval mode and
    back, and validation runs in eval mode.

    Raises:
        ValueError: a path that cannot be loaded (naming it and why).
    """
    kwargs = {"dtype": DTYPES[options.dtype]}
    if options.attn_implementation:
        kwargs["attn_implementation"] = options.attn_implementation
    path = options.path
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        policy = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as err:
        what = (
            "a directory without a loadable model"
            if Path(path).exists()
            else "no local directory and not loadable from the hub"
        )
        raise ValueError(f"model.policy.path: cannot load {path!r}: {what} ({err})") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if options.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy.config.use_cache = False
    lora = options.lora
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
            task_type="CAUSAL_LM",
        )
        policy = get_peft_model(policy, config)
    return policy.train(), tokenizer
