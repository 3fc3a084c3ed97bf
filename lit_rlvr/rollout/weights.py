"""The policy's weights as an inference engine wants them: merged LoRA, base-model names, or the adapter alone.

A PEFT (LoRA) policy's state dict names its tensors ``base_model.model.<name>`` with the frozen
weight under ``<module>.base_layer.weight`` and the adapters under ``lora_A``/``lora_B``.
An engine serving the base architecture wants ``<name>`` and the effective weight
W + (α/r)·B·A. :func:`sync_weights` merges the adapters in place, yields the renamed tensors,
and unmerges on exit, so training continues on the unmerged adapters; with ``merged=False`` it
yields the frozen base weights W alone. An engine that serves the adapter itself (vLLM's LoRA
support, :mod:`lit_rlvr.rollout.adapters`) takes W once and then :func:`adapter_tensors`, the
A and B matrices under PEFT's own names, after every step.

Under FSDP2 each tensor of the state dict is a shard (a ``DTensor``): the stream gathers one
parameter at a time (``full_tensor()``, an all-gather every rank joins in the same order) and
keeps none, so an engine loading it never sits beside a whole unsharded copy of the model.
PEFT's merge and unmerge run on the shards as DTensor operations (measured on 2 gloo
processes: the streamed tensors equal the unsharded merged weights exactly).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from lit_rlvr.policy.loading import base_model, is_peft_model

_PEFT_PREFIX = "base_model.model."
_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+\.")


def base_weight_name(name: str) -> str | None:
    """Map a PEFT state-dict key to the base model's key, or None for adapter-only tensors.

    Example:
        >>> base_weight_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")
        'model.layers.0.self_attn.q_proj.weight'
        >>> base_weight_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
        True
        >>> base_weight_name("base_model.model.lm_head.modules_to_save.default.weight")
        'lm_head.weight'
        >>> base_weight_name("base_model.model.lm_head.original_module.weight") is None
        True
        >>> base_weight_name("model.norm.weight")
        'model.norm.weight'
    """
    if ".lora_" in name or ".original_module." in name:
        return None
    name = name.removeprefix(_PEFT_PREFIX)
    name = name.replace(".base_layer.", ".")
    return _MODULES_TO_SAVE.sub(".", name)


@contextmanager
def sync_weights(model: nn.Module, merged: bool = True) -> Iterator[Iterator[tuple[str, Tensor]]]:
    """Yield ``(base_name, tensor)`` pairs of the policy's effective weights (``merged``) or its base weights.

    For a PEFT model the adapters are merged on entry and unmerged on exit (even on error);
    with ``merged=False`` they are left out and the frozen base weights come as they are.
    Tensors are detached views (gathered copies under FSDP2), valid only inside the ``with``
    block. Under FSDP2 every rank must consume the whole iterator.

    Example:
        >>> lin = nn.Linear(2, 1)
        >>> with sync_weights(lin) as weights:
        ...     sorted(name for name, _ in weights)
        ['bias', 'weight']
    """
    peft = merged and is_peft_model(model)
    if peft:
        model.merge_adapter()
    try:
        yield _renamed(model.state_dict())
    finally:
        if peft:
            model.unmerge_adapter()


def _renamed(state_dict: dict[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    for name, tensor in state_dict.items():
        base = base_weight_name(name)
        if base is not None:
            yield base, _full_tensor(tensor).detach()


def adapter_tensors(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` of the policy's active LoRA adapter, named as PEFT saves it (what vLLM loads).

    The names are ``base_model.model.<module>.lora_A.weight`` (the adapter's name dropped), the
    tensors detached (gathered copies under FSDP2, in the state dict's order on every rank, so
    every rank must consume the whole iterator). The base weights are not among them.

    Example:
        >>> from peft import LoraConfig, get_peft_model
        >>> lora = get_peft_model(nn.Sequential(nn.Linear(4, 4)), LoraConfig(r=2, target_modules=["0"]))
        >>> [(name, tuple(t.shape)) for name, t in adapter_tensors(lora)]
        [('base_model.model.0.lora_A.weight', (2, 4)), ('base_model.model.0.lora_B.weight', (4, 2))]
    """
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(
        model, state_dict=model.state_dict(), adapter_name=model.active_adapter, save_embedding_layers=False
    )
    for name, tensor in state.items():
        yield name, _full_tensor(tensor).detach()


class PolicyWeights:
    """vLLM's ``WeightSource`` over the policy: base-model names, LoRA merged (or the base alone,
    ``merged=False``), FSDP2 gathered one parameter at a time; ``nbytes`` counts what it handed out.

    Example:
        >>> source = PolicyWeights(nn.Linear(2, 1))
        >>> [name for name, _ in source], source.nbytes
        (['weight', 'bias'], 12)
    """

    def __init__(self, model: nn.Module, merged: bool = True):
        self.model, self.merged = model, merged
        self.nbytes = 0

    def metadata(self):
        from vllm.distributed.weight_transfer.base import ParamMeta

        with sync_weights(self.model, self.merged) as weights:
            return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in weights]

    def __iter__(self):
        with sync_weights(self.model, self.merged) as weights:
            for name, tensor in weights:
                self.nbytes += tensor.numel() * tensor.element_size()
                yield name, tensor


def _full_tensor(tensor: Tensor) -> Tensor:
    """The whole tensor of an FSDP2 shard (a ``DTensor``: an all-gather), else ``tensor`` itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def engine_model_path(model: nn.Module, tokenizer: Any = None) -> str:
    """Where an inference engine can load the policy's architecture from.

    The base model's ``name_or_path`` (a local directory or hub id) when it has one; otherwise
    (a model built in memory) the base model and tokenizer are saved to a temporary directory.
    Either way the engine is synced from the live policy before it generates, so only the
    architecture and tokenizer need to be right here.
    """
    base = base_model(model)
    path = getattr(getattr(base, "config", None), "_name_or_path", "") or getattr(base, "name_or_path", "")
    if path:
        return str(path)
    if not hasattr(base, "save_pretrained"):
        raise ValueError(
            f"cannot find a path to load {type(base).__name__} into vLLM: it has no name_or_path and no "
            "save_pretrained; pass model_path explicitly"
        )
    out = Path(tempfile.mkdtemp(prefix="lit_rlvr_engine_"))
    base.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return str(out)
