"""GPU-only checks (skipped without CUDA; `benchmarks/gpu_check.sh` runs them on a lent GPU machine):
a bf16 fit with the transformers engine under Lightning's FSDP and under FSDP2, and its export."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("strategy", ["auto", "fsdp", "fsdp2"])
def test_bf16_fit_trains_and_exports_on_one_gpu(tiny_model_dir, toy_prompts, tmp_path, strategy):
    from lightning import Trainer
    from transformers import AutoModelForCausalLM

    import lit_rlvr.strategies  # noqa: F401  (fsdp2)
    from lit_rlvr.callbacks import HFExport, RolloutCallback
    from lit_rlvr.data import DatasetSpec, PromptDataModule
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions

    dm = PromptDataModule(
        tokenizer=str(tiny_model_dir), train=DatasetSpec(files=toy_prompts(8), name="toy"), batch_size=2
    )
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir), dtype="bfloat16"),
        sampling=SamplingParams(n=4, max_new_tokens=6, seed=0),
        scoring=ScoringOptions(workers=0),
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2),
    )
    before = {k: v.detach().float().cpu().clone() for k, v in module.policy.named_parameters()}
    trainer = Trainer(
        accelerator="gpu",
        devices=1,
        strategy=strategy,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[RolloutCallback(engine="hf"), HFExport(str(tmp_path / "hf"))],
    )
    trainer.fit(module, datamodule=dm)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    changed = [k for k, v in exported.named_parameters() if k in before and not torch.equal(v.float(), before[k])]
    assert changed, "the exported policy equals the initial one"
