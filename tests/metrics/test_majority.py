"""MajorityAtK against a naive Counter-based majority vote."""

from collections import Counter

import pytest
import torch

from lit_rlvr.functional.metrics import majority_at_k, per_prompt_majority_at_k
from lit_rlvr.metrics import MajorityAtK


def naive_maj(answers: list, correct: list, k: int) -> float:
    votes = Counter(a for a in answers[:k] if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [a for a in votes if votes[a] == top]
    winner = min(tied, key=answers.index)  # earliest first occurrence
    return float(correct[answers.index(winner)])


def random_case(P: int, n: int, seed: int, alphabet: str = "abc", p_none: float = 0.3):
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, len(alphabet), (P, n), generator=gen)
    none = torch.rand(P, n, generator=gen) < p_none
    answers = [[None if none[i, j] else alphabet[pick[i, j]] for j in range(n)] for i in range(P)]
    gold = torch.randint(0, len(alphabet), (P,), generator=gen)
    correct = (pick == gold[:, None]) & ~none  # correctness is a function of the answer key
    return answers, correct


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("P,n,alphabet", [(1, 1, "a"), (30, 4, "ab"), (20, 9, "abc"), (10, 32, "abcdefgh")])
def test_matches_naive_counter_reference(P, n, alphabet, seed):
    answers, correct = random_case(P, n, seed, alphabet)
    ks = tuple(range(1, n + 1))
    got = per_prompt_majority_at_k(answers, correct, ks)
    rows = [[naive_maj(a, c.tolist(), k) for k in ks] for a, c in zip(answers, correct)]
    want = torch.tensor(rows, dtype=torch.float64)
    assert torch.equal(got, want)
    metric = MajorityAtK(k=ks)
    metric.update(answers, correct)
    for j, k in enumerate(ks):
        assert metric.compute()[f"maj@{k}"].item() == pytest.approx(want[:, j].mean().item(), rel=1e-14)


@pytest.mark.parametrize(
    "answers,correct,k,want",
    [
        (["x", "y"], [0, 1], 2, 0.0),  # 1-1 tie: x was seen first
        (["y", "x", "x", "y"], [1, 0, 0, 1], 4, 1.0),  # 2-2 tie: y first
        (["y", "x", "x", "y"], [1, 0, 0, 1], 3, 0.0),  # x leads 2-1
        ([None, None, "z"], [0, 0, 1], 3, 1.0),  # None never wins against an answer
        ([None, None, None], [0, 0, 0], 3, 0.0),  # all None: incorrect
        ([None, "a", None, None], [0, 0, 0, 0], 4, 0.0),
        (["a", None, None, "b", "b"], [1, 0, 0, 0, 0], 5, 0.0),  # b wins 2-1 although None has 2
    ],
)
def test_ties_and_none(answers, correct, k, want):
    got = per_prompt_majority_at_k([answers], torch.tensor([correct]), (k,))
    assert got.item() == want == naive_maj(answers, correct, k)


def test_class_equals_functional_over_updates():
    a1, c1 = random_case(7, 8, 0)
    a2, c2 = random_case(5, 8, 1)
    metric = MajorityAtK(k=(1, 4, 8))
    metric.update(a1, c1)
    metric.update(a2, c2)
    want = majority_at_k(a1 + a2, torch.cat([c1, c2]), k=(1, 4, 8))
    got = metric.compute()
    for key in want:
        assert got[key].item() == pytest.approx(want[key].item(), rel=1e-14)


def test_errors():
    with pytest.raises(ValueError, match="k=16 exceeds n=8"):
        MajorityAtK(k=(1, 16)).update([["a"] * 8], torch.ones(1, 8))
    with pytest.raises(ValueError, match="P=2 lists of n=3"):
        majority_at_k([["a", "b", "c"], ["a"]], torch.ones(2, 3), k=(1,))
    with pytest.raises(ValueError, match="bool or 0/1"):
        majority_at_k([["a", "b"]], torch.tensor([[2, 0]]), k=(1,))
