"""The weight streams of an FSDP2-sharded policy on 2 gloo processes, against one process: ``sync_weights``
of a plain and a LoRA policy (merged), and of a LoRA policy's base weights and ``adapter_tensors``
(adapter-only sync).

    torchrun --nproc_per_node 2 fsdp2_weights.py OUT_JSON

For each stream, rank r writes to ``OUT_JSON.rank{r}``: the largest difference between the
streamed tensors and the unsharded model's own (merged, for LoRA) weights, whether every
streamed tensor is a plain tensor, how many earlier streamed tensors were still alive at each
step (the stream must not keep the unsharded model), and how far the local shards moved
after the stream (LoRA: merge then unmerge).
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import weakref

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama
from lit_rlvr.rollout.weights import adapter_tensors, sync_weights

STREAMS = {  # name -> (model, the stream as a context manager)
    "plain": ("plain", sync_weights),
    "lora": ("lora", sync_weights),
    "lora_base": ("lora", lambda model: sync_weights(model, merged=False)),
    "lora_adapter": ("lora", lambda model: contextlib.nullcontext(adapter_tensors(model))),
}


def build(kind: str):
    base = build_tiny_llama(
        build_char_tokenizer(), num_layers=2, hidden_size=64, num_heads=2, intermediate_size=128, seed=0
    )
    if kind == "plain":
        return base, base
    torch.manual_seed(0)
    cfg = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    lora = get_peft_model(base, cfg)
    return lora, lora.get_base_model()


def check(stream: str, mesh) -> dict:
    kind, weights_of = STREAMS[stream]
    model, base = build(kind)
    with torch.no_grad(), weights_of(copy.deepcopy(model)) as weights:  # one process, unsharded
        reference = {name: t.clone() for name, t in weights}
    for layer in base.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    shards = {k: v.to_local().clone() for k, v in model.state_dict().items()}
    err, plain, alive, seen = 0.0, True, 0, []
    with torch.no_grad(), weights_of(model) as weights:
        for name, tensor in weights:
            alive = max(alive, sum(ref() is not None for ref in seen))
            err = max(err, (tensor - reference[name]).abs().max().item())
            plain &= type(tensor) is torch.Tensor
            seen.append(weakref.ref(tensor))
            del tensor
    names = len(seen)
    moved = max((v.to_local() - shards[k]).abs().max().item() for k, v in model.state_dict().items())
    return {
        "err": err,
        "plain": plain,
        "max_alive": alive,
        "tensors": names,
        "expected": len(reference),
        "shard_moved": moved,
    }


def main(out: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    result = {stream: check(stream, mesh) for stream in STREAMS}
    with open(f"{out}.rank{dist.get_rank()}", "w") as f:
        json.dump(result, f)
    # both ranks are past their last collective before either closes its gloo connections (a rank that
    # tore down while its peer still finished the last all-gather once aborted: "terminate called
    # without an active exception", once in a full-suite run; not in 20 runs alone, loaded or not)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
