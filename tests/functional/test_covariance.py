"""Clip-Cov and KL-Cov (docs/methods.md §8.1) against verl's functions, by hand, and in their gradients."""

from __future__ import annotations

import pytest
import torch

from lit_rlvr.functional.covariance import clip_cov_select, kl_cov_select, token_covariance
from lit_rlvr.functional.losses import POLICY_LOSSES, policy_loss

# verl-project/verl at 1dda039b, verl/trainer/ppo/core_algos.py: compute_policy_loss_clip_cov and
# compute_policy_loss_kl_cov (with agg_loss and verl_F.masked_sum/masked_mean of the same commit),
# extracted verbatim and run on these inputs with loss_agg_mode "token-mean", clip_ratio_low 0.2,
# clip_ratio_high 0.28; the loss and d loss / d log_prob (autograd) they returned:
LOG_PROB = [
    [-0.20, -1.50, -0.05, -2.40, -0.90],
    [-3.00, -0.10, -0.70, -1.20, 0.00],
    [-0.40, -2.20, -0.15, -0.60, -1.80],
]
OLD_LOG_PROB = [
    [-0.25, -1.20, -0.05, -2.80, -0.90],
    [-2.70, -0.40, -0.70, -1.20, 0.00],
    [-0.40, -2.00, -0.55, -0.60, -1.70],
]
MASK = [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]
ADVANTAGES = [1.5, -1.0, 0.8]  # one per row, every token of the row
VERL = {
    # clip_cov_ratio 0.5, clip_cov_lb 0.3, clip_cov_ub 2.0: 2 candidates (≤ 6 to draw), so no randomness
    "clip_cov": (
        {"clip_cov_ratio": 0.5, "clip_cov_lb": 0.3, "clip_cov_ub": 2.0},
        -0.23836274445056915,
        [
            [-0.0, -0.09260228, -0.0, 0.0, -0.125],
            [0.0, 0.11248824, 0.08333334, 0.08333334, 0.0],
            [-0.06666667, -0.05458205, 0.0, -0.0, -0.0],
        ],
        0.1666666716337204,  # actor/pg_clipfrac: the detached share
    ),
    "kl_cov": (
        {"kl_cov_ratio": 0.25, "ppo_kl_coef": 1.0},
        -0.5111364722251892,
        [
            [-0.04807555, -0.09260228, -0.125, -0.18647806, -0.125],
            [-0.02159848, 0.11248824, 0.08333334, 0.08333334, 0.0],
            [-0.06666667, -0.05458205, -0.09945499, 0.0, -0.0],
        ],
        0.25,  # the penalised share: 3 of 12 tokens
    ),
}


def inputs():
    lp = torch.tensor(LOG_PROB, requires_grad=True)
    return lp, torch.tensor(OLD_LOG_PROB), torch.tensor(ADVANTAGES), torch.tensor(MASK)


@pytest.mark.parametrize("name", sorted(VERL))
def test_loss_and_gradient_equal_verl(name):
    options, loss_want, grad_want, share = VERL[name]
    lp, old, adv, mask = inputs()
    loss, stats = policy_loss(
        lp,
        old,
        adv,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        loss=name,
        options=options,
        generator=torch.Generator().manual_seed(0),
    )
    loss.backward()
    assert loss.item() == pytest.approx(loss_want, rel=1e-6, abs=1e-7)
    torch.testing.assert_close(lp.grad, torch.tensor(grad_want), rtol=1e-5, atol=1e-7)
    assert stats["selected"].item() == pytest.approx(share)


def test_clip_cov_detaches_exactly_the_selected_and_keeps_the_clipped_surrogate_elsewhere():
    lp, old, adv, mask = inputs()
    selected = clip_cov_select(
        lp.detach(),
        old,
        adv[:, None].expand(3, 5),
        mask,
        clip_cov_ratio=0.5,
        clip_cov_lb=0.3,
        clip_cov_ub=2.0,
        clip_low=0.2,
        clip_high=0.28,
    )
    assert selected.nonzero().tolist() == [[0, 0], [0, 2]]  # in the band and not clipped: (1, 0) is above ub
    loss, _ = policy_loss(
        lp,
        old,
        adv,
        mask,
        loss="clip_cov",
        options={"clip_cov_ratio": 0.5, "clip_cov_lb": 0.3, "clip_cov_ub": 2.0},
        selected=selected,
    )
    loss.backward()
    assert (lp.grad[selected] == 0).all() and (lp.grad[~mask.bool()] == 0).all()
    lp2 = lp.detach().clone().requires_grad_(True)
    vanilla, _ = policy_loss(
        lp2, old, adv, mask, token_weights=(~selected).float()
    )  # the same tokens dropped by weight
    vanilla.backward()
    torch.testing.assert_close(loss.detach(), vanilla.detach())
    torch.testing.assert_close(lp.grad, lp2.grad)


def test_clip_cov_draws_its_share_from_the_band_with_the_generator():
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(8, 50, generator=gen) * 4
    adv = torch.randn(8, generator=gen)[:, None].expand(8, 50)
    mask = torch.ones(8, 50)
    cov = token_covariance(lp, adv, mask)
    band = (cov > 0.2) & (cov < 3.0)
    draws = [
        clip_cov_select(
            lp,
            lp,
            adv,
            mask,
            clip_cov_ratio=0.05,
            clip_cov_lb=0.2,
            clip_cov_ub=3.0,
            clip_low=0.2,
            clip_high=0.2,
            generator=torch.Generator().manual_seed(s),
        )
        for s in (0, 0, 1)
    ]
    assert band.sum() > 20 and all(int(d.sum()) == 20 for d in draws)  # ⌊0.05 · 400⌋ of the candidates
    assert all((d <= band).all() for d in draws)
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])


