"""A few RLVRModule steps with live HF rollouts under FSDP2 on 2 CPU processes.

python fsdp2_fit.py MODEL_DIR PROMPTS_JSONL OUT_JSON
"""

from __future__ import annotations

import json
import sys

import torch
from lightning import Trainer
from lightning.pytorch.strategies import ModelParallelStrategy

from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.data import PromptDataModule
from lit_rlvr.data.datamodule import DatasetSpec
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions
from lit_rlvr.rewards import REWARDS


def contains_seven(completion: str, answer: str, **row) -> float:
    return float("7" in completion)


def main(model_dir: str, prompts: str, out: str) -> None:
    torch.set_num_threads(1)
    REWARDS.register("test_contains_seven")(contains_seven)
    dm = PromptDataModule(tokenizer=model_dir, train=DatasetSpec(files=prompts, name="toy"), batch_size=2, seed=0)
    module = RLVRModule(
        PolicyOptions(model_dir),
        sampling=SamplingParams(n=4, max_new_tokens=6, seed=0),
        scoring=ScoringOptions(workers=0),
        max_grad_norm=None,
    )  # default: fused AdamW
    trainer = Trainer(
        max_steps=2,
        accelerator="cpu",
        devices=2,
        logger=False,
        enable_checkpointing=False,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[RolloutCallback(engine="hf")],
    )
    trainer.fit(module, datamodule=dm)
    with open(f"{out}.rank{trainer.global_rank}", "w") as f:
        json.dump(
            {
                "steps": trainer.global_step,
                "loss": float(trainer.callback_metrics["train/loss"]),
                "fused": trainer.optimizers[0].defaults["fused"],
            },
            f,
        )


if __name__ == "__main__":
    main(*sys.argv[1:4])
