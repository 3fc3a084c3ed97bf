"""Forking-token mask, entropy bonus and its controllers (docs/methods.md §8.2–8.3) against TRL, the
authors' releases and hand-made tensors."""

from __future__ import annotations

import pytest
import torch

from lit_rlvr.functional.entropy import (
    ENTROPY_CONTROLS,
    TOKEN_MASKS,
    EntropyState,
    entropy_bonus,
    initial_state,
    top_entropy,
)
from lit_rlvr.functional.logprobs import token_entropy
from lit_rlvr.functional.losses import policy_loss

H = torch.tensor(
    [[0.91, 0.02, 1.73, 0.40, 0.40, 2.50], [0.05, 1.10, 0.40, 0.33, 0.00, 0.00], [3.20, 0.60, 0.07, 0.00, 0.00, 0.00]]
)
MASK = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])

# trl 1.16.0 (installed; the same function at huggingface/trl f2cd5771), GRPOTrainer.get_high_entropy_mask
# (self.accelerator's pad/gather as one process) on H, MASK with threshold 1 − top_entropy_quantile:
TRL_MASKS = {
    0.0: [[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]],
    0.2: [[0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]],
    0.25: [[0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]],
    0.5: [[1, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]],  # the median 0.40 is tied three times: all kept
    0.75: [[1, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]],
    1.0: [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]],
}
# The paper's release (zhouxiangxin1998/Beyond-the-80-20-Rule-RLVR e8619ca4, get_global_entropy_top_mask
# with a bool response mask) keeps the ⌈ρN⌉ = 3 highest of these 12 tokens for ρ = 0.2 and 0.25:
RELEASE_MASK_02 = [[0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("q", sorted(TRL_MASKS))
def test_forking_mask_equals_trl(q):
    got = top_entropy(H, MASK, top_entropy_quantile=q)
    assert got.int().tolist() == TRL_MASKS[q]
    if q in (0.2, 0.25):  # no tie at the threshold here: the same tokens as the paper's release
        assert got.int().tolist() == RELEASE_MASK_02


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forking_threshold_is_torch_quantile_without_its_size_limit(seed):
    gen = torch.Generator().manual_seed(seed)
    h = torch.rand(16, 40, generator=gen) * 3
    mask = torch.rand(16, 40, generator=gen) > 0.3
    for q in (0.05, 0.2, 0.5, 0.9):
        threshold = torch.quantile(h[mask], 1 - q)
        assert torch.equal(top_entropy(h, mask, top_entropy_quantile=q), (h >= threshold) & mask)
        assert abs(top_entropy(h, mask, top_entropy_quantile=q).sum() / mask.sum() - q) < 0.01


def test_forking_mask_of_an_empty_batch_and_its_option_check():
    assert not top_entropy(H, torch.zeros_like(MASK)).any()
    with pytest.raises(ValueError, match=r"token_mask_options: top_entropy_quantile must be in \[0, 1\]"):
        TOKEN_MASKS.get_checked("top_entropy", "token_mask", {"top_entropy_quantile": 1.5})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['entropy_top_ratio'\] of token mask 'top_entropy'"):
        TOKEN_MASKS.get_checked("top_entropy", "token_mask", {"entropy_top_ratio": 0.2})


def test_masked_tokens_get_exactly_zero_gradient_and_the_normaliser_counts_every_token():
    gen = torch.Generator().manual_seed(0)
    lp = (-torch.rand(3, 6, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.05 * torch.randn(3, 6, generator=gen)
    adv = torch.tensor([1.0, -0.5, 2.0])
    keep = top_entropy(H, MASK, top_entropy_quantile=0.5)
    loss, _ = policy_loss(lp, old, adv, MASK, token_weights=keep.float())
    loss.backward()
    assert (lp.grad[~keep] == 0).all() and (lp.grad[keep] != 0).all()
    full, _ = policy_loss(lp.detach(), old, adv, MASK, token_weights=None)
    per_token, _ = policy_loss(lp.detach(), old, adv, keep)  # the kept tokens' own mean
    torch.testing.assert_close(loss.detach(), per_token * keep.sum() / MASK.sum())  # TRL's normaliser: every token
    assert not torch.equal(loss.detach(), full)


def test_entropy_bonus_aggregates_like_the_loss_and_its_gradient_raises_entropy():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1), requires_grad=True)
    h = token_entropy(logits)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    bonus = entropy_bonus(h, mask)
    assert bonus.item() == pytest.approx(float(h.detach()[mask.bool()].mean()))
    (-bonus).backward()  # L − c·bonus: one gradient step on the loss raises every kept token's entropy
    stepped = token_entropy((logits - 0.1 * logits.grad).detach())
    assert (stepped[mask.bool()] > h.detach()[mask.bool()]).all()
    assert (logits.grad[1, 1:] == 0).all() and (logits.grad[0, 2] == 0).all()  # padding: no gradient
    h = h.detach()
    seq = entropy_bonus(h, mask, "seq_mean_token_mean")
    assert seq.item() == pytest.approx(float((h[0, :2].mean() + h[1, 0]) / 2))
    masked = entropy_bonus(h, mask, token_weights=torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert masked.item() == pytest.approx(float((h[0, 0] + h[1, 0]) / 3))


# SkyworkAI/Skywork-OR1 at 64e96afa, verl/trainer/ppo/core_algos.py EntController (extracted verbatim):
# EntController(init_ent_coef=0.002, max_ent_coef=0.005, min_ent_coef=0.0, delta_ent_coef=0.001,
# target_ent=0.2, use_adapt_ent=True), its (value, entropy_loss_enabled) before and after update(h):
SKYWORK_ENTROPIES = [0.35, 0.25, 0.19, 0.1, 0.15, 0.12, 0.18, 0.2, 0.21, 0.3, 0.05]
SKYWORK_STATES = [
    (0.002, 1),
    (0.001, 0),
    (0.0, 0),
    (0.001, 1),
    (0.002, 1),
    (0.003, 1),
    (0.004, 1),
    (0.005, 1),
    (0.004, 0),
    (0.003, 0),
    (0.002, 0),
    (0.003, 1),
]


def test_adaptive_control_equals_skywork_or1():
    options = {
        "entropy_coef": 0.002,
        "entropy_coef_max": 0.005,
        "entropy_coef_min": 0.0,
        "entropy_coef_delta": 0.001,
        "entropy_target": 0.2,
    }
    ENTROPY_CONTROLS.get_checked("adaptive", "control", options)
    state = initial_state("adaptive", options)
    states = [state]
    for h in SKYWORK_ENTROPIES:
        state = ENTROPY_CONTROLS["adaptive"](state, h, **options)
        states.append(state)
    assert [(round(s.coef, 10), int(s.active)) for s in states] == SKYWORK_STATES
    assert [s.applied for s in states[:3]] == [0.002, 0.0, 0.0]


def test_static_control_is_constant_and_refuses_zero():
    state = initial_state("static", {"entropy_coef": 0.01})
    assert state == EntropyState(0.01, True) and ENTROPY_CONTROLS["static"](state, 9.0, entropy_coef=0.01) == state
    with pytest.raises(ValueError, match="entropy_coef must be > 0 for a static bonus"):
        ENTROPY_CONTROLS.get_checked("static", "model.entropy.control", {"entropy_coef": 0.0}, "model.entropy.options")
    with pytest.raises(ValueError, match=r"needs option\(s\) \['entropy_coef'\]"):
        ENTROPY_CONTROLS.get_checked("static", "model.entropy.control", {}, "model.entropy.options")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            {"entropy_coef": 0.5, "entropy_coef_max": 0.1},
            r"entropy_coef_min \(0.0\) <= entropy_coef \(0.5\) <= entropy_coef_max \(0.1\)",
        ),
        ({"entropy_coef_delta": 0.0}, "entropy_coef_delta must be > 0"),
        ({"entropy_target": -1.0}, "entropy_target must be > 0"),
        ({"entropy_target": float("nan")}, "entropy_target must be a finite number"),
        (
            {"use_adaptive_entropy": True},
            r"unknown option\(s\) \['use_adaptive_entropy'\] of entropy control 'adaptive'",
        ),
    ],
)
def test_adaptive_options_are_checked_with_trl_names(options, match):
    with pytest.raises(ValueError, match=match):
        ENTROPY_CONTROLS.get_checked("adaptive", "model.entropy.control", options, "model.entropy.options")


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_the_entropy_bonus_of_bf16_entropies_is_summed_in_float32_and_fp32_is_unchanged(agg):
    """A bf16 sum over a batch's tokens keeps ~3 significant digits: the bonus (and its gradient's
    scale) moved with the dtype. float32 entropies give the same bits as aggregating them directly."""
    from lit_rlvr.functional.losses import aggregate

    gen = torch.Generator().manual_seed(0)
    h = torch.rand(8, 700, generator=gen, dtype=torch.float32) * 3
    mask = (torch.rand(8, 700, generator=gen) > 0.2).long()
    h16 = h.bfloat16().requires_grad_()
    bonus = entropy_bonus(h16, mask, agg, max_len=700)
    assert bonus.dtype == torch.float32
    assert torch.equal(bonus, aggregate(h16.detach().float(), mask, agg, 700))  # the bf16 values, summed exactly
    bonus.backward()
    assert h16.grad.dtype == torch.bfloat16 and h16.grad[mask.bool()].abs().min() > 0
    assert torch.equal(entropy_bonus(h, mask, agg, max_len=700), aggregate(h, mask, agg, 700))  # fp32: bit for bit
    weights = (torch.rand(8, 700, generator=gen) > 0.5).float()
    assert torch.equal(entropy_bonus(h, mask, agg, 700, weights), aggregate(h * weights, mask, agg, 700))


def test_token_entropy_of_bf16_logits_is_float32():
    logits = torch.randn(2, 5, 300, generator=torch.Generator().manual_seed(0))
    got = token_entropy(logits.bfloat16())
    assert got.dtype == torch.float32 and torch.equal(got, token_entropy(logits.bfloat16().float()))
