"""Masking is exact: a step on multi-turn rollouts does not depend on the environment tokens' logits.

The environment's tokens are in the forward (the model's later turns attend to them) but in no loss:
policy loss, KL, entropy bonus, token selections and rollout-correction weights all act on
``StepData.loss_tokens``, and DPH-RL's divergence on a multi-turn cache's anchors on ``AnchorBatch.loss_tokens``. Perturbing the logits that predict environment tokens (by an amount that
depends on the parameters) must leave the update bit for bit unchanged; without the mask it changes.
"""

from __future__ import annotations

import random

import pytest
import torch
from lightning import Trainer
from torch.utils.data import DataLoader

from lit_rlvr.contracts import AnchorBatch, TrainBatch
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import (
    AnchorOptions,
    BatchingOptions,
    EntropyOptions,
    KLOptions,
    LossOptions,
    PolicyOptions,
    RolloutCorrection,
    SamplingParams,
    ScoringOptions,
)

pytestmark = pytest.mark.usefixtures("seven_reward")

ENV_CHARS = "[]#@"  # the environment's tokens use only these characters; the prompts and the model's turns never do


def multiturn_batch(tokenizer, seed: int = 0, masked: bool = True) -> TrainBatch:
    """Two prompts × 4 trajectories: model turn, environment observation, model turn (ragged)."""
    from lit_rlvr.rollout.types import Rollouts

    rng = random.Random(seed)
    prompts = ["C375=026:", "C12=3:"]
    completions, masks, sampler, texts = [], [], [], []
    for _ in range(8):
        parts = [
            ("".join(rng.choice("0123456789+*-") for _ in range(rng.randint(2, 5))) + "?", 1),
            ("".join(rng.choice(ENV_CHARS) for _ in range(rng.randint(2, 6))), 0),
            ("".join(rng.choice("0123456789+*-") for _ in range(rng.randint(1, 4))) + ";", 1),
        ]
        ids, mask, lp = [], [], []
        for text, is_model in parts:
            part = tokenizer(text, add_special_tokens=False).input_ids
            ids += part
            mask += [is_model] * len(part)
            lp += [-rng.random() * 3 if is_model else 0.0 for _ in part]
        completions.append(ids)
        masks.append(mask)
        sampler.append(lp)
        texts.append("".join(text for text, _ in parts))
    prompt_ids = [tokenizer(p).input_ids for p in prompts]
    rollouts = Rollouts(
        prompt_ids, completions, sampler, ["stop"] * 8, n=4, texts=texts, loss_mask=masks if masked else None
    )
    rows = [{"id": f"p{i}", "prompt": p, "answer": "", "reward": "test_contains_seven"} for i, p in enumerate(prompts)]
    cached = rollouts.to_padded(
        tokenizer.pad_token_id
    )  # the same trajectories as a multi-turn reference cache's anchors
    anchor = AnchorBatch(
        cached["input_ids"],
        cached["attention_mask"],
        cached["response_mask"],
        cached["old_logprobs"] - 0.5,
        torch.ones(8),
        loss_mask=cached.get("loss_mask"),
    )
    return TrainBatch(rows, prompt_ids, anchor=anchor, rollouts=rollouts)


def perturb_environment_logits(policy, env_ids: torch.Tensor):
    """A forward hook that rescales and shifts the logits predicting environment tokens (parameter-dependent)."""

    def hook(module, args, kwargs, output):
        input_ids, keep = (
            kwargs["input_ids"],
            kwargs.get("logits_to_keep", 0),
        )  # (rows, L); the positions whose logits are kept
        L, K = input_ids.shape[1], output.logits.shape[1]
        positions = (
            keep.to(input_ids.device) if torch.is_tensor(keep) else torch.arange(L - K, L, device=input_ids.device)
        )
        following = torch.full((input_ids.shape[0], K), -1, dtype=input_ids.dtype, device=input_ids.device)
        inside = positions + 1 < L
        following[:, inside] = input_ids[
            :, positions[inside] + 1
        ]  # the token each kept position predicts (padded or packed rows)
        env = torch.isin(following, env_ids.to(input_ids.device)).unsqueeze(-1)
        output.logits = torch.where(env, 4.0 * output.logits + 1.5, output.logits)
        return output

    return policy.register_forward_hook(hook, with_kwargs=True)


METHODS = {
    "grpo+kl+entropy_bonus": {"kl": KLOptions(coef=0.1), "entropy": EntropyOptions("static", {"entropy_coef": 0.1})},
    "grpo+kl+entropy_bonus, padded forward": {
        "kl": KLOptions(coef=0.1),
        "entropy": EntropyOptions("static", {"entropy_coef": 0.1}),
        "batching": BatchingOptions(padding_free=False, micro_batch_size=3),
    },
    "clip_cov": {
        "loss": LossOptions(
            policy_loss="clip_cov", policy_loss_options={"clip_cov_ratio": 0.3, "clip_cov_lb": 0.0, "clip_cov_ub": 1e3}
        )
    },
    "forking_tokens": {"loss": LossOptions(token_mask="top_entropy", token_mask_options={"top_entropy_quantile": 0.3})},
    "rollout_correction+recompute": {
        "rollout_correction": RolloutCorrection("token_truncate", clip_max=1.5, clip_min=0.5)
    },
    "dph_f on multi-turn anchors": {"anchor": AnchorOptions(divergence="forward_kl", coef=1.0)},
    "passk+dr_grpo_aggregation": {
        "loss": LossOptions(advantage="passk", advantage_options={"k": 2}, aggregation="seq_mean_token_sum_norm")
    },
}


def step_after(tiny_model_dir, method: str, perturb: bool, masked: bool) -> dict[str, torch.Tensor]:
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=16),
        scoring=ScoringOptions(workers=0),
        max_grad_norm=None,
        optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
        **METHODS[method],
    )
    env_ids = torch.tensor(
        sorted({i for ch in ENV_CHARS for i in module.tokenizer(ch, add_special_tokens=False).input_ids})
    )
    handle = perturb_environment_logits(module.policy, env_ids) if perturb else None
    batch = multiturn_batch(module.tokenizer, masked=masked)
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, train_dataloaders=DataLoader([batch], batch_size=None, collate_fn=lambda b: b))
    if handle is not None:
        handle.remove()
    return {k: v.detach().clone() for k, v in module.policy.named_parameters()}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_update_does_not_depend_on_environment_token_logits(tiny_model_dir, method):
    clean = step_after(tiny_model_dir, method, perturb=False, masked=True)
    perturbed = step_after(tiny_model_dir, method, perturb=True, masked=True)
    for name in clean:
        assert torch.equal(clean[name], perturbed[name]), name
    unmasked = step_after(tiny_model_dir, method, perturb=False, masked=False)
    unmasked_perturbed = step_after(tiny_model_dir, method, perturb=True, masked=False)
    assert any(
        not torch.allclose(unmasked[n], unmasked_perturbed[n]) for n in unmasked
    )  # without the mask the perturbation shows
    assert any(not torch.allclose(clean[n], unmasked[n]) for n in clean)  # and the mask changes the update
