"""PassAtK and pass_at_k_curve against exact fractions (Chen et al. 2021, Eq. 1)."""

from fractions import Fraction
from math import comb

import pytest
import torch

from lit_rlvr.functional.metrics import correct_counts, pass_at_k_curve, per_prompt_pass_at_k
from lit_rlvr.metrics import PassAtK


def exact(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def exact_mean(counts: list[tuple[int, int]], k: int) -> float:
    return float(sum(exact(n, c, k) for n, c in counts) / len(counts))


def random_correct(P: int, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    p = torch.rand(P, 1, generator=gen) ** 2  # many low-accuracy prompts, some high
    correct = torch.rand(P, n, generator=gen) < p
    correct[0] = False  # always include the all-wrong and all-right edge cases
    correct[-1] = True
    return correct


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("P,n", [(1, 1), (2, 3), (7, 16), (40, 64), (5, 1024)])
def test_class_and_functional_match_exact_fractions(P, n, seed):
    ks = tuple(k for k in (1, 2, 3, 4, 8, 16, 64, 1024) if k <= n)
    correct = random_correct(P, n, seed)
    counts = [(n, int(c)) for c in correct.sum(1)]
    metric = PassAtK(k=ks)
    metric.update(correct)
    got_class = metric.compute()
    got_fn = pass_at_k_curve(correct, k=ks)
    assert list(got_class) == [f"pass@{k}" for k in ks]
    for k in ks:
        want = exact_mean(counts, k)
        assert got_class[f"pass@{k}"].item() == pytest.approx(want, rel=1e-11, abs=1e-13)
        assert got_fn[f"pass@{k}"].item() == pytest.approx(want, rel=1e-11, abs=1e-13)


@pytest.mark.parametrize("seed", [0, 1])
def test_per_prompt_values_with_mixed_n_match_fractions(seed):
    gen = torch.Generator().manual_seed(seed)
    n = torch.randint(4, 40, (60,), generator=gen)
    c = (torch.rand(60, generator=gen) * (n + 1)).floor().long()
    got = per_prompt_pass_at_k(c, n, (1, 2, 4))
    rows = [[float(exact(int(ni), int(ci), k)) for k in (1, 2, 4)] for ni, ci in zip(n, c)]
    want = torch.tensor(rows, dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-14)


def test_updates_with_different_n_average_per_prompt_estimates():
    a, b = random_correct(6, 4, 0), random_correct(3, 10, 1)
    metric = PassAtK(k=(1, 2, 4))
    metric.update(a)
    metric.update(num_correct=b.sum(1), n=10)
    counts = [(4, int(c)) for c in a.sum(1)] + [(10, int(c)) for c in b.sum(1)]
    out = metric.compute()
    for k in (1, 2, 4):
        assert out[f"pass@{k}"].item() == pytest.approx(exact_mean(counts, k), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 3])
def test_counts_and_bool_and_float_inputs_agree(seed):
    correct = random_correct(25, 12, seed)
    ks = (1, 2, 5, 12)
    by_bool = pass_at_k_curve(correct, k=ks)
    by_float = pass_at_k_curve(correct.float(), k=ks)
    by_counts = pass_at_k_curve(num_correct=correct.sum(1), n=12, k=ks)
    by_count_tensor_n = pass_at_k_curve(num_correct=correct.sum(1), n=torch.full((25,), 12), k=ks)
    for key in by_bool:
        assert by_bool[key] == by_float[key] == by_counts[key] == by_count_tensor_n[key]


def test_class_equals_functional_over_several_updates_and_forward():
    chunks = [random_correct(P, 8, s) for s, P in enumerate([3, 1, 9])]
    metric = PassAtK(k=(1, 4, 8))
    batch_values = [metric(chunk) for chunk in chunks]  # forward: batch value, and accumulates
    assert batch_values[1] == pass_at_k_curve(chunks[1], k=(1, 4, 8))
    want = pass_at_k_curve(torch.cat(chunks), k=(1, 4, 8))
    got = metric.compute()
    for key in want:
        assert got[key].item() == pytest.approx(want[key].item(), rel=1e-14)
    metric.reset()
    metric.update(chunks[0])
    assert metric.compute() == pass_at_k_curve(chunks[0], k=(1, 4, 8))


def test_k_larger_than_n_is_an_error_naming_k_and_n():
    metric = PassAtK(k=(1, 2, 4, 8, 16))
    with pytest.raises(ValueError, match=r"k=16 exceeds n=8"):
        metric.update(torch.ones(3, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"k=16 exceeds n=5"):
        metric.update(num_correct=torch.tensor([1, 2]), n=torch.tensor([20, 5]))
    assert metric.num_prompts.item() == 0  # nothing was counted by the failed updates


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({}, "exactly one"),
        ({"correct": torch.ones(2, 2), "num_correct": torch.ones(2)}, "exactly one"),
        ({"correct": torch.ones(2, 2), "n": 2}, "implied"),
        ({"correct": torch.ones(4)}, r"\(P, n\) tensor, got \(4,\)"),
        ({"correct": torch.tensor([[0.5, 1.0]])}, "bool or 0/1"),
        ({"num_correct": torch.tensor([1, 2])}, "needs `n`"),
        ({"num_correct": torch.tensor([1, 3]), "n": 2}, "num_correct=3, n=2"),
        ({"num_correct": torch.tensor([1.5]), "n": 2}, "integer counts"),
    ],
)
def test_bad_inputs_are_specific_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        correct_counts(**kwargs)


@pytest.mark.parametrize("k", [(), (0, 1), (1, 1), (2.0,)])
def test_bad_budgets_rejected(k):
    with pytest.raises(ValueError, match="PassAtK: k"):
        PassAtK(k=k)
