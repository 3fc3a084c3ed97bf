"""Policy loss, aggregation and KL estimators against naive per-token loops and exact KL."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlvr.functional.losses import AGGREGATIONS, aggregate, kl_estimate, policy_loss

MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
CLIP_LOW, CLIP_HIGH, DUAL = 0.2, 0.28, 2.0


# ----------------------------------------------------------------------------- references


def naive_aggregate(rows: list[list], mode: str, B: int, T: int, max_len: int | None):
    """``rows[b]`` = the unmasked per-token values of row b, reduced by plain Python sums."""
    tokens = [v for row in rows for v in row]
    if mode == "token_mean":
        return sum(tokens) / len(tokens) if tokens else 0.0
    if mode == "seq_mean_token_mean":
        means = [sum(row) / len(row) for row in rows if row]
        return sum(means) / len(means) if means else 0.0
    assert mode == "seq_mean_token_sum_norm"
    return sum(tokens) / (B * (T if max_len is None else max_len))


def clip_case(ratio: float, a: float, dual_clip: float | None) -> str:
    """Which branch of the clipped surrogate a token is in, decided by explicit comparisons."""
    if a > 0 and ratio > 1 + CLIP_HIGH:
        return "high"
    if a < 0 and dual_clip is not None and ratio > dual_clip:
        return "dual"
    if a < 0 and ratio < 1 - CLIP_LOW:
        return "low"
    return "inside"


def naive_token_loss(lp, old, a: float, dual_clip: float | None):
    """Loss of one token (a scalar tensor, differentiable in ``lp``), case by case."""
    ratio = torch.exp(lp - old)
    case = clip_case(ratio.item(), a, dual_clip)
    if case == "high":  # gradient is cut: constant (1 + ε_high)·A
        return torch.tensor(-(1 + CLIP_HIGH) * a, dtype=lp.dtype)
    if case == "low":
        return torch.tensor(-(1 - CLIP_LOW) * a, dtype=lp.dtype)
    if case == "dual":
        return torch.tensor(-dual_clip * a, dtype=lp.dtype)
    return -ratio * a


def naive_policy_loss(lp, old, adv, mask, dual_clip, mode, max_len):
    B, T = lp.shape
    rows = []
    for b in range(B):
        row = []
        for t in range(T):
            if mask[b, t]:
                a = float(adv[b] if adv.dim() == 1 else adv[b, t])
                row.append(naive_token_loss(lp[b, t], old[b, t], a, dual_clip))
        rows.append(row)
    loss = naive_aggregate(rows, mode, B, T, max_len)
    return loss if torch.is_tensor(loss) else torch.tensor(loss, dtype=lp.dtype)


def make_batch(seed: int, B: int, T: int, per_token_adv: bool):
    """Random log-probs/advantages where rows 0-2 are designed: row 0 (A > 0) has a token inside
    the clip range, one above 1 + ε_high and one below 1 − ε_low; row 1 (A < 0) has one inside,
    one below 1 − ε_low and one in the dual-clip region; row 2 is fully masked."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    log_ratio = (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 2.4  # ρ ∈ [0.3, 3.3]
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.7
    designed = torch.log(torch.tensor([[1.1, 1.5, 0.5], [1.1, 0.5, 3.0]], dtype=torch.float64))
    log_ratio[:2, :3] = designed
    adv[0], adv[1] = adv[0].abs() + 0.1, -adv[1].abs() - 0.1
    mask[:2, :3] = True
    mask[2] = False
    if not per_token_adv:
        adv = adv[:, 0].clone()
    lp = (old + log_ratio).requires_grad_(True)
    return lp, old, adv, mask


SHAPES = [(3, 3), (4, 7), (8, 16)]


