"""Rollout correction weights against a plain-Python reference of TRL's four modes."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlvr.functional.correction import CORRECTIONS, correction_weights
from lit_rlvr.functional.losses import policy_loss


def reference(old, sampler, mask, mode, clip_max, clip_min):
    """TRL's vllm_importance_sampling_* (grpo_trainer.py), written per element."""
    B, T = len(old), len(old[0])
    level, bound = mode.split("_")
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    out = [[1.0] * T for _ in range(B)]
    for b in range(B):
        diffs = [(old[b][t] - sampler[b][t]) if mask[b][t] else 0.0 for t in range(T)]
        seq = math.exp(sum(diffs))
        for t in range(T):
            if not mask[b][t]:
                continue
            r = seq if level == "sequence" else math.exp(diffs[t])
            if bound == "truncate":
                r = min(max(r, low), high)
            elif not low <= r <= high:
                r = 0.0
            out[b][t] = r
    return out


@pytest.mark.parametrize("mode", sorted(CORRECTIONS))
@pytest.mark.parametrize(("clip_max", "clip_min"), [(3.0, None), (1.2, 0.8), (None, 0.5), (None, None)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weights_equal_the_reference(mode, clip_max, clip_min, seed):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 6, generator=gen, dtype=torch.float64) * 3
    sampler = old + torch.randn(4, 6, generator=gen, dtype=torch.float64) * 0.4
    mask = (torch.rand(4, 6, generator=gen) > 0.3).long()
    mask[3] = 0  # a row without tokens
    weights, stats = correction_weights(old, sampler, mask, mode, clip_max, clip_min)
    want = torch.tensor(reference(old.tolist(), sampler.tolist(), mask.tolist(), mode, clip_max, clip_min))
    torch.testing.assert_close(weights.double(), want.double(), rtol=1e-5, atol=1e-6)
    real = mask.bool()
    raw = torch.exp(torch.where(real, old - sampler, 0.0).float())
    if mode.startswith("sequence"):
        raw = torch.exp(torch.where(real, old - sampler, 0.0).sum(-1, keepdim=True).float()).expand_as(raw)
    assert stats["is_weight_max"] == pytest.approx(float(raw[real].max()), rel=1e-5)
    low, high = clip_min or -math.inf, clip_max or math.inf
    assert stats["is_bounded"] == pytest.approx(float(((raw < low) | (raw > high))[real].float().mean()), abs=1e-6)
    x = torch.where(real, old - sampler, 0.0)
    assert stats["mismatch_kl"] == pytest.approx(float((torch.expm1(x) - x)[real].mean()), rel=1e-4)


@pytest.mark.parametrize("mode", sorted(CORRECTIONS))
def test_identical_numerics_give_weight_one_and_the_same_loss_bit_for_bit(mode):
    gen = torch.Generator().manual_seed(3)
    old = -torch.rand(3, 5, generator=gen) * 2
    mask = torch.ones(3, 5)
    weights, stats = correction_weights(old, old.clone(), mask, mode, clip_max=2.0, clip_min=0.5)
    assert torch.equal(weights, torch.ones(3, 5)) and stats["mismatch_kl"] == 0 and stats["is_bounded"] == 0
    logprobs = (old + 0.1 * torch.randn(3, 5, generator=gen)).requires_grad_()
    adv = torch.tensor([1.0, -0.5, 0.25])
    plain, _ = policy_loss(logprobs, old, adv, mask)
    weighted, _ = policy_loss(logprobs, old, adv, mask, token_weights=weights)
    assert torch.equal(plain, weighted)


def test_masked_tokens_get_no_gradient():
    old = torch.zeros(1, 3)
    sampler = torch.log(torch.tensor([[1.0, 0.1, 1.0]]))  # the middle ratio is 10
    weights, _ = correction_weights(old, sampler, torch.ones(1, 3), "token_mask", clip_max=3.0)
    logprobs = torch.zeros(1, 3, requires_grad=True)
    loss, _ = policy_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 3), token_weights=weights)
    loss.backward()
    assert logprobs.grad[0, 1] == 0 and logprobs.grad[0, 0] != 0 and logprobs.grad[0, 2] != 0


def test_bad_settings_name_the_key():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="model.rollout_correction.mode: unknown rollout correction mode 'token'"):
        correction_weights(x, x, torch.ones(1, 2), "token")
    with pytest.raises(ValueError, match=r"clip_min \(2.0\) must be below clip_max \(1.0\)"):
        correction_weights(x, x, torch.ones(1, 2), "token_mask", clip_max=1.0, clip_min=2.0)
    with pytest.raises(ValueError, match="clip_max must be a number > 0 or null"):
        correction_weights(x, x, torch.ones(1, 2), "token_mask", clip_max=0.0)


@pytest.mark.parametrize("mode", sorted(CORRECTIONS))
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("whose", ["sampler", "trainer"])
def test_a_log_prob_that_is_not_finite_gets_weight_0_counted_and_warned(mode, bad, whose):
    """TRL's nan_to_num made a NaN ratio 1: the token trained as if sampler and trainer agreed."""
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=gen, dtype=torch.float64) * 3
    sampler = old + torch.randn(3, 5, generator=gen, dtype=torch.float64) * 0.2
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[2, 3:] = 0
    broken_old, broken_sampler = old.clone(), sampler.clone()
    (broken_sampler if whose == "sampler" else broken_old)[1, 2] = bad
    (broken_sampler if whose == "sampler" else broken_old)[2, 4] = bad  # on padding: ignored
    with pytest.warns(RuntimeWarning, match=r"1 of 13 tokens have a log-prob that is not finite"):
        weights, stats = correction_weights(broken_old, broken_sampler, mask, mode, 3.0, None)
    clean, clean_stats = correction_weights(old, sampler, mask, mode, 3.0, None)
    hit = torch.zeros(3, 5, dtype=torch.bool)
    hit[1, 2 if mode.startswith("token") else slice(None)] = True  # the token, or its whole row
    assert (weights[hit] == 0).all() and torch.equal(weights[~hit], clean[~hit]) and torch.isfinite(weights).all()
    assert stats["is_nonfinite"] == pytest.approx(1 / 13)
    assert all(torch.isfinite(v) for v in stats.values())
    assert clean_stats["is_nonfinite"] == 0
