"""One RLVRModule step where each rank holds a different, unevenly sized half of a global batch.

    python uneven_ranks_step.py MODEL_DIR OUT_JSON STRATEGY CASES     # STRATEGY: single | ddp | fsdp2; CASES: tokens,dropped

CASE ``tokens``: rank 1's completions are much longer, so the ranks differ in tokens and, under a
token budget, in micro-batch count. CASE ``dropped``: with dynamic sampling every group of rank
0 has equal rewards, so rank 0 has no row to learn from while rank 1 has. ``single`` runs the
whole global batch in one process. Rank 0 writes the parameters after the step, so a test can
check that the ranks' averaged gradient is the global batch's (and that no rank waits forever).
Several cases run one after the other in the same processes (one launch, one process group), each
with a fresh module and Trainer, each writing ``OUT_JSON.<case>.rank<r>``.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from lightning import Trainer
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader

from lit_rlvr.contracts import TrainBatch
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import BatchingOptions, PolicyOptions, SamplingParams, ScoringOptions
from lit_rlvr.rewards import REWARDS
from lit_rlvr.rollout.types import Rollouts

TEXTS = {  # per prompt, 4 samples; "7" scores 1
    "tokens": [
        ["7", "1", "17", "2"],
        ["3", "7;", "4", "5"],
        ["3*7+5;3*7+5;3*7+5;", "12+12+12+12+12+1", "777777777777", "5+3*7;5+3*7;5+3*7;5"],
        ["1+2+1+2+1+2+1+2+1", "7+7+7+7+7+7+7+7", "x", "27;27;27;27;27;27;"],
    ],
    "dropped": [
        ["7", "17", "77", "7;"],
        ["1", "2", "3", "4"],  # rank 0: equal rewards in each group
        ["3*7+5;", "12", "777", "5+3*1;"],
        ["1+2", "7", "x", "27;"],
    ],
}


def contains_seven(completion: str, answer: str, **row) -> float:
    return float("7" in completion)


def batch(tokenizer, case: str, prompts: range) -> TrainBatch:
    gen = torch.Generator().manual_seed(0)
    prompt_ids = [tokenizer(f"C{i}{i}=7:").input_ids for i in range(4)]
    completions = [[tokenizer(t).input_ids for t in texts] for texts in TEXTS[case]]
    sampler = [[(-torch.rand(len(c), generator=gen) * 3).tolist() for c in group] for group in completions]
    rows = [{"id": f"p{i}", "prompt": "", "answer": "", "reward": "seven"} for i in prompts]
    rollouts = Rollouts(
        [prompt_ids[i] for i in prompts],
        [c for i in prompts for c in completions[i]],
        [s for i in prompts for s in sampler[i]],
        ["stop"] * 4 * len(prompts),
        n=4,
        texts=[t for i in prompts for t in TEXTS[case][i]],
    )
    return TrainBatch(rows, [prompt_ids[i] for i in prompts], rollouts=rollouts)


def step(model_dir: str, out: str, strategy: str, case: str) -> None:
    devices = 1 if strategy == "single" else 2
    rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.manual_seed(0)
    module = RLVRModule(
        PolicyOptions(model_dir),
        sampling=SamplingParams(n=4, max_new_tokens=24),
        # "dropped" forwards each prompt once (shared_prompts): its filler passes keep two forwards too
        batching=BatchingOptions(micro_batch_tokens=96, padding_free=False, shared_prompts=case == "dropped"),
        scoring=ScoringOptions(workers=0),
        max_grad_norm=None,
        dynamic_sampling=case == "dropped",
        optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
    )
    strategies = {
        "single": "auto",
        "ddp": "ddp",
        "fsdp2": ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
    }
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        devices=devices,
        strategy=strategies[strategy],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    prompts = range(4) if devices == 1 else range(2 * rank, 2 * rank + 2)
    loader = DataLoader([batch(module.tokenizer, case, prompts)], batch_size=None, collate_fn=lambda b: b)
    trainer.fit(module, train_dataloaders=loader)
    params = {}
    for name, p in module.policy.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p  # DTensor under FSDP2
        params[name] = full.detach().flatten()[:64].tolist()
    with open(f"{out}.{case}.rank{trainer.global_rank}", "w") as f:
        json.dump({"rank": trainer.global_rank, "params": params, "steps": trainer.global_step}, f)


def main(model_dir: str, out: str, strategy: str, cases: str) -> None:
    torch.set_num_threads(1)
    REWARDS.register("seven")(contains_seven)
    for case in cases.split(","):
        step(model_dir, out, strategy, case)


if __name__ == "__main__":
    main(*sys.argv[1:5])