# ----------------------------------------------------------------------------- policy loss


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dual_clip", [None, DUAL])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_policy_loss_and_gradient_match_naive_loop(seed, B, T, mode, dual_clip, per_token_adv):
    lp, old, adv, mask = make_batch(seed, B, T, per_token_adv)
    max_len = T + 5 if mode == "seq_mean_token_sum_norm" else None
    loss, _ = policy_loss(
        lp,
        old,
        adv,
        mask,
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        dual_clip=dual_clip,
        agg=mode,
        max_len=max_len,
    )
    (grad,) = torch.autograd.grad(loss, lp)
    lp_ref = lp.detach().clone().requires_grad_(True)
    ref = naive_policy_loss(lp_ref, old, adv, mask, dual_clip, mode, max_len)
    (grad_ref,) = torch.autograd.grad(ref, lp_ref, allow_unused=True, materialize_grads=True)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dual_clip", [None, DUAL])
def test_designed_rows_cover_every_clip_case(dual_clip):
    """Guards the comparison above: every branch is exercised, and each gives its formula."""
    lp, old, adv, mask = make_batch(0, 3, 3, per_token_adv=False)
    ratios = torch.exp(lp - old).detach()
    cases = [[clip_case(ratios[b, t].item(), adv[b].item(), dual_clip) for t in range(3)] for b in (0, 1)]
    # Row 0 (A > 0): ρ = 0.5 < 1 − ε_low is NOT clipped, min picks ρA. Row 1 (A < 0): ρ = 3 is
    # unclipped without the dual clip.
    last = "dual" if dual_clip else "inside"
    assert cases == [["inside", "high", "inside"], ["inside", "low", last]]
    a0, a1 = adv[0].item(), adv[1].item()  # per-token losses from docs/methods.md §1 by hand
    want = [
        [-1.1 * a0, -1.28 * a0, -0.5 * a0],
        [-1.1 * a1, -0.8 * a1, (-2.0 if dual_clip else -3.0) * a1],
    ]
    for b in (0, 1):
        for t in range(3):
            single = torch.zeros(1, 3, dtype=torch.bool)
            single[0, t] = True
            rows = slice(b, b + 1)
            loss, _ = policy_loss(lp[rows], old[rows], adv[rows], single, dual_clip=dual_clip)
            assert loss.item() == pytest.approx(want[b][t], rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dual_clip", [None, DUAL])
def test_policy_loss_stats_match_counts(seed, dual_clip):
    lp, old, adv, mask = make_batch(seed, 8, 16, per_token_adv=True)
    _, stats = policy_loss(lp, old, adv, mask, dual_clip=dual_clip)
    counts = {"low": 0, "high": 0, "dual": 0, "inside": 0}
    ratio_sum = kl_sum = 0.0
    n = int(mask.sum())
    for b, t in mask.nonzero().tolist():
        r = math.exp(lp[b, t].item() - old[b, t].item())
        counts[clip_case(r, adv[b, t].item(), dual_clip)] += 1
        ratio_sum += r
        kl_sum += r - 1 - math.log(r)  # k3 estimate of KL(π_old‖π_θ) on π_old's samples
    assert stats["clipfrac_low"].item() == pytest.approx(counts["low"] / n)
    assert stats["clipfrac_high"].item() == pytest.approx(counts["high"] / n)
    assert stats["clipfrac_dual"].item() == pytest.approx(counts["dual"] / n)
    assert stats["ratio_mean"].item() == pytest.approx(ratio_sum / n, rel=1e-12)
    assert stats["approx_kl"].item() == pytest.approx(kl_sum / n, rel=1e-9)
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())
    assert counts["low"] > 0 and counts["high"] > 0 and (dual_clip is None or counts["dual"] > 0)


def test_per_row_advantages_equal_broadcast_per_token():
    lp, old, adv, mask = make_batch(3, 5, 6, per_token_adv=False)
    a, _ = policy_loss(lp, old, adv, mask, dual_clip=3.0, agg="seq_mean_token_mean")
    b, _ = policy_loss(lp, old, adv[:, None].expand(5, 6), mask, dual_clip=3.0, agg="seq_mean_token_mean")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("garbage", [float("-inf"), 1e4, float("nan")])
