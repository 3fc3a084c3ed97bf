"""A run stopped after step 6 and resumed from its checkpoint reaches the uninterrupted run's step 12
(crossing an epoch boundary: data order, optimizer, RNG and the bootstrap generator all restored)."""

from __future__ import annotations

import pytest
import torch
from lightning import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.data import PromptDataModule
from lit_rlvr.data.datamodule import DatasetSpec
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import BatchingOptions, LossOptions, PolicyOptions, SamplingParams, ScoringOptions


def run(tiny_model_dir, files, root, max_steps: int, ckpt_path=None):
    torch.manual_seed(0)
    dm = PromptDataModule(
        tokenizer=str(tiny_model_dir), train=DatasetSpec(files=files, name="toy"), batch_size=2, seed=3
    )
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=5, seed=11),
        loss=LossOptions(advantage="passk_bootstrap", advantage_options={"k": 2}),
        batching=BatchingOptions(mini_batch_size=4),
        scoring=ScoringOptions(workers=0),
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2),
    )
    checkpoint = ModelCheckpoint(dirpath=root, save_last=True, every_n_train_steps=1)
    trainer = Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[RolloutCallback(engine="hf"), checkpoint],
        deterministic=True,
    )
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return trainer, module


@pytest.mark.timeout(240)
def test_resume_after_step_6_matches_uninterrupted_step_12(tiny_model_dir, tmp_path, toy_prompts):
    files = toy_prompts(10)  # 5 batches per epoch: resume crosses an epoch
    full_trainer, full = run(tiny_model_dir, files, tmp_path / "full", 12)
    run(tiny_model_dir, files, tmp_path / "part", 6)
    resumed_trainer, resumed = run(
        tiny_model_dir, files, tmp_path / "part", 12, ckpt_path=str(tmp_path / "part" / "last.ckpt")
    )
    assert full_trainer.global_step == resumed_trainer.global_step == 12
    for (name, a), (_, b) in zip(full.policy.named_parameters(), resumed.policy.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
