"""Adapter-only weight sync: a LoRA policy's adapter, not its merged weights, goes to vLLM after each step.

A merged sync sends the whole model after every optimizer step; a LoRA policy changes only its
adapter, 100–1,000× fewer bytes at r = 16–64 on 1.5B–8B models. vLLM serves LoRA adapters itself
(``enable_lora``; the server's ``/v1/load_lora_adapter``), so, as TRL's AsyncGRPO (PR #7017) and
verl's ``lora.merge=False`` do:

- the engine starts with LoRA enabled, sized for the policy's rank (:class:`AdapterServing`);
- the first sync sends the frozen base weights W (:func:`~lit_rlvr.rollout.weights.sync_weights`
  with ``merged=False``), once: the checkpoint on disk may not be the policy's base;
- every sync writes the adapter (A and B, PEFT's names and ``adapter_config.json``) into a folder
  of its own (:class:`AdapterStore`; vLLM loads adapters from disk), loads it under a new name and
  id, ``lit_rlvr_policy_v<version>`` (the weight version), and unloads the previous one; generation
  and the fingerprint probe name the current adapter.

A new name per version, not one name reloaded in place: vLLM keys its prefix cache by adapter, so
KV blocks computed under the previous adapter can never serve the new one (TRL's reason too).

Which sync runs (``rollout.adapter_sync``): ``auto`` (default) adapter-only when the policy is a
LoRA adapter vLLM can serve (:func:`adapter_problem`, vLLM's own adapter checks) and the engine can
read the adapter's folder, else merged, saying why; ``true`` adapter-only or a clear error at
start-up; ``false`` merged. Departures from TRL: the base is synced once from the policy (TRL
trusts the checkpoint), and the fingerprint check compares the engine with the trainer's policy
after every sync, as for a merged sync.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from lit_rlvr.policy.loading import is_peft_model
from lit_rlvr.rollout.engine import announce
from lit_rlvr.rollout.weights import adapter_tensors

ADAPTER_SYNC = ("auto", True, False)
ADAPTER_PREFIX = "lit_rlvr_policy_v"  # + the weight version: the adapter's name in vLLM


def check_adapter_sync(value: Any) -> None:
    """Refuse what ``rollout.adapter_sync`` does not take.

    Example:
        >>> check_adapter_sync("auto")
        >>> check_adapter_sync("yes")
        Traceback (most recent call last):
        ...
        ValueError: rollout.adapter_sync must be auto, true or false, got 'yes'
    """
    if not any(value is v or (isinstance(v, str) and value == v) for v in ADAPTER_SYNC):
        raise ValueError(f"rollout.adapter_sync must be auto, true or false, got {value!r}")


def adapter_config(model: nn.Module) -> dict[str, Any]:
    """The active adapter's ``adapter_config.json`` as PEFT writes it (sets as sorted lists)."""
    config = model.peft_config[model.active_adapter].to_dict()
    return {k: sorted(v) if isinstance(v, (set, frozenset)) else v for k, v in config.items()}


def lora_rank(model: nn.Module) -> int:
    """The largest rank of the policy's adapter (``r`` and any per-module ``rank_pattern``)."""
    config = model.peft_config[model.active_adapter]
    return max([config.r, *(getattr(config, "rank_pattern", None) or {}).values()])


