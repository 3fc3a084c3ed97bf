"""pass_at_k (Chen et al. 2021, Eq. 1) and pass_hat_k (pass^k) against exact fractions of math.comb."""

from fractions import Fraction
from math import comb

import pytest
import torch

from lit_rlvr.functional import pass_at_k
from lit_rlvr.functional.passk import pass_hat_k


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(comb(n - c, k), comb(n, k))


@pytest.mark.parametrize("n", [1, 2, 5, 16, 33])
def test_matches_exact_fraction_for_every_c_and_k(n):
    for k in range(1, n + 1):
        for c in range(n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), abs=1e-13)


@pytest.mark.parametrize("n", [1024, 4096])
@pytest.mark.parametrize("k", [1, 7, 256, 1024])
def test_stable_for_large_n(n, k):
    c = torch.tensor([0, 1, 2, 50, n - k, n - k + 1, n])
    got = pass_at_k(n, c, k)
    want = [float(exact_pass_at_k(n, int(ci), k)) for ci in c]
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-12)


def test_exactly_one_when_too_few_failures():
    assert pass_at_k(10, 8, 3) == 1.0
    assert pass_at_k(torch.tensor(4096), torch.tensor(4000), 97).item() == 1.0


def test_broadcasting_paths_agree():
    gen = torch.Generator().manual_seed(0)
    n = torch.randint(1, 40, (50,), generator=gen)
    c = (torch.rand(50, generator=gen) * (n + 1)).floor().long()
    k = torch.minimum(torch.randint(1, 10, (50,), generator=gen), n)
    got = pass_at_k(n, c, k)
    want = torch.tensor([float(exact_pass_at_k(int(a), int(b), int(d))) for a, b, d in zip(n, c, k)])
    assert torch.allclose(got, want.double(), atol=1e-12)
    # scalar n and k take the cumulative-table path; it must agree with the grid path
    c = torch.arange(0, 33)
    assert torch.allclose(pass_at_k(32, c, 4), pass_at_k(torch.full((33,), 32), c, torch.full((33,), 4)))


@pytest.mark.parametrize(
    ("n", "c", "k", "match"),
    [(3, 1, 4, "n=3, c=1, k=4"), (3, 4, 1, "n=3, c=4, k=1"), (3, 1, 0, "k=0"), (3, -1, 1, "c=-1")],
)
def test_invalid_values_name_themselves(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError, match=match):
        pass_at_k(torch.tensor([5, n]), torch.tensor([0, c]), k)


# ----------------------------------------------------------------------------- pass^k (docs/methods.md §4.5)


def exact_pass_hat_k(n: int, c: int, k: int) -> Fraction:
    """prime-rl's ``compute_pass_metrics``: C(c, k)/C(n, k), math.comb giving 0 when k > c."""
    return Fraction(comb(c, k), comb(n, k))


@pytest.mark.parametrize("n", [1, 2, 5, 16, 33])
def test_pass_hat_k_matches_exact_fraction_for_every_c_and_k(n):
    for k in range(1, n + 1):
        got = pass_hat_k(torch.tensor(n), torch.arange(n + 1), k)
        want = torch.tensor([float(exact_pass_hat_k(n, c, k)) for c in range(n + 1)], dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-15)
        for c in range(n + 1):
            assert pass_hat_k(n, c, k) == pytest.approx(float(exact_pass_hat_k(n, c, k)), rel=1e-13, abs=1e-15)
    assert [pass_hat_k(n, c, 1) for c in range(n + 1)] == [c / n for c in range(n + 1)]  # k = 1: c/n, pass@1


@pytest.mark.parametrize("n", [1024, 4096])
@pytest.mark.parametrize("k", [1, 7, 256, 1024])
def test_pass_hat_k_stable_for_large_n_and_exactly_zero_below_k(n, k):
    c = torch.tensor([0, k - 1, k, min(k + 1, n), max(n // 2, k), n - 1, n])
    got = pass_hat_k(n, c, k)
    want = [float(exact_pass_hat_k(n, int(ci), k)) for ci in c]
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=0.0)
    assert got[1].item() == 0.0 and got[-1].item() == 1.0


def test_pass_hat_k_broadcasts_and_refuses_bad_values():
    gen = torch.Generator().manual_seed(1)
    n = torch.randint(1, 40, (50,), generator=gen)
    c = (torch.rand(50, generator=gen) * (n + 1)).floor().long()
    k = torch.minimum(torch.randint(1, 10, (50,), generator=gen), n)
    want = [float(exact_pass_hat_k(int(a), int(b), int(d))) for a, b, d in zip(n, c, k)]
    assert torch.allclose(pass_hat_k(n, c, k), torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0.0)
    with pytest.raises(ValueError, match=r"pass\^k needs 1 <= k <= n and 0 <= c <= n; got n=3, c=1, k=4"):
        pass_hat_k(3, 1, 4)
    with pytest.raises(ValueError, match="c=-1"):
        pass_hat_k(torch.tensor([5, 3]), torch.tensor([0, -1]), 1)
