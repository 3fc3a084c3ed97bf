"""HFExport: save the trained policy (or its LoRA adapter) in Hugging Face format at the end of ``fit``.

The export folder loads with ``AutoModelForCausalLM.from_pretrained`` / ``PeftModel`` and vLLM.
Under FSDP2 every rank takes part in gathering the full state dict (a collective), streamed to
CPU, and rank 0 writes it; the export is never the sharded local view.
"""

from __future__ import annotations

from pathlib import Path

import torch
from lightning import Callback, LightningModule, Trainer
from typing_extensions import override

from lit_rlvr.policy import gathered_parameters


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The unsharded state dict of an FSDP2-sharded ``model`` on CPU (all ranks must call it);
    None when no parameter is sharded (the module's own state dict is complete)."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class HFExport(Callback):
    """At the end of ``fit``, write ``pl_module.policy`` and ``pl_module.tokenizer`` to ``dirpath``.

    A LoRA policy saves its adapter only (``adapter_config.json`` + weights), as peft does.

    Args:
        dirpath: the export folder (created); None disables the export.
    """

    def __init__(self, dirpath: str | None = None):
        self.dirpath = dirpath

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.dirpath is None:
            return
        with gathered_parameters(trainer):  # FSDP1: full parameters on every rank
            state = full_state_dict(pl_module.policy)  # a collective under FSDP2: every rank
            if trainer.is_global_zero:
                path = Path(self.dirpath)
                path.mkdir(parents=True, exist_ok=True)
                pl_module.policy.save_pretrained(path, **({"state_dict": state} if state is not None else {}))
                pl_module.tokenizer.save_pretrained(path)
        trainer.strategy.barrier("lit_rlvr_export")