def test_garbage_in_masked_positions_is_ignored(mode, garbage):
    """Padding may hold anything (−inf, huge, NaN): loss, grads and stats stay clean."""
    lp, old, adv, mask = make_batch(4, 4, 5, per_token_adv=False)
    clean, _ = policy_loss(lp, old, adv, mask, agg=mode)
    dirty_lp = torch.where(mask, lp.detach(), torch.tensor(garbage, dtype=lp.dtype))
    dirty_lp.requires_grad_(True)
    dirty_old = torch.where(mask, old, torch.tensor(-1e4, dtype=old.dtype))
    loss, stats = policy_loss(dirty_lp, dirty_old, adv, mask, agg=mode)
    loss.backward()
    torch.testing.assert_close(loss, clean.detach())
    assert torch.isfinite(dirty_lp.grad).all() and (dirty_lp.grad[~mask] == 0).all()
    assert all(torch.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("mode", MODES)
def test_fully_masked_batch_gives_zero_loss_and_stats(mode):
    lp = torch.randn(3, 4, requires_grad=True)
    loss, stats = policy_loss(lp, torch.randn(3, 4), torch.randn(3), torch.zeros(3, 4), agg=mode)
    loss.backward()
    assert loss.item() == 0.0 and (lp.grad == 0).all()
    assert all(v.item() == 0.0 for k, v in stats.items() if k != "ratio_mean")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"dual_clip": 1.0}, "dual_clip must be > 1"),
        ({"dual_clip": 0.5}, "got 0.5"),
        ({"clip_low": 1.01}, r"clip_low .* \[0, 1\], got 1.01"),
        ({"clip_low": -0.1}, "clip_low"),
        ({"clip_high": -0.1}, "clip_high"),
        ({"agg": "sum"}, r"unknown loss aggregation 'sum'; valid names: \['seq_mean_token_mean'"),
    ],
)
def test_policy_loss_rejects_bad_settings(kwargs, match):
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=match):
        policy_loss(x, x, torch.zeros(2), torch.ones(2, 3), **kwargs)


def test_policy_loss_rejects_bad_shapes():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"advantages must be .* got \(3,\)"):
        policy_loss(x, x, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(x, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))


# ----------------------------------------------------------------------------- aggregate


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("B,T", [(1, 1), (1, 6), (5, 1), (6, 9)])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("max_len", [None, 12])
def test_aggregate_matches_loops(seed, B, T, mode, max_len):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.6
    if seed == 1:
        mask[0] = False  # a fully masked row
    if seed == 2:
        mask[:] = False  # a fully masked batch
    rows = [[values[b, t].item() for t in range(T) if mask[b, t]] for b in range(B)]
    want = naive_aggregate(rows, mode, B, T, max_len)
    got = aggregate(values, mask.long(), mode, max_len)  # 0/1 masks work like bool ones
    assert got.dim() == 0 and not torch.isnan(got)
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_aggregate_registry_and_errors():
    assert sorted(AGGREGATIONS) == sorted(MODES)
    with pytest.raises(ValueError, match="same"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 2))
    with pytest.raises(ValueError, match="max_len .* got 0"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), "seq_mean_token_sum_norm", max_len=0)


