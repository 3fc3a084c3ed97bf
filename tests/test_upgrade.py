"""What lit_rlvr 0.1 wrote still works: its checkpoints resume and load, its configs upgrade to today's.

``fixtures/legacy_0_1/lora_passk_rkl_0.1.ckpt`` is a real 0.1 checkpoint (commit b1ceac8: a LoRA
policy with the Pass@k advantage and the RKL penalty, 2 steps) with its frozen base weights
stripped to keep the file small; they are the seed-0 tiny Llama's (``tiny_model_dir``), restored
here. ``fixtures/legacy_0_1/configs`` are 0.1's shipped configs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lightning import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.data import DatasetSpec, PromptDataModule
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import (
    BatchingOptions,
    KLOptions,
    LoraOptions,
    LossOptions,
    PolicyOptions,
    SamplingParams,
    ScoringOptions,
)
from lit_rlvr.upgrade import MOVES, is_legacy_checkpoint, upgrade_config

LEGACY = Path(__file__).parent / "fixtures" / "legacy_0_1"
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
LORA = LoraOptions(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
# Settings the shipped configs gained after 0.1, which an upgrade rightly does not invent: 0.1 had
# no rollout correction (the math and SQL configs now correct vLLM's bf16 log-probs).
SINCE_0_1 = ["--model.rollout_correction=null"]
# The demo's regime moved after 0.1 (study 2 chose lr 1e-4 and 160 steps, benchmarks/results/study2_plan.md):
# an upgraded 0.1 demo file keeps its own values, which these flags give today's files back.
DEMO_REGIME_0_1 = {
    "demo/base": [
        "--model.optimizer.init_args.lr=2.0e-4",
        "--trainer.max_steps=120",
        "--trainer.val_check_interval=30",
        "--trainer.limit_val_batches=1.0",  # Lightning's default, which the file no longer spells out
        "--model.batching.shared_prompts=false",  # the demo's fits forward each prompt once since (speed)
    ],
    "demo/passk_then_pass1": [
        "--trainer.callbacks.init_args.phases=[{start_step: 0, advantage: passk, options: {k: 4}}, "
        "{start_step: 60, advantage: grpo, options: {std: population}}]"
    ],
    # and DPH's threshold (study 3's part A chose 4 of 8 for the 200-step base, benchmarks/results/study3_plan.md)
    "demo/dph_f": ["--data.cache.perfect_threshold=6"],
    "demo/cache": ["--data.cache.perfect_threshold=6"],
}


@pytest.fixture
def legacy_checkpoint(tiny_model_dir, tmp_path) -> Path:
    """The 0.1 checkpoint with its base weights restored from the tiny model (as 0.1 saved them)."""
    from transformers import AutoModelForCausalLM

    checkpoint = torch.load(LEGACY / "lora_passk_rkl_0.1.ckpt", weights_only=False)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    for key in checkpoint.pop("lit_rlvr_test_fixture")["stripped_base_keys"]:
        name = key.removeprefix("policy.base_model.model.").replace(".base_layer.", ".")
        checkpoint["state_dict"][key] = base[name].clone()
    path = tmp_path / "old.ckpt"
    torch.save(checkpoint, path)
    return path


def prompts(tmp_path: Path) -> str:
    path = tmp_path / "p.jsonl"  # the rows the 0.1 run trained on
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "7", "reward": "math"}) + "\n"
            for i in range(8)
        )
    )
    return str(path)


def resume(tiny_model_dir, tmp_path: Path, ckpt: Path, name: str) -> tuple[RLVRModule, RolloutCallback, dict]:
    """The 0.1 run's settings in today's groups, resumed from ``ckpt`` to step 4."""
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir), lora=LORA),
        sampling=SamplingParams(n=4, max_new_tokens=6, seed=0),
        loss=LossOptions(advantage="passk", advantage_options={"k": 2}, aggregation="seq_mean_token_mean"),
        kl=KLOptions(coef=0.05),
        batching=BatchingOptions(micro_batch_tokens=64),
        scoring=ScoringOptions(workers=0, timeout_s=5.0),
    )
    dm = PromptDataModule(
        str(tiny_model_dir), train=DatasetSpec(files=prompts(tmp_path), name="toy"), batch_size=2, seed=3
    )
    rollout, seen = RolloutCallback(engine="hf"), {}

    class Seen(Callback):
        def on_train_start(self, trainer, pl_module):
            seen.update(tokens=rollout.total_rollout_tokens, step=trainer.global_step, position=dm._consumed)

    trainer = Trainer(
        max_steps=4,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path / name,
        callbacks=[rollout, Seen(), ModelCheckpoint(dirpath=tmp_path / name, save_last=True)],
    )
    trainer.fit(module, datamodule=dm, ckpt_path=str(ckpt))
    return module, rollout, seen


@pytest.mark.timeout(240)
def test_a_0_1_checkpoint_resumes_as_its_upgraded_copy_does(legacy_checkpoint, tiny_model_dir, tmp_path):
    from lit_rlvr.tools.upgrade import main

    assert is_legacy_checkpoint(torch.load(legacy_checkpoint, weights_only=False))
    upgraded = tmp_path / "new.ckpt"
    main(["checkpoint", str(legacy_checkpoint), str(upgraded)])
    new = torch.load(upgraded, weights_only=True)  # today's layout loads with weights_only, as Lightning resumes
    assert not is_legacy_checkpoint(new) and new["hyper_parameters"]["kl"] == KLOptions(coef=0.05)
    assert "RolloutCallback{'engine': 'hf'}" in new["callbacks"]
    old_module, old_rollout, old_seen = resume(tiny_model_dir, tmp_path, legacy_checkpoint, "from_old")
    new_module, _, new_seen = resume(tiny_model_dir, tmp_path, upgraded, "from_new")
    # the step, the prompt position and the rollout callback's state came back from the 0.1 file
    assert old_seen == new_seen and old_seen["step"] == 2 and old_seen["position"] == (0, 1) and old_seen["tokens"] > 0
    assert old_module.trainer.global_step == 4
    for (name, a), (_, b) in zip(old_module.policy.named_parameters(), new_module.policy.named_parameters()):
        assert torch.equal(a, b), name
    again = torch.load(tmp_path / "from_old" / "last.ckpt", weights_only=True)  # what it saves is today's layout
    assert again["lit_rlvr_format"] == 2 and again["hyper_parameters"]["loss"]["advantage_options"] == {
        "k": 2
    }  # plain data


def test_a_0_1_checkpoint_loads_with_load_from_checkpoint(legacy_checkpoint, tiny_model_dir):
    module = RLVRModule.load_from_checkpoint(legacy_checkpoint, policy=PolicyOptions(str(tiny_model_dir), lora=LORA))
    assert module.sampling.n == 4 and module.sampling.max_new_tokens == 6
    assert module.loss == LossOptions(advantage="passk", advantage_options={"k": 2}, aggregation="seq_mean_token_mean")
    assert module.kl == KLOptions(coef=0.05) and module.anchor is None
    assert module.batching.micro_batch_tokens == 64 and module.scoring == ScoringOptions(workers=0, timeout_s=5.0)
    assert module.evaluation.pass_k == [1, 2, 4]
    fixture = torch.load(legacy_checkpoint, weights_only=False)["state_dict"]
    lora = {k: v for k, v in module.state_dict().items() if "lora_" in k}
    assert lora and all(torch.equal(v, fixture[k]) for k, v in lora.items())  # the trained adapter


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["demo_base"], ["demo/base"]),
        (["demo_base", "demo_dph_f"], ["demo/base", "demo/dph_f"]),
        (["demo_base", "demo_passk_then_pass1"], ["demo/base", "demo/passk_then_pass1"]),
        (["math_base", "math_dph_alpha"], ["math/base", "math/dph_alpha"]),
        (["sql_base"], ["sql/base"]),
    ],
)
def test_0_1_fit_configs_upgrade_to_the_shipped_ones(tmp_path, old, new, print_config):
    """`lit-rlvr upgrade config` on each of 0.1's files gives today's files, as parsed."""
    from lit_rlvr.tools.upgrade import main

    upgraded = []
    for name in old:
        main(["config", str(LEGACY / "configs" / f"{name}.yaml"), "--out", str(tmp_path / f"{name}.yaml")])
        upgraded += ["--config", str(tmp_path / f"{name}.yaml")]
    shipped = [arg for name in new for arg in ("--config", str(CONFIGS / f"{name}.yaml"))]
    regime = [flag for name in new for flag in DEMO_REGIME_0_1.get(name, [])]
    got, want = print_config("fit", *upgraded), print_config("fit", *shipped, *SINCE_0_1, *regime)
    for section in ("model", "rollout", "data", "trainer", "export"):
        assert got[section] == want[section], section


@pytest.mark.parametrize(("old", "new"), [("demo_cache", "demo/cache"), ("math_cache", "math/cache")])
def test_0_1_cache_configs_upgrade_to_the_shipped_ones(tmp_path, old, new, print_config):
    from lit_rlvr.tools.upgrade import main

    main(["config", str(LEGACY / "configs" / f"{old}.yaml"), "--out", str(tmp_path / "cache.yaml")])
    got = print_config("cache", "--config", str(tmp_path / "cache.yaml"))
    want = print_config("cache", "--config", str(CONFIGS / f"{new}.yaml"), *DEMO_REGIME_0_1.get(new, []))
    got.pop("config", None), want.pop("config", None)
    if old == "math_cache":  # 0.1's cache tool defaulted to a 5 s deadline, training to 10 s: one default now
        assert got["scoring"]["timeout_s"] == 10.0
        # 0.1 padded its log π_ref passes, and the upgrade keeps that; the shipped file follows training (packs where it pays)
        assert got["batching"]["padding_free"] is False and want["batching"]["padding_free"] == "auto"
        got["batching"]["padding_free"] = "auto"
    assert got == want


def test_every_0_1_key_has_a_documented_home():
    """docs/configuration.md's upgrade table is MOVES (generated from it): every 0.1 key of every section."""
    from lit_rlvr.tools.reference import moves_table

    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert "\n".join(moves_table()) in doc
    old_module = {
        "model",
        "dtype",
        "attn_implementation",
        "gradient_checkpointing",
        "lora",
        "samples_per_prompt",
        "max_new_tokens",
        "temperature",
        "advantage",
        "advantage_options",
        "loss_agg",
        "clip_low",
        "clip_high",
        "dual_clip",
        "divergence",
        "divergence_coef",
        "divergence_level",
        "divergence_options",
        "divergence_value_cap",
        "kl_coef",
        "kl_estimator",
        "kl_value_cap",
        "ppo_epochs",
        "mini_batch_size",
        "micro_batch_size",
        "micro_batch_tokens",
        "padding_free",
        "reward_workers",
        "reward_timeout",
        "reward_options",
        "pass_k",
        "retention_reference",
    }  # 0.1's RLVRModule arguments that moved
    assert old_module == {old for section, old, _ in MOVES if section == "model"}


