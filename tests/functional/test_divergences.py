"""f-divergence generators against closed-form divergences, docs/methods.md gradient factors, loops."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlvr.functional.divergences import DIVERGENCES, f_divergence, register_divergence

NAMES = ["forward_kl", "reverse_kl", "js", "alpha", "tv", "hellinger", "chi2"]
# every generator, with the alpha-divergence at several α
CASES = [(n, {}) for n in NAMES if n != "alpha"]
CASES += [("alpha", {"alpha": a}) for a in (0.1, 0.5, 0.9)]
IDS = [n + "".join(f"-{v}" for v in o.values()) for n, o in CASES]


def f_of_u(name: str, u: float, alpha: float = 0.5) -> float:
    """The docs/methods.md §2 table, written in u with plain math."""
    return {
        "forward_kl": lambda: u - math.log(u) - 1,
        "reverse_kl": lambda: u * math.log(u) - u + 1,
        "js": lambda: 0.5 * (u * math.log(u) - (u + 1) * math.log((u + 1) / 2)),
        "alpha": lambda: (u ** (1 - alpha) - (1 - alpha) * u - alpha) / (alpha * (alpha - 1)),
        "tv": lambda: 0.5 * abs(u - 1),
        "hellinger": lambda: (math.sqrt(u) - 1) ** 2,
        "chi2": lambda: (u - 1) ** 2,
    }[name]()


def closed_form(name: str, p: list[float], q: list[float], alpha: float = 0.5) -> float:
    """The divergence each generator must produce, with p = π_θ and q = π_ref."""
    pq = list(zip(p, q))
    if name == "forward_kl":
        return sum(qi * math.log(qi / pi) for pi, qi in pq)  # KL(π_ref‖π_θ)
    if name == "reverse_kl":
        return sum(pi * math.log(pi / qi) for pi, qi in pq)  # KL(π_θ‖π_ref)
    if name == "js":
        m = [(pi + qi) / 2 for pi, qi in pq]
        kl_pm = sum(pi * math.log(pi / mi) for pi, mi in zip(p, m))
        kl_qm = sum(qi * math.log(qi / mi) for qi, mi in zip(q, m))
        return 0.5 * (kl_pm + kl_qm)
    if name == "alpha":  # Amari α-divergence: (1 − Σ p^{1−α} q^α) / (α(1−α))
        return (1 - sum(pi ** (1 - alpha) * qi**alpha for pi, qi in pq)) / (alpha * (1 - alpha))
    if name == "tv":
        return 0.5 * sum(abs(pi - qi) for pi, qi in pq)
    if name == "hellinger":
        return sum((math.sqrt(pi) - math.sqrt(qi)) ** 2 for pi, qi in pq)
    assert name == "chi2"
    return sum((pi - qi) ** 2 / qi for pi, qi in pq)


def gradient_factor(name: str, u: float, alpha: float = 0.5) -> float:
    """d f(u) / d log u: the docs/methods.md table's factor (tv, hellinger, chi2 derived by hand)."""
    return {
        "forward_kl": lambda: u - 1,
        "reverse_kl": lambda: u * math.log(u),
        "js": lambda: 0.5 * u * math.log(2 * u / (u + 1)),
        "alpha": lambda: (u - u ** (1 - alpha)) / alpha,
        "tv": lambda: 0.5 * u * math.copysign(1.0, u - 1) if u != 1 else 0.0,
        "hellinger": lambda: (math.sqrt(u) - 1) * math.sqrt(u),
        "chi2": lambda: 2 * (u - 1) * u,
    }[name]()


def random_categoricals(seed: int, V: int, scale: float):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * scale, 0)
    q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * scale, 0)
    return p, q


def test_registry_holds_exactly_the_methods_table():
    assert sorted(DIVERGENCES) == sorted(NAMES)
    with pytest.raises(ValueError, match="'js' is already registered"):
        register_divergence("js")(lambda x: x)


# ----------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_generator_is_the_table_formula(name, options):
    x = torch.linspace(-8, 8, 33, dtype=torch.float64)
    got = DIVERGENCES[name](x, **options)
    want = [f_of_u(name, math.exp(v), **options) for v in x.tolist()]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("V,scale", [(2, 1.0), (6, 0.5), (40, 2.0)])
def test_expectation_under_ref_equals_closed_form_divergence(name, options, seed, V, scale):
    """Σ_y π_ref(y) f(π_θ(y)/π_ref(y)) over the whole support is the named divergence."""
    p, q = random_categoricals(seed, V, scale)
    estimate = (q * DIVERGENCES[name](p.log() - q.log(), **options)).sum().item()
    assert estimate == pytest.approx(closed_form(name, p.tolist(), q.tolist(), **options), rel=1e-9)


