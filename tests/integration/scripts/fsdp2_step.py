"""One RLVRModule step on a fixed rollout batch, single-process or FSDP2 (ModelParallelStrategy, gloo).

    python fsdp2_step.py MODEL_DIR OUT_JSON DEVICES

Writes the first step's loss of every rank and the full parameters after the step (rank 0) so a
test can compare FSDP2 on 2 CPU processes with a single process.
"""

from __future__ import annotations

import json
import sys

import torch
from lightning import Callback, Trainer
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader

from lit_rlvr.contracts import TrainBatch
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions
from lit_rlvr.rewards import REWARDS
from lit_rlvr.rollout.types import Rollouts


def contains_seven(completion: str, answer: str, **row) -> float:
    return float("7" in completion)


class RecordLoss(Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss))


def fixed_batch(tokenizer) -> TrainBatch:
    gen = torch.Generator().manual_seed(0)
    prompts = [tokenizer("C375=026:").input_ids, tokenizer("C12=3:").input_ids]
    texts = ["3*7+5;", "12", "777", "5+3*7;", "1+2", "7", "x", "27;"]
    completions = [tokenizer(t).input_ids for t in texts]
    sampler = [(-torch.rand(len(c), generator=gen) * 3).tolist() for c in completions]
    rows = [{"id": f"p{i}", "prompt": "", "answer": "", "reward": "seven"} for i in range(2)]
    rollouts = Rollouts(prompts, completions, sampler, ["stop"] * 8, n=4, texts=texts)
    return TrainBatch(rows, prompts, rollouts=rollouts)


def main(model_dir: str, out: str, devices: int) -> None:
    torch.set_num_threads(1)
    REWARDS.register("seven")(contains_seven)
    module = RLVRModule(
        PolicyOptions(model_dir),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        scoring=ScoringOptions(workers=0),
        max_grad_norm=None,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
    )
    strategy = ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1) if devices > 1 else "auto"
    record = RecordLoss()
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[record],
    )
    loader = DataLoader([fixed_batch(module.tokenizer)], batch_size=None, collate_fn=lambda b: b)
    trainer.fit(module, train_dataloaders=loader)
    params = {}
    for name, p in module.policy.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p  # DTensor under FSDP2
        params[name] = full.detach().flatten()[:64].tolist()
    sharded = any(hasattr(p, "full_tensor") for p in module.policy.parameters())
    result = {"rank": trainer.global_rank, "losses": record.losses, "sharded": sharded, "params": params}
    with open(f"{out}.rank{trainer.global_rank}", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