def test_upgrade_config_notes_what_it_dropped():
    new, notes = upgrade_config(
        {
            "model": {"model": "m", "divergence": "js", "divergence_coef": 0},
            "rollout": {"init_args": {"drift_micro_batch_size": 8}},
            "data": {"tokenizer": "m"},
        }
    )
    assert new["data"] == {} and new["rollout"] == {"init_args": {}}
    assert any("drift_micro_batch_size: removed" in n for n in notes)
    assert any("data.tokenizer: removed (it is linked to model.policy.path now)" in n for n in notes)
    assert any("model.anchor: 0.1's divergence_coef: 0 meant off" in n for n in notes)


def test_loss_options_pickled_before_the_policy_loss_fields_load_with_their_defaults():
    """A checkpoint's hyper-parameters written before ``policy_loss``/``token_mask`` existed: the
    unpickled group has them at their defaults (the same loss), also through the weights-only loader."""
    import io

    from lit_rlvr.options import LossOptions

    before = LossOptions.__new__(LossOptions)  # what the previous version pickled: its fields only
    before.__dict__.update(
        {
            "advantage": "passk",
            "advantage_options": {"k": 2},
            "aggregation": "token_mean",
            "clip_low": 0.2,
            "clip_high": 0.28,
            "dual_clip": None,
        }
    )
    buffer = io.BytesIO()
    torch.save({"hyper_parameters": {"loss": before}}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["hyper_parameters"]["loss"]
    assert loaded == LossOptions(advantage="passk", advantage_options={"k": 2})
    assert loaded.policy_loss_options == {} and loaded.policy_loss_options is not LossOptions().policy_loss_options