def test_alpha_limits_are_the_two_kls():
    p, q = random_categoricals(7, 10, 1.0)
    x = p.log() - q.log()
    near_1 = (q * DIVERGENCES["alpha"](x, alpha=1 - 1e-6)).sum()
    near_0 = (q * DIVERGENCES["alpha"](x, alpha=1e-6)).sum()
    assert near_1.item() == pytest.approx((q * DIVERGENCES["forward_kl"](x)).sum().item(), rel=1e-4)
    assert near_0.item() == pytest.approx((q * DIVERGENCES["reverse_kl"](x)).sum().item(), rel=1e-4)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_f_of_one_is_zero_nonnegative_and_convex(name, options):
    fn = DIVERGENCES[name]
    assert fn(torch.zeros(3, dtype=torch.float64), **options).abs().max().item() < 1e-15
    g = torch.Generator().manual_seed(0)
    u1 = torch.rand(500, generator=g, dtype=torch.float64) * 20 + 1e-3
    u2 = torch.rand(500, generator=g, dtype=torch.float64) * 20 + 1e-3
    lam = torch.rand(500, generator=g, dtype=torch.float64)
    f = lambda u: fn(u.log(), **options)  # noqa: E731
    assert (f(u1) >= 0).all()
    chord = lam * f(u1) + (1 - lam) * f(u2)
    assert (f(lam * u1 + (1 - lam) * u2) <= chord + 1e-12).all()


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_autograd_gradient_is_the_table_factor_and_zero_at_one(name, options):
    x = torch.cat([torch.linspace(-6, 6, 25, dtype=torch.float64), torch.tensor([-0.3, 1e-3])])
    x.requires_grad_(True)
    (grad,) = torch.autograd.grad(DIVERGENCES[name](x, **options).sum(), x)
    want = [gradient_factor(name, math.exp(v), **options) for v in x.tolist()]
    torch.testing.assert_close(grad, torch.tensor(want, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    x0 = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    (g0,) = torch.autograd.grad(DIVERGENCES[name](x0, **options).sum(), x0)
    assert g0.item() == 0.0


@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl", "js", "alpha"])
def test_f_divergence_gradient_wrt_logprobs_is_factor_over_token_count(name):
    """The loss's gradient on log π_θ of each token is (table factor) / (number of tokens)."""
    g = torch.Generator().manual_seed(1)
    lp = (-torch.rand(3, 5, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    ref = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 3
    mask = torch.rand(3, 5, generator=g) < 0.7
    f_divergence(lp, ref, mask, name).backward()
    n = int(mask.sum())
    for b in range(3):
        for t in range(5):
            u = math.exp(lp[b, t].item() - ref[b, t].item())
            want = gradient_factor(name, u) / n if mask[b, t] else 0.0
            assert lp.grad[b, t].item() == pytest.approx(want, rel=1e-9, abs=1e-15)


# ----------------------------------------------------------------------------- f_divergence


def batch(seed: int, B: int, T: int):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    ref = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    mask = torch.rand(B, T, generator=g) < 0.6
    mask[0] = False  # a fully masked row
    return lp, ref, mask


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("B,T", [(1, 4), (4, 6), (7, 3)])
@pytest.mark.parametrize("clamp", [20.0, 1.5])
def test_token_level_matches_loop(name, options, seed, B, T, clamp):
    lp, ref, mask = batch(seed, B, T)
    clamped = lambda x: max(-clamp, min(clamp, x))  # noqa: E731
    vals = [
        f_of_u(name, math.exp(clamped(lp[b, t].item() - ref[b, t].item())), **options)
        for b in range(B)
        for t in range(T)
        if mask[b, t]
    ]
    want = sum(vals) / len(vals) if vals else 0.0
    got = f_divergence(lp, ref, mask, name, clamp=clamp, **options)
    assert got.item() == pytest.approx(want, rel=1e-10, abs=1e-15)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("B,T", [(1, 4), (4, 6), (7, 3)])
@pytest.mark.parametrize("clamp", [20.0, 1.5])
def test_sequence_level_matches_loop(name, options, seed, B, T, clamp):
    lp, ref, mask = batch(seed, B, T)
    vals = []
    for b in range(B):
        if mask[b].any():
            s = sum(lp[b, t].item() - ref[b, t].item() for t in range(T) if mask[b, t])
            vals.append(f_of_u(name, math.exp(max(-clamp, min(clamp, s))), **options))
    want = sum(vals) / len(vals) if vals else 0.0
    got = f_divergence(lp, ref, mask, name, level="sequence", clamp=clamp, **options)
    assert got.item() == pytest.approx(want, rel=1e-10, abs=1e-15)


@pytest.mark.parametrize("name", NAMES)
def test_one_token_rows_make_both_levels_agree(name):
    lp, ref, mask = batch(3, 6, 1)
    tok = f_divergence(lp, ref, mask, name, agg="seq_mean_token_mean")
    seq = f_divergence(lp, ref, mask, name, level="sequence")
    torch.testing.assert_close(tok, seq)


def test_token_level_uses_the_aggregation_mode():
    lp, ref, mask = batch(0, 4, 6)
    per_token = DIVERGENCES["chi2"](lp - ref)
    rows = [per_token[b][mask[b]] for b in range(4) if mask[b].any()]
    want = sum(r.mean() for r in rows) / len(rows)
    got = f_divergence(lp, ref, mask, "chi2", agg="seq_mean_token_mean")
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("extreme", [50.0, -50.0])
def test_extreme_log_ratios_stay_finite_in_float32(name, options, level, extreme):
    lp = torch.tensor([[extreme, 0.0, extreme], [-1.0, extreme, 0.0]], requires_grad=True)
    ref = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss = f_divergence(lp, ref, mask, name, level=level, **options)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    at_clamp = f_divergence(lp.detach().clamp(-20, 20), ref, mask, name, level=level, **options)
    if level == "token":  # beyond the clamp the value is the clamp's value
        assert loss.item() == pytest.approx(at_clamp.item(), rel=1e-6)
    x = torch.tensor([-20.0, 20.0], requires_grad=True)
    DIVERGENCES[name](x, **options).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_garbage_in_masked_positions_is_ignored():
    lp, ref, mask = batch(2, 4, 5)
    clean = f_divergence(lp, ref, mask, "reverse_kl", level="sequence", clamp=100.0)
    dirty = torch.where(mask, lp, torch.tensor(float("nan"), dtype=lp.dtype)).requires_grad_(True)
    loss = f_divergence(dirty, ref, mask, "reverse_kl", level="sequence", clamp=100.0)
    loss.backward()
    torch.testing.assert_close(loss, clean)
    assert (dirty.grad[~mask] == 0).all() and torch.isfinite(dirty.grad).all()


def test_fully_masked_batch_is_zero():
    z = torch.zeros(2, 3)
    for level in ("token", "sequence"):
        assert f_divergence(torch.randn(2, 3), z, z, "js", level=level).item() == 0.0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"name": "kl"}, r"unknown f-divergence 'kl'; valid names: \['alpha', 'chi2', 'forward"),
        ({"name": "js", "alpha": 0.3}, r"unknown option\(s\) \['alpha'\] of f-divergence 'js'; accepted: \[\]"),
        (
            {"name": "alpha", "beta": 1},
            r"unknown option\(s\) \['beta'\] of f-divergence 'alpha'; accepted: \['alpha'\]",
        ),
        ({"name": "alpha", "alpha": 1.0}, r"alpha in \(0, 1\), got 1.0"),
        ({"name": "alpha", "alpha": 0.0}, "got 0.0"),
        ({"level": "row"}, "level must be 'token' or 'sequence', got 'row'"),
        ({"clamp": 0.0}, "clamp must be > 0"),
        ({"agg": "mean"}, "unknown loss aggregation 'mean'"),
    ],
)
def test_errors_are_specific(kwargs, match):
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=match):
        f_divergence(x, x, torch.ones(2, 3), **kwargs)


