"""Diversity metrics against plain Python loops."""

import math

import pytest
import torch

from lit_rlvr.functional.metrics import (
    distinct_answers,
    distinct_completions,
    distinct_correct_answers,
    mean_token_entropy,
    zero_variance_groups,
)
from lit_rlvr.metrics import (
    DistinctAnswers,
    DistinctCompletions,
    DistinctCorrectAnswers,
    MeanTokenEntropy,
    ZeroVarianceShare,
)


def random_groups(P, n, seed, alphabet="abcd"):
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, len(alphabet) + 1, (P, n), generator=gen)  # last index = None
    answers = [[alphabet[j] if j < len(alphabet) else None for j in row] for row in pick.tolist()]
    correct = torch.rand(P, n, generator=gen) < 0.5
    return answers, correct


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("P,n", [(1, 1), (5, 3), (12, 16)])
def test_distinct_answers_and_correct_answers_match_loops(P, n, seed):
    answers, correct = random_groups(P, n, seed)
    want_all, want_correct = [], []
    for row, c in zip(answers, correct.tolist()):
        seen, seen_ok = [], []
        for a, ok in zip(row, c):
            if a is not None and a not in seen:
                seen.append(a)
            if a is not None and ok and a not in seen_ok:
                seen_ok.append(a)
        want_all.append(len(seen))
        want_correct.append(len(seen_ok))
    assert distinct_answers(answers).tolist() == want_all
    assert distinct_correct_answers(answers, correct).tolist() == want_correct
    m_all, m_ok = DistinctAnswers(), DistinctCorrectAnswers()
    m_all.update(answers[: P // 2])
    m_all.update(answers[P // 2 :])
    m_ok.update(answers, correct)
    assert m_all.compute().item() == pytest.approx(sum(want_all) / P)
    assert m_ok.compute().item() == pytest.approx(sum(want_correct) / P)


def test_distinct_completions_matches_loop():
    groups = [["a", "a", "b", "A"], ["x"], ["", "", ""], ["q", "r", "s", "t"]]
    want = [len({t for t in g}) for g in groups]
    assert want == [3, 1, 1, 4]
    assert distinct_completions(groups).tolist() == want
    metric = DistinctCompletions()
    metric.update(groups[:1])
    metric.update(groups[1:])
    assert metric.compute().item() == pytest.approx(9 / 4)


@pytest.mark.parametrize("seed", range(4))
def test_zero_variance_groups_match_loop_any_order_and_sizes(seed):
    gen = torch.Generator().manual_seed(seed)
    group_ids = torch.randint(0, 12, (50,), generator=gen) * 7 - 20  # arbitrary ids, shuffled, ragged
    rewards = (torch.rand(50, generator=gen) < 0.15).float()
    if seed == 0:
        rewards = torch.rand(50, generator=gen)  # non-binary rewards too
    want = [
        len({float(r) for r, g in zip(rewards, group_ids) if g == gid}) == 1 for gid in sorted(set(group_ids.tolist()))
    ]
    got = zero_variance_groups(rewards, group_ids)
    assert got.tolist() == want
    metric = ZeroVarianceShare()
    metric.update(rewards, group_ids)
    metric.update(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert metric.compute().item() == pytest.approx(sum(want) / (len(want) + 1))


def test_zero_variance_edge_cases():
    assert zero_variance_groups(torch.tensor([0.3]), torch.tensor([4])).tolist() == [True]  # group of one
    assert zero_variance_groups(torch.ones(6), torch.tensor([0, 0, 0, 1, 1, 1])).tolist() == [True, True]
    with pytest.raises(ValueError, match=r"\(B,\)"):
        zero_variance_groups(torch.ones(3), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("B,T", [(1, 1), (4, 7), (9, 33)])
def test_mean_token_entropy_matches_loop(B, T, seed):
    gen = torch.Generator().manual_seed(seed)
    entropy = torch.rand(B, T, generator=gen) * 3
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    lengths[0] = max(1, int(lengths[0]))  # at least one real token
    mask = (torch.arange(T) < lengths[:, None]).long()
    entropy[mask == 0] = float("nan")  # padding values must not leak
    vals = [float(entropy[b, t]) for b in range(B) for t in range(T) if mask[b, t]]
    want = sum(vals) / len(vals)
    assert mean_token_entropy(entropy, mask).item() == pytest.approx(want, rel=1e-12)
    metric = MeanTokenEntropy()
    for b in range(B):  # token-weighted across updates, not a mean of batch means
        metric.update(entropy[b : b + 1], mask[b : b + 1])
    assert metric.compute().item() == pytest.approx(want, rel=1e-12)


def test_mean_token_entropy_fully_masked_is_nan_and_shape_error():
    assert math.isnan(mean_token_entropy(torch.ones(2, 3), torch.zeros(2, 3)).item())
    with pytest.raises(ValueError, match="same"):
        mean_token_entropy(torch.ones(2, 3), torch.ones(2, 4))
