"""UCPO's advantage (docs/methods.md §10) against a transcription of the authors' code and by its properties."""

from __future__ import annotations

import random

import pytest
import torch

from lit_rlvr.functional.advantages import ADVANTAGES
from lit_rlvr.functional.losses import masked_row_mean

ucpo = ADVANTAGES["ucpo"]


def release_invq_l(token_level_rewards, response_mask, old_log_prob, index, tau=0.3, alpha=0.0, epsilon=1e-8):
    """The authors' ``compute_dgrpo_advantage_outcome_invq_l`` (AnamikaLochab/UCPO 22a3b99,
    ``verl/verl/trainer/ppo/core_algos.py``), transcribed line by line without its statistics and its
    ``alpha`` branch (0 in the paper's runs); ``index`` is a list of int group ids. Returns ``(B,)``."""
    assert alpha == 0.0
    idx_t = torch.tensor(index, dtype=torch.long)
    scores = token_level_rewards.sum(dim=-1)  # [B]
    seq_logp = (old_log_prob * response_mask).sum(dim=-1)  # [B]

    advantages = torch.zeros_like(scores)
    unique_groups = torch.unique(idx_t)
    for gid in unique_groups:
        gmask = idx_t == gid
        group_scores = scores[gmask]
        if group_scores.numel() > 1:
            mean_g = group_scores.mean()
            std_g = group_scores.std(unbiased=True)
            advantages[gmask] = (group_scores - mean_g) / (std_g + epsilon)
        else:
            advantages[gmask] = group_scores - group_scores.mean()
    original_advantages = advantages.clone()

    for gid in unique_groups:
        gidx = torch.nonzero(idx_t == gid, as_tuple=False).squeeze(-1)
        group_logp = seq_logp[gidx]
        group_scores = scores[gidx]
        lengths = (response_mask[gidx] > 0).sum(dim=-1)
        corr_mask = group_scores > 0
        if corr_mask.sum() > 1:
            valid_idx = gidx[corr_mask]
            log_pi = group_logp[corr_mask]
            lens = lengths[corr_mask]
            n_correct = corr_mask.sum().float()
            log_pi_scaled = log_pi / lens
            log_q = log_pi_scaled - torch.logsumexp(log_pi_scaled, dim=0)
            q = log_q.exp()
            q_clamped = q.clamp(min=1e-6)
            inv_q = 1.0 / q_clamped
            target_weights = inv_q / inv_q.sum()
            uniform_weights = torch.ones_like(q) / n_correct
            blended_weights = (1.0 - tau) * uniform_weights + tau * target_weights
            A_base = original_advantages[valid_idx[0]]
            per_response_weights = blended_weights * n_correct
            advantages[valid_idx] = A_base * per_response_weights
    return advantages


# Hand-made groups, rows interleaved: (group, reward, per-token old log-probs)
HAND_ROWS = [
    (7, 1.0, [-0.1, -0.3, -0.2]),  # 7: three of five correct, lengths 3, 1, 2
    (2, 1.0, [-0.5, -0.5]),  # 2: two of three correct, one of them ~e^-20 less likely: q clamped at 1e-6
    (7, 0.0, [-1.0, -0.5]),
    (7, 1.0, [-2.0]),
    (40, 1.0, [-0.4, -0.2]),  # 40: every row correct (GRPO's A = 0, so UCPO's too)
    (7, 1.0, [-0.7, -0.9]),
    (2, 1.0, [-20.0, -21.0, -19.5]),
    (5, 0.0, [-0.3]),  # 5: one correct of four (nothing to redistribute)
    (5, 1.0, [-0.2, -0.1]),
    (40, 1.0, [-1.2]),
    (7, 0.0, [-3.0, -0.2, -0.4]),
    (2, 0.0, [-0.6, -0.6]),
    (5, 0.0, [-0.9, -0.9]),
    (9, 1.0, [-0.8]),  # 9: a group of one
    (5, 0.0, [-1.1]),
    (11, 0.0, [-0.5, -0.5]),  # 11: none correct
    (11, 0.0, [-1.5]),
]


def padded(rows) -> tuple[torch.Tensor, ...]:
    """The release's inputs ``(B, T)`` (reward on the last real token) and lit_rlvr's ``(B,)`` ones."""
    width = max(len(lp) for _, _, lp in rows)
    mask = torch.zeros(len(rows), width, dtype=torch.float64)
    old = torch.zeros(len(rows), width, dtype=torch.float64)
    token_rewards = torch.zeros(len(rows), width, dtype=torch.float64)
    for i, (_, r, lp) in enumerate(rows):
        mask[i, : len(lp)], old[i, : len(lp)], token_rewards[i, len(lp) - 1] = 1.0, torch.tensor(lp), r
    rewards = torch.tensor([r for _, r, _ in rows])
    group_ids = torch.tensor([g for g, _, _ in rows])
    return token_rewards, mask, old, rewards, group_ids, masked_row_mean(old, mask).float()


