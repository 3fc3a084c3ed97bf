"""Scoring completions with a causal LM: the one place that lines up logits with completion tokens.

Used by the trainer (current log-probs), the reference cache (stored log π_ref), and the rollout
engines' weight-sync fingerprint, so all three agree on positions, padding and temperature.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from lit_rlvr.functional.logprobs import token_entropy, token_logprobs


def completion_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_len: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs (and optionally entropies) of the last ``response_len`` columns.

    The layout is :meth:`lit_rlvr.rollout.types.Rollouts.to_padded`'s: prompts left-padded,
    completions right-padded, so the completion occupies the last T = ``response_len`` columns.
    Position ids are derived from the attention mask, so left padding does not shift positions.

    Args:
        model: a transformers causal LM (returns ``.logits``).
        input_ids: ``(B, Lp+T)``.
        attention_mask: ``(B, Lp+T)``.
        response_len: T.
        temperature: the sampling temperature the log-probs should describe.
        with_entropy: also return token entropies (for entropy-adaptive Pass@k and logging).

    Returns:
        ``logprobs (B, T)`` float32 and ``entropy (B, T)`` or None. Values on padded completion
        positions are meaningless and must be masked with ``response_mask``.
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    T = response_len
    logits = logits[:, -T - 1 : -1]  # (B, T, V): position t predicts token t+1
    labels = input_ids[:, -T:]  # (B, T)
    logprobs = token_logprobs(logits, labels, temperature)
    entropy = token_entropy(logits.detach(), temperature) if with_entropy else None
    return logprobs, entropy


@torch.no_grad()
def sequence_logprob(model: nn.Module, prompt_ids: list[int], completion_ids: list[int]) -> Tensor:
    """Per-token log-probs ``(T,)`` of one completion given its prompt, at temperature 1."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long)
    device = next(model.parameters()).device
    ids = ids.to(device)
    logprobs, _ = completion_logprobs(model, ids, torch.ones_like(ids), len(completion_ids))
    return logprobs[0]


@dataclass
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


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(
    model: str,
    dtype: str = "float32",
    attn_implementation: str | None = None,
    gradient_checkpointing: bool = False,
    lora: LoraOptions | None = None,
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local path or hub name, optionally with LoRA.

    Raises:
        ValueError: for an unknown dtype, or a name that cannot be loaded (naming it).
    """
    if dtype not in _DTYPES:
        raise ValueError(f"model.dtype: unknown dtype {dtype!r}; valid: {sorted(_DTYPES)}")
    kwargs = {"dtype": _DTYPES[dtype]}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
        policy = AutoModelForCausalLM.from_pretrained(model, **kwargs)
    except OSError as err:
        what = "a directory without a loadable model" if Path(model).exists() else "no local directory and not loadable from the hub"
        raise ValueError(f"model: cannot load {model!r}: {what} ({err})") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy.config.use_cache = False
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
    return policy, tokenizer


def shard_fsdp2(policy: nn.Module, mesh) -> None:
    """Shard every decoder layer, then the whole policy, with FSDP2's ``fully_shard`` (idempotent).

    Args:
        policy: an HF causal LM (possibly PEFT-wrapped) whose blocks are ``.model.layers``.
        mesh: the strategy's device mesh; its ``data_parallel`` dimension is used when named.
    """
    if getattr(policy, "_lit_rlvr_sharded", False):
        return
    from torch.distributed.fsdp import fully_shard

    dp_mesh = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
    for layer in _decoder_layers(policy):
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(policy, mesh=dp_mesh)
    policy._lit_rlvr_sharded = True


def _decoder_layers(policy: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF causal LM (through a peft wrapper if any)."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    layers = getattr(getattr(base, "model", base), "layers", None)
    if layers is None:
        raise ValueError(f"cannot find decoder layers to shard in {type(base).__name__} (expected .model.layers)")
    return list(layers)


_GATHERED: set[int] = set()  # ids of FSDP1 roots whose full parameters are summoned right now


@contextlib.contextmanager
def gathered_parameters(trainer) -> Iterator[None]:
    """Full (unflattened) policy parameters outside the training forward, under Lightning's FSDP1.

    ``strategy="fsdp"`` wraps the LightningModule in one ``FullyShardedDataParallel`` whose
    parameters are flat shards outside its forward; rollouts, weight syncs, the drift check and
    the export run outside it, so they summon the full parameters (read-only) for their duration.
    Re-entrant; a no-op for every other strategy (FSDP2 gathers per layer in its own forward).
    Written against torch's FSDP1 API and not run by us: Lightning's FSDP refuses CPU.
    """
    from lightning.pytorch.strategies import FSDPStrategy

    strategy = getattr(trainer, "strategy", None) if trainer is not None else None
    root = getattr(strategy, "model", None) if isinstance(strategy, FSDPStrategy) else None
    if root is None or id(root) in _GATHERED:
        yield
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    _GATHERED.add(id(root))
    try:
        with FullyShardedDataParallel.summon_full_params(root, writeback=False):
            yield
    finally:
        _GATHERED.discard(id(root))