def max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM takes that serves ``rank`` (vLLM allows a fixed list).

    Example:
        >>> max_lora_rank(4), max_lora_rank(16), max_lora_rank(300)
        (8, 16, 320)
    """
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    allowed = sorted(get_args(MaxLoRARanks))
    fits = [r for r in allowed if r >= rank]
    if not fits:
        raise ValueError(f"vLLM serves LoRA ranks up to {allowed[-1]}; the policy's adapter has rank {rank}")
    return fits[0]


def adapter_problem(model: nn.Module) -> str | None:
    """Why vLLM cannot serve the policy's adapter as a LoRA adapter; None when it can.

    Checked: a PEFT model with one LoRA adapter, whose features vLLM implements (its own
    ``PEFTHelper`` checks: no DoRA, LoRA bias, ``modules_to_save``, weight-modifying inits, …) and
    whose rank vLLM serves. Which modules vLLM can serve is its loader's to say: the first sync
    loads the adapter and names what it refused.
    """
    if not is_peft_model(model):
        return f"the policy ({type(model).__name__}) has no LoRA adapter"
    if len(model.peft_config) != 1:
        return (
            f"the policy has {len(model.peft_config)} adapters ({sorted(model.peft_config)}); adapter sync serves one"
        )
    config = model.peft_config[model.active_adapter]
    if str(getattr(config, "peft_type", "")) not in ("LORA", "PeftType.LORA"):
        return f"the policy's adapter is {config.peft_type}, not LoRA"
    from vllm.config.lora import LoRAConfig
    from vllm.lora.peft_helper import PEFTHelper

    try:
        rank = max_lora_rank(lora_rank(model))
        PEFTHelper.from_dict(adapter_config(model)).validate_legal(LoRAConfig(max_lora_rank=rank))
    except ValueError as err:
        return f"vLLM cannot serve the policy's adapter: {err}"
    return None


@dataclass(frozen=True)
class AdapterServing:
    """An engine that serves the policy's LoRA adapter: vLLM's LoRA support sized for it.

    Args:
        max_lora_rank: vLLM's ``max_lora_rank`` (:func:`max_lora_rank` of the policy's rank).
        required: ``rollout.adapter_sync: true`` (a problem is an error; ``auto``: merged sync instead).

    Example:
        >>> AdapterServing(16).engine_kwargs()
        {'enable_lora': True, 'max_lora_rank': 16, 'max_loras': 1}
        >>> AdapterServing(16).server_args()
        ['--enable-lora', '--max-lora-rank', '16', '--max-loras', '1']
    """

    max_lora_rank: int
    required: bool = False

    def engine_kwargs(self) -> dict[str, Any]:
        """``vllm.LLM`` arguments: one adapter at a time (a sync waits for generation in flight)."""
        return {"enable_lora": True, "max_lora_rank": self.max_lora_rank, "max_loras": 1}

    def server_args(self) -> list[str]:
        """The same as ``vllm serve`` flags (the server also needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``)."""
        return ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank), "--max-loras", "1"]

    def refuse(self, why: str) -> None:
        """The engine cannot serve the adapter after all: :func:`refuse`."""
        refuse(why, self.required)


def sync_kind(adapter: AdapterServing | None) -> str:
    """What an engine's syncs send, for its start-up line.

    Example:
        >>> sync_kind(AdapterServing(16)), sync_kind(None)
        ('the LoRA adapter (max_lora_rank 16)', 'merged weights')
    """
    return f"the LoRA adapter (max_lora_rank {adapter.max_lora_rank})" if adapter is not None else "merged weights"


def refuse(why: str, required: bool) -> None:
    """Adapter sync cannot run: ``ValueError`` when it was asked for (``rollout.adapter_sync: true``);
    under ``auto`` the sync is merged, and a line says why."""
    if required:
        raise ValueError(f"rollout.adapter_sync=true: {why}. Set rollout.adapter_sync: false (merged full sync)")
    announce(f"lit_rlvr: merged weight sync ({why}; rollout.adapter_sync: auto)")


def adapter_serving(model: nn.Module | None, adapter_sync: bool | str) -> AdapterServing | None:
    """How an engine serves the policy ``model`` under ``rollout.adapter_sync``; None: merged sync.

    Raises:
        ValueError: ``adapter_sync`` is ``true`` and the policy's adapter cannot be served
            (:func:`adapter_problem`), or not a value it takes.
    """
    check_adapter_sync(adapter_sync)
    if adapter_sync is False:
        return None
    problem = "the engine was built without the policy" if model is None else adapter_problem(model)
    if problem is None:
        return AdapterServing(max_lora_rank(lora_rank(model)), required=adapter_sync is True)
    if adapter_sync is True or (model is not None and is_peft_model(model)):  # a plain policy syncs merged, unsaid
        refuse(problem, required=adapter_sync is True)
    return None


@dataclass(frozen=True)
class StoredAdapter:
    """One sync's adapter on disk: vLLM's name and id for it, its folder, and the bytes of its tensors."""

    name: str
    version: int
    path: Path
    nbytes: int


class AdapterStore:
    """Each sync's adapter in a folder of its own, inside a folder only this user can open (0700).

    vLLM loads an adapter from a folder holding ``adapter_config.json`` and
    ``adapter_model.safetensors``, and may load it again later (after a base reload or an
    eviction), so a version's folder stays until the next version is loaded (:meth:`drop`).

    Args:
        directory: where the private folder goes (a directory the engine reads; default the
            temp folder, RAM-backed ``/dev/shm`` when the caller passes it).
    """

    def __init__(self, directory: str | None = None):
        self.root = Path(tempfile.mkdtemp(prefix="lit_rlvr_adapters_", dir=directory))

    def write(self, model: nn.Module, version: int, write: bool = True) -> StoredAdapter | None:
        """Write the policy's adapter as version ``version`` (every rank runs the FSDP2 gathers;
        ``write=False``: gather and drop, return None).

        The tensors are written in the base weights' dtype, the one vLLM computes the adapter in
        (its ``lora_dtype: auto``): PEFT keeps a bf16 model's adapter in float32, which would
        double the bytes for a cast vLLM makes anyway.
        """
        from safetensors.torch import save_file

        dtype = next(p.dtype for name, p in model.named_parameters() if ".lora_" not in name)
        tensors = {}
        for name, tensor in adapter_tensors(model):
            if write:
                tensors[name] = tensor.to("cpu", dtype, copy=True).contiguous()
        if not write:
            return None
        folder = self.root / f"v{version}"
        folder.mkdir()
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps(adapter_config(model), default=str))
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        return StoredAdapter(f"{ADAPTER_PREFIX}{version}", version, folder, nbytes)

    def drop(self, adapter: StoredAdapter | None) -> None:
        """Remove a version the engine no longer serves."""
        if adapter is not None:
            shutil.rmtree(adapter.path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