def test_shape_mismatch_is_reported():
    with pytest.raises(ValueError, match=r"one \(B, T\) shape; got \(2, 3\), \(2, 4\), \(2, 3\)"):
        f_divergence(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


# ----------------------------------------------------------------------------- the release's value cap (issue 11)


def released_forward_kl(logprob, ref_logprob):
    """The DPH-RL release: verl's low_var_kl with swapped arguments, i.e. u − log u − 1 capped at 10."""
    x = (logprob - ref_logprob).clamp(min=-20, max=20)
    return torch.clamp(torch.exp(x) - x - 1, min=-10, max=10)


@pytest.mark.parametrize("seed", range(3))
def test_value_cap_reproduces_the_released_forward_kl(seed):
    gen = torch.Generator().manual_seed(seed)
    lp = (torch.randn(3, 6, generator=gen) * 5).requires_grad_()
    ref = torch.randn(3, 6, generator=gen) * 5
    mask = (torch.rand(3, 6, generator=gen) > 0.2).long()
    ours = f_divergence(lp, ref, mask, "forward_kl", value_cap=10.0)
    values = released_forward_kl(lp, ref)
    theirs = (values * mask).sum() / mask.sum()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    (g_ours,) = torch.autograd.grad(ours, lp)
    (g_theirs,) = torch.autograd.grad(theirs, lp)
    assert torch.allclose(g_ours, g_theirs, atol=1e-6)
    assert f_divergence(lp, ref, mask, "forward_kl").item() > ours.item()  # uncapped (default) is larger here


def test_divergence_units_are_tokens_or_nonempty_rows():
    from lit_rlvr.functional.divergences import divergence_units

    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert divergence_units(mask, "token").sum().item() == 3
    assert divergence_units(mask, "sequence").sum().item() == 2


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_weighted_anchor_micro_batches_sum_to_the_full_divergence(level):
    from lit_rlvr.functional.batching import aggregation_weight
    from lit_rlvr.functional.divergences import divergence_units

    gen = torch.Generator().manual_seed(1)
    lp, ref = torch.randn(7, 5, generator=gen), torch.randn(7, 5, generator=gen)
    mask = (torch.rand(7, 5, generator=gen) > 0.5).long()
    mask[3] = 0
    full = f_divergence(lp, ref, mask, "js", level=level)
    total = 0.0
    for i in range(0, 7, 3):
        sl = slice(i, i + 3)
        w = aggregation_weight(divergence_units(mask[sl], level), divergence_units(mask, level), "token_mean")
        total += w * f_divergence(lp[sl], ref[sl], mask[sl], "js", level=level)
    assert float(total) == pytest.approx(float(full), abs=1e-6)
