"""Sharding the policy across data-parallel ranks: FSDP2's ``fully_shard``, and FSDP1's full parameters when needed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from lit_rlvr.policy.loading import base_model


def shard_fsdp2(policy: nn.Module, mesh) -> None:
    """Shard every decoder layer, then the whole policy, with FSDP2's ``fully_shard`` (idempotent).

    Args:
        policy: an HF causal LM (possibly PEFT-wrapped) whose blocks are ``.model.layers``.
        mesh: the strategy's device mesh; its ``data_parallel`` dimension is used when named (None:
            a strategy without one, nothing to shard).
    """
    if mesh is None or getattr(policy, "_lit_rlvr_sharded", False):
        return
    from torch.distributed.fsdp import fully_shard

    dp_mesh = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
    for layer in _decoder_layers(policy):
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(policy, mesh=dp_mesh)
    policy._lit_rlvr_sharded = True


def _decoder_layers(policy: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF causal LM (through a peft wrapper if any)."""
    base = base_model(policy)
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