@pytest.mark.parametrize("tau", [0.0, 0.2, 0.3, 0.7, 1.0])
def test_ucpo_equals_the_released_code_on_hand_made_groups(tau):
    token_rewards, mask, old, rewards, group_ids, mean_logprobs = padded(HAND_ROWS)
    want = release_invq_l(token_rewards, mask, old, group_ids.tolist(), tau=tau)
    got = ucpo(rewards, group_ids, mean_logprobs=mean_logprobs, tau=tau)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)
    if tau > 0:  # the hand-made groups exercise the redistribution: it moved the correct rows of 7 and 2
        grpo = ADVANTAGES["grpo"](rewards, group_ids, std="sample", eps=1e-8)
        assert not torch.allclose(got[[0, 3, 5, 1, 6]], grpo[[0, 3, 5, 1, 6]], atol=1e-3)


@pytest.mark.parametrize("seed", range(4))
def test_ucpo_equals_the_released_code_on_random_batches(seed):
    rng = random.Random(seed)
    rows = [
        (g, float(rng.random() < p), [rng.uniform(-4.0, 0.0) for _ in range(rng.randint(1, 6))])
        for g, p, n in [(rng.randint(-5, 500), rng.random(), rng.randint(1, 9)) for _ in range(6)]
        for _ in range(n)
    ]
    rng.shuffle(rows)
    token_rewards, mask, old, rewards, group_ids, mean_logprobs = padded(rows)
    want = release_invq_l(token_rewards, mask, old, group_ids.tolist(), tau=0.2)
    torch.testing.assert_close(ucpo(rewards, group_ids, mean_logprobs=mean_logprobs).double(), want, rtol=0, atol=1e-6)


def test_ucpo_keeps_each_correct_sets_mass_and_favours_the_least_likely():
    _, _, _, rewards, group_ids, mean_logprobs = padded(HAND_ROWS)
    grpo = ADVANTAGES["grpo"](rewards, group_ids, std="sample", eps=1e-8)
    assert torch.equal(ucpo(rewards, group_ids, mean_logprobs=mean_logprobs, tau=0.0), grpo)  # τ = 0 is GRPO
    for tau in (0.2, 1.0):
        got = ucpo(rewards, group_ids, mean_logprobs=mean_logprobs, tau=tau)
        for g in group_ids.unique():
            rows = group_ids == g
            torch.testing.assert_close(got[rows].sum(), grpo[rows].sum(), rtol=0, atol=1e-5)  # total unchanged
        assert torch.equal(got[rewards == 0], grpo[rewards == 0])  # incorrect rows keep GRPO's
        correct7 = [0, 3, 5]  # mean log-probs −0.2, −2.0, −0.8: the least likely gets the most
        assert got[3] > got[5] > got[0] > 0 and got[correct7].sum() > 0
    full = ucpo(rewards, group_ids, mean_logprobs=mean_logprobs, tau=1.0)
    q = torch.softmax(mean_logprobs[[0, 3, 5]].double(), 0)
    torch.testing.assert_close((full[[0, 3, 5]].double() * q), (full[[0, 3, 5]].double() * q)[:1].expand(3))  # A ∝ 1/q


def test_ucpo_a_non_finite_likelihood_keeps_grpos_advantage_and_the_others_share_their_mass():
    rewards, group_ids = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]), torch.zeros(5, dtype=torch.long)
    ell = torch.tensor([float("-inf"), -0.2, -1.5, -1.0, -0.3])
    grpo = ADVANTAGES["grpo"](rewards, group_ids, std="sample", eps=1e-8)
    got = ucpo(rewards, group_ids, mean_logprobs=ell, tau=0.5)
    assert got.isfinite().all() and got[0] == grpo[0]
    torch.testing.assert_close(got[1:3].sum(), grpo[1:3].sum())
    assert got[2] > got[1]
    nan = ucpo(rewards, group_ids, mean_logprobs=torch.full((5,), float("nan")), tau=0.5)
    assert torch.equal(nan, grpo)  # no finite likelihood: nothing to redistribute


def test_ucpo_options_injected_logprobs_and_refusals():
    assert ADVANTAGES.declares("ucpo", "mean_logprobs") and ADVANTAGES.options("ucpo") == ["eps", "std", "tau"]
    assert ADVANTAGES.trait("ucpo", "binary_rewards", default=False) is True
    assert ADVANTAGES.trait("ucpo", "min_group_size", {}, default=1) == 2
    for bad, match in [({"tau": 1.5}, r"tau must be in \[0, 1\]"), ({"std": "none"}, "std must be one of")]:
        with pytest.raises(ValueError, match=match):
            ADVANTAGES.get_checked("ucpo", "adv", bad)
    ones = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="mean_logprobs must have the shape of rewards"):
        ucpo(torch.ones(3), ones, mean_logprobs=torch.zeros(2))
    with pytest.raises(ValueError, match=r"ucpo needs binary rewards in \{0, 1\}; got 0.5 at row 1"):
        ucpo(torch.tensor([1.0, 0.5, 0.0]), ones, mean_logprobs=torch.zeros(3))