def test_clip_cov_selects_at_least_one_and_nothing_without_candidates():
    lp, adv, mask = torch.tensor([[-0.1, -3.0]]), torch.tensor([[2.0, 2.0]]), torch.ones(1, 2)
    none = clip_cov_select(
        lp, lp, adv, mask, clip_low=0.2, clip_high=0.2
    )  # every advantage equal: Cov = 0, outside (1, 5)
    assert not none.any()
    adv = torch.tensor([[3.0, -3.0]])  # Cov = 3·1.45 = 4.35 for both tokens: one drawn (⌊2e-4 · 2⌋ → at least 1)
    assert clip_cov_select(lp, lp, adv, mask, clip_low=0.2, clip_high=0.2).sum() == 1


def test_kl_cov_takes_the_top_share_ties_to_the_earlier_token():
    lp = torch.tensor([[-1.0, -1.0, -1.0], [-3.0, -3.0, -3.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])  # every covariance is 1
    got = kl_cov_select(lp, lp, adv, torch.ones(2, 3), kl_cov_ratio=0.5)
    assert got.tolist() == [[True, True, True], [False, False, False]]
    lp[1, 2] = -4.0  # now (1, 2) has the largest covariance: it comes first
    assert kl_cov_select(lp, lp, adv, torch.ones(2, 3), kl_cov_ratio=0.34).tolist() == [
        [True, False, False],
        [False, False, True],
    ]
    assert not kl_cov_select(lp, lp, adv, torch.zeros(2, 3)).any()  # no tokens, nothing selected


def test_kl_cov_is_unclipped_with_the_penalty_only_on_selected_tokens():
    log_ratio = torch.tensor([[0.5, 0.5, -0.7]], requires_grad=True)
    adv = torch.tensor([[1.0]])
    selected = torch.tensor([[True, False, True]])
    loss_t = POLICY_LOSSES["kl_cov"].loss(log_ratio, adv, selected, ppo_kl_coef=2.0, clip_low=0.2, clip_high=0.2)
    want = -torch.exp(log_ratio.detach()) + 2.0 * log_ratio.detach().abs() * selected
    torch.testing.assert_close(loss_t.detach(), want)  # ρ = e^0.5 is above 1 + ε: no clip


def test_padding_and_nonfinite_old_logprobs_stay_out_of_the_selection():
    lp = torch.tensor([[-0.5, -2.0, float("-inf")]])
    adv = torch.tensor([[2.0, -2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0]])
    cov = token_covariance(lp, adv, mask)
    assert cov[0, 2] == float("-inf") and cov[0, :2].isfinite().all()
    old = torch.tensor([[float("-inf"), -2.0, 0.0]])
    for name, options in (("clip_cov", {"clip_cov_lb": 0.1}), ("kl_cov", {})):
        x = lp.clone().nan_to_num(neginf=-5.0).requires_grad_(True)
        loss, _ = policy_loss(x, old, adv[:, 0], mask, loss=name, options=options)
        loss.backward()
        assert loss.isfinite() and x.grad.isfinite().all() and x.grad[0, 2] == 0


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("clip_cov", {"clip_cov_ratio": 0.0}, r"clip_cov_ratio must be a share of the batch's tokens in \(0, 1\]"),
        (
            "clip_cov",
            {"clip_cov_lb": 5.0, "clip_cov_ub": 1.0},
            r"clip_cov_lb \(5.0\) must be below clip_cov_ub \(1.0\)",
        ),
        (
            "clip_cov",
            {"kl_cov_ratio": 0.1},
            r"unknown option\(s\) \['kl_cov_ratio'\] of policy loss 'clip_cov'; accepted: "
            r"\['clip_cov_lb', 'clip_cov_ratio', 'clip_cov_ub'\]",
        ),
        ("kl_cov", {"ppo_kl_coef": 0.0}, "ppo_kl_coef must be > 0"),
        ("kl_cov", {"k_percent": 0.2}, r"accepted: \['kl_cov_ratio', 'ppo_kl_coef'\]"),
        ("clip_kov", {}, r"unknown policy loss 'clip_kov'; valid names: \['clip_cov', 'kl_cov', 'vanilla'\]"),
    ],
)
def test_options_are_checked_with_verl_names(name, options, match):
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=match):
        policy_loss(x, x, torch.ones(1), torch.ones(1, 2), loss=name, options=options)


def test_kl_cov_refuses_a_dual_clip_it_would_ignore():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="policy loss 'kl_cov' does not clip, so dual_clip=3.0 would have no effect"):
        policy_loss(x, x, torch.ones(1), torch.ones(1, 2), loss="kl_cov", dual_clip=3.0)
    policy_loss(x, x, torch.ones(1), torch.ones(1, 2), loss="clip_cov", dual_clip=3.0)  # Clip-Cov clips: it composes


def test_vanilla_is_the_clipped_surrogate_and_its_options_are_none():
    assert POLICY_LOSSES.options("vanilla") == [] and POLICY_LOSSES.declares("vanilla", "dual_clip")
    assert POLICY_LOSSES.options("clip_cov") == ["clip_cov_lb", "clip_cov_ratio", "clip_cov_ub"]
    assert POLICY_LOSSES.options("kl_cov") == ["kl_cov_ratio", "ppo_kl_coef"]
    assert POLICY_LOSSES.defaults("kl_cov") == {"kl_cov_ratio": 0.0002, "ppo_kl_coef": 1.0}  # verl's defaults