# ----------------------------------------------------------------------------- KL estimators


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_estimators_closed_forms(kind):
    lp = torch.linspace(-6, 0, 13, dtype=torch.float64).reshape(1, 13)
    ref = torch.linspace(0, -6, 13, dtype=torch.float64).reshape(1, 13)
    got = kl_estimate(lp, ref, kind)
    for t in range(13):
        x = ref[0, t].item() - lp[0, t].item()
        want = {"k1": -x, "k2": x * x / 2, "k3": math.exp(x) - x - 1}[kind]
        assert got[0, t].item() == pytest.approx(want, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("V", [2, 7, 50])
@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_unbiased_estimators_have_exact_kl_expectation(seed, V, kind):
    """Σ_y π_θ(y) k(y) over the whole support equals KL(π_θ‖π_ref) exactly (k1 and k3)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, 0)  # π_θ
    q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, 0)  # π_ref
    exact = sum(pi * math.log(pi / qi) for pi, qi in zip(p.tolist(), q.tolist()))
    k = kl_estimate(p.log()[None], q.log()[None], kind)[0]
    assert (p * k).sum().item() == pytest.approx(exact, rel=1e-10)


def test_k2_is_biased_so_the_expectation_test_can_fail():
    p = torch.tensor([0.9, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.8], dtype=torch.float64)
    exact = (p * (p / q).log()).sum()
    k2 = kl_estimate(p.log()[None], q.log()[None], "k2")[0]
    assert abs((p * k2).sum() - exact) > 0.05  # 1.234 vs 1.146


def test_k3_clamps_outliers_and_errors():
    lp = torch.tensor([[0.0, 0.0]])
    out = kl_estimate(lp, torch.tensor([[50.0, 20.0]]), "k3")
    assert torch.isfinite(out).all() and out[0, 0] == out[0, 1]
    assert kl_estimate(lp, torch.tensor([[-50.0, -20.0]]), "k3").isfinite().all()
    valid = r"unknown KL estimator 'k4'; valid names: \['k1', 'k2', 'k3'\]"
    with pytest.raises(ValueError, match=valid):
        kl_estimate(lp, lp, "k4")
    with pytest.raises(ValueError, match="one shape"):
        kl_estimate(lp, torch.zeros(1, 3))


# ----------------------------------------------------------------------------- numerics (issue 11)


def test_minus_inf_old_logprob_gives_zero_gradient_not_nan():
    """The issue's case: verl clamps the log-ratio to ±20 and gets grad [[0.0, -0.61]]."""
    lp = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    old = torch.tensor([[-math.inf, -1.2]])
    loss, stats = policy_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 2), dual_clip=3.0)
    loss.backward()
    assert torch.isfinite(loss)
    assert lp.grad[0, 0].item() == 0.0
    assert lp.grad[0, 1].item() == pytest.approx(-math.exp(0.2) / 2, abs=1e-6)  # -0.6107
    assert all(torch.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("bad", [-math.inf, math.nan, -1e30])
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_nonfinite_or_huge_old_logprobs_never_make_a_nan_gradient(bad, adv):
    lp = torch.tensor([[-0.5, -1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[bad, -1.2, -2.0]])
    loss, _ = policy_loss(lp, old, torch.tensor([adv]), torch.ones(1, 3))
    loss.backward()
    assert torch.isfinite(lp.grad).all() and lp.grad[0, 0].item() == 0.0


def test_nonfinite_count_counts_real_tokens_only():
    from lit_rlvr.functional.losses import nonfinite_count

    values = torch.tensor([[-math.inf, math.nan, 0.0], [math.inf, -1.0, -math.inf]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    assert nonfinite_count(values, mask).item() == 3


def verl_low_var_kl(logprob, ref_logprob):
    """verl core_algos.kl_penalty(..., "low_var_kl"): clamp ±20, k3, value clamp ±10."""
    kl = (ref_logprob - logprob).clamp(min=-20, max=20)
    kld = torch.exp(kl) - kl - 1
    return torch.clamp(kld, min=-10, max=10)


@pytest.mark.parametrize("seed", range(3))
def test_k3_with_value_cap_10_equals_verl_low_var_kl(seed):
    gen = torch.Generator().manual_seed(seed)
    lp = (torch.randn(4, 7, generator=gen) * 6).requires_grad_()
    ref = torch.randn(4, 7, generator=gen) * 6
    ours = kl_estimate(lp, ref, "k3", value_cap=10.0)
    theirs = verl_low_var_kl(lp, ref)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    (g_ours,) = torch.autograd.grad(ours.sum(), lp)
    (g_theirs,) = torch.autograd.grad(theirs.sum(), lp)
    assert torch.allclose(g_ours, g_theirs, atol=1e-5)
    assert (ours.detach() > 10).sum() == 0 and (kl_estimate(lp, ref, "k3").detach() > 10).any()  # the cap binds here


def test_value_cap_must_be_positive():
    with pytest.raises(ValueError, match="a value cap must be > 0 or None"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k3", value_cap=0.0)


def test_a_registered_aggregation_carries_its_accumulation_weight():
    from lit_rlvr.functional.batching import aggregation_weight
    from lit_rlvr.functional.losses import register_aggregation

    @register_aggregation("test_row_max_mean", normaliser=lambda mask: (mask.sum(-1) > 0).sum())
    def row_max_mean(values, mask, max_len=None):
        rows = torch.where(mask.bool(), values, torch.full_like(values, -1e9)).amax(-1)
        keep = mask.bool().any(-1)
        return torch.where(keep, rows, 0.0).sum() / keep.sum().clamp(min=1)

    try:
        gen = torch.Generator().manual_seed(0)
        values, mask = torch.randn(6, 4, generator=gen), (torch.rand(6, 4, generator=gen) > 0.3).long()
        full = aggregate(values, mask, "test_row_max_mean")
        parts = sum(
            aggregation_weight(mask[i : i + 2], mask, "test_row_max_mean")
            * aggregate(values[i : i + 2], mask[i : i + 2], "test_row_max_mean")
            for i in range(0, 6, 2)
        )
        assert float(parts) == pytest.approx(float(full), abs=1e-6)
    finally:
        AGGREGATIONS.pop("test_row_max_mean")


def test_an_aggregation_without_a_normaliser_is_refused():
    AGGREGATIONS.register("test_bare")(lambda values, mask, max_len=None: values.sum())
    try:
        with pytest.raises(ValueError, match="registered without a micro-batch normaliser"):
            aggregate(torch.ones(1, 1), torch.ones(1, 1), "test_bare")
    finally:
        AGGREGATIONS.pop("test_bare")


def test_the_functional_layer_names_the_mask_it_receives_loss_tokens():
    """Every entry point that reads ``StepData.loss_tokens`` calls it that: not ``response_mask``, which
    is the padding mask (only the packing helpers of ``batching`` take that one); a keyword call gives
    bit for bit the positional call's loss."""
    import importlib
    import inspect
    import pkgutil

    import lit_rlvr.functional

    takes = {}
    for info in pkgutil.iter_modules(lit_rlvr.functional.__path__):
        module = importlib.import_module(f"lit_rlvr.functional.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__:
                params = set(inspect.signature(fn).parameters)
                takes.update({f"{info.name}.{name}": p for p in params & {"response_mask", "loss_tokens"}})
    assert {k for k, v in takes.items() if v == "response_mask"} == {"batching.segment_lengths"}
    assert {
        "losses.policy_loss",
        "correction.correction_weights",
        "covariance.clip_cov_select",
        "covariance.kl_cov_select",
        "divergences.f_divergence",
        "entropy.top_entropy",
        "entropy.entropy_bonus",
        "metrics.masked_entropy_sum",
    } <= {k for k, v in takes.items() if v == "loss_tokens"}
    gen = torch.Generator().manual_seed(0)
    lp, old = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    adv, mask = (
        torch.randn(3, generator=gen)[:, None].expand(3, 5),
        torch.tensor([[1] * 5, [1, 1, 0, 1, 0], [1, 0, 0, 0, 0]]),
    )
    positional, _ = policy_loss(lp, old, adv, mask, max_len=5)
    keyword, _ = policy_loss(logprobs=lp, old_logprobs=old, advantages=adv, loss_tokens=mask, max_len=5)
    assert torch.equal(positional, keyword)
