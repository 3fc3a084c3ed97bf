"""Advantage estimators against brute-force references (docs/methods.md §1 and §3).

References work one group at a time on plain Python lists (exact ``Fraction`` where the formula is
rational, ``itertools`` enumeration of subsets, partitions and draws); the estimators under test
see batches whose group ids are arbitrary ints, whose rows are interleaved and whose groups differ
in size.
"""

from __future__ import annotations

import inspect
import math
import random
import statistics
from fractions import Fraction
from itertools import combinations, permutations, product
from math import comb

import pytest
import torch

from lit_rlvr.functional import pass_at_k
from lit_rlvr.functional.advantages import ADVANTAGES, _passk_pos_neg

SEEDS = [0, 1, 2]
LAYOUTS = {"equal": [4, 4, 4], "unequal": [1, 2, 3, 5, 8], "one_group": [7]}
K_ENTRIES = ["passk", "passk_full", "passk_bootstrap", "passk_combined", "passk_entropy_adaptive", "pkpo"]
BINARY_ENTRIES = [
    *["passk", "passk_combined", "passk_entropy_adaptive", "pkpo", "max_rl", "psr", "nsr", "w_reinforce", "ucpo"]
]
POLARITY_ENTRIES = ["psr", "nsr", "w_reinforce"]  # REINFORCE with reward ±1: no group baseline


# ----------------------------------------------------------------------------- batch helpers


def random_groups(sizes: list[int], seed: int, binary: bool = True) -> list[list[float]]:
    """One reward list per group; binary groups get a random success rate each."""
    rng = random.Random(seed)
    groups = []
    for n in sizes:
        p = rng.random()
        if binary:
            groups.append([float(rng.random() < p) for _ in range(n)])
        else:
            groups.append([rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) for _ in range(n)])
    return groups


def make_batch(groups: list[list[float]], seed: int, shuffle: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``groups`` under arbitrary distinct ids (negative, large, unsorted), rows interleaved."""
    rng = random.Random(seed + 1000)
    ids = rng.sample(range(-50, 1000), len(groups))
    rows = [(gid, r) for gid, rs in zip(ids, groups) for r in rs]
    if shuffle:
        rng.shuffle(rows)
    return torch.tensor([r for _, r in rows]), torch.tensor([g for g, _ in rows])


def per_group(ref, rewards: torch.Tensor, group_ids: torch.Tensor, **options) -> torch.Tensor:
    """Apply ``ref(list of one group's rewards in row order, **options) -> advantages`` group by group."""
    out = [0.0] * len(rewards)
    ids = group_ids.tolist()
    for gid in set(ids):
        idx = [i for i, g in enumerate(ids) if g == gid]
        for i, a in zip(idx, ref([rewards[i].item() for i in idx], **options)):
            out[i] = float(a)
    return torch.tensor(out, dtype=torch.float64)


def assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float = 2e-6, atol: float = 2e-6) -> None:
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- references


def zscore(values: list) -> list[float]:
    """Population z-scores; all-equal -> 0 (the convention of every Pass@k-family estimator)."""
    if len(set(values)) == 1:
        return [0.0] * len(values)
    mu = sum(values) / len(values)
    sd = math.sqrt(sum((v - mu) ** 2 for v in values) / len(values))
    return [float(v - mu) / sd for v in values]


def grpo_ref(rs, std="population", eps=1e-6):
    mu = statistics.fmean(rs)
    if len(set(rs)) == 1:
        return [0.0] * len(rs)
    if std == "none":
        return [r - mu for r in rs]
    sd = statistics.pstdev(rs) if std == "population" else statistics.stdev(rs)
    return [(r - mu) / (sd + eps) for r in rs]


def rloo_ref(rs):
    n = len(rs)
    return [0.0] * n if n == 1 else [r - (sum(rs) - r) / (n - 1) for r in rs]


def passk_subsets_ref(rs, k):
    """Average, over the k-subsets containing each row, of the subset's normalised reward
    (R_S − mean)/std, mean and population std taken over ALL C(N, k) subsets, R_S = max."""
    rs = [Fraction(r) for r in rs]
    subsets = list(combinations(range(len(rs)), k))
    reward = {s: max(rs[j] for j in s) for s in subsets}
    mu = sum(reward.values()) / len(subsets)
    var = sum((x - mu) ** 2 for x in reward.values()) / len(subsets)
    if var == 0:
        return [0.0] * len(rs)
    out = []
    for i in range(len(rs)):
        mine = [reward[s] - mu for s in subsets if i in s]
        out.append(float(sum(mine) / len(mine)) / math.sqrt(var))
    return out


def passk_formula_ref(n, n_pos, k):
    """(A_pos, A_neg) exactly as docs/methods.md §3 writes them, binomials as exact integers."""
    n_neg = n - n_pos
    rho = 1 - Fraction(comb(n_neg, k), comb(n, k))
    if rho in (0, 1):
        return 0.0, 0.0
    sigma = math.sqrt(rho * (1 - rho))
    a_neg = float(1 - rho - Fraction(comb(n_neg - 1, k - 1), comb(n - 1, k - 1))) / sigma
    return float(1 - rho) / sigma, a_neg


def passk_ref(rs, k):
    a_pos, a_neg = passk_formula_ref(len(rs), int(sum(rs)), k)
    return [a_pos if r else a_neg for r in rs]


def passk_full_ref(rs, k):
    m = len(rs) // k
    chunks = [rs[j * k : (j + 1) * k] for j in range(m)]
    adv = zscore([max(c) for c in chunks])
    return [adv[i // k] if i < m * k else 0.0 for i in range(len(rs))]


def set_partitions(items: list[int], k: int):
    """Every partition of ``items`` into unordered blocks of size k."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for mates in combinations(rest, k - 1):
        left = [x for x in rest if x not in mates]
        for blocks in set_partitions(left, k):
            yield [(first, *mates), *blocks]


def passk_full_expectation(rs, k):
    """E over a uniformly random row order of passk_full's advantage of each row: the leftover set
    is a uniform (N mod k)-subset and the chunks a uniform partition of the rest into k-blocks."""
    n = len(rs)
    total, count = [0.0] * n, 0
    for left in combinations(range(n), n % k):
        for blocks in set_partitions([i for i in range(n) if i not in left], k):
            for block, a in zip(blocks, zscore([max(rs[i] for i in b) for b in blocks])):
                for i in block:
                    total[i] += a
            count += 1
    return [t / count for t in total]


def bootstrap_expectation(rs, k, m):
    """E of passk_bootstrap's advantage of each row, over all C(N, k)^m equally likely draws."""
    n = len(rs)
    subsets = list(combinations(range(n), k))
    total = [0.0] * n
    for draw in product(subsets, repeat=m):
        for s, a in zip(draw, zscore([max(rs[i] for i in s) for s in draw])):
            for i in s:
                total[i] += a
    return [t / len(subsets) ** m for t in total]


def pkpo_ref(rs, k, baseline):
    """PKPO (arXiv 2505.15201) by enumeration of subsets: Eq. 27 (s), 29 (loo), 33 (loo−1)."""
    rs = [Fraction(int(r)) for r in rs]
    n = len(rs)

    def big_s(i, members):  # S(i, k, members) of Eq. 28
        sets = [s for s in combinations(members, k) if i in s]
        return Fraction(sum(max(rs[j] for j in s) for s in sets), comb(len(members), k))

    everyone = list(range(n))
    if baseline == "none":
        return [float(big_s(i, everyone)) for i in everyone]
    if baseline == "loo":
        out = []
        for i in everyone:
            rest = [j for j in everyone if j != i]
            out.append(float(big_s(i, everyone) - sum(big_s(j, rest) for j in rest) / (n - 1)))
        return out
    if k == 1:  # the paper's k_opt = 1 baseline (LOO centring, Eq. 26), on the 1/N scale of s_i
        return [0.0 if n == 1 else float((r - (sum(rs) - r) / (n - 1)) / n) for r in rs]
    out = []
    for i in everyone:
        gain = sum(max(rs[j] for j in s) - max(rs[j] for j in s if j != i) for s in combinations(everyone, k) if i in s)
        out.append(float(Fraction(gain, comb(n, k))))
    return out


def max_minus_second_ref(rs):
    if len(rs) == 1:
        return [0.0]
    return [max(rs) - max(rs[:i] + rs[i + 1 :]) for i in range(len(rs))]


def entropy_adaptive_ref(rewards, group_ids, entropies, k):
    ids = sorted(set(group_ids.tolist()))
    mean_h = {g: statistics.fmean(entropies[group_ids == g].tolist()) for g in ids}
    ranked = sorted(ids, key=lambda g: -mean_h[g])  # stable: smaller id first on ties
    high = set(ranked[: len(ids) // 2])
    pass1 = per_group(passk_ref, rewards, group_ids, k=1)
    passk_ = per_group(passk_ref, rewards, group_ids, k=k)
    return torch.where(torch.tensor([g in high for g in group_ids.tolist()]), pass1, passk_)


def entropies_for(group_ids: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(len(group_ids), generator=gen) * 3


def options_for(name: str, rewards: torch.Tensor, group_ids: torch.Tensor, k: int = 1) -> dict:
    """The options the caller would pass to each entry (only those it declares)."""
    opts = {"k": k} if name in K_ENTRIES else {}
    if name == "passk_bootstrap":
        opts["generator"] = torch.Generator().manual_seed(0)
    if name == "passk_entropy_adaptive":
        opts["entropies"] = entropies_for(group_ids, 0)
    if name in ("unlikeliness", "ucpo"):
        opts["mean_logprobs"] = -entropies_for(group_ids, 1)
    return opts


# ----------------------------------------------------------------------------- registry contract


def test_registry_holds_every_estimator_with_explicit_keyword_options():
    assert set(ADVANTAGES) == {
        "grpo",
        "rloo",
        "passk",
        "passk_full",
        "passk_bootstrap",
        "passk_combined",
        "passk_entropy_adaptive",
        "pkpo",
        "max_minus_second",
        "max_rl",
        "psr",
        "nsr",
        "w_reinforce",
        "unlikeliness",
        "ucpo",
    }
    for name, fn in ADVANTAGES.items():
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params[:2]] == ["rewards", "group_ids"], name
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[2:]), name
        assert fn.__doc__ and ">>>" in fn.__doc__, f"{name} has no doctest"
    with pytest.raises(KeyError, match="valid names: .*'grpo'"):
        ADVANTAGES["gpro"]


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
@pytest.mark.parametrize("seed", SEEDS)
def test_contract_and_row_order_equivariance(name, seed):
    """float32 (B,) finite output; interleaving groups differently (keeping each group's own row
    order) and renaming ids permutes the output the same way. Bootstrap is random: shape only."""
    rewards, group_ids = make_batch(random_groups(LAYOUTS["unequal"], seed), seed)
    fn = ADVANTAGES[name]
    out = fn(rewards, group_ids, **options_for(name, rewards, group_ids))
    assert out.dtype == torch.float32 and out.shape == rewards.shape and out.isfinite().all()
    if name == "passk_bootstrap":
        return
    rng = random.Random(seed)
    queues = {g: [i for i, h in enumerate(group_ids.tolist()) if h == g] for g in set(group_ids.tolist())}
    slots = group_ids.tolist()
    rng.shuffle(slots)
    perm = torch.tensor([queues[g].pop(0) for g in slots])  # new row j = old row perm[j]
    opts = options_for(name, rewards, group_ids)
    for injected in ("entropies", "mean_logprobs"):
        if injected in opts:
            opts[injected] = opts[injected][perm]
    moved = fn(rewards[perm], group_ids[perm] * 3 + 17, **opts)
    assert torch.equal(moved, out[perm])


# ----------------------------------------------------------------------------- grpo, rloo


@pytest.mark.parametrize("std", ["population", "sample", "none"])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("binary", [True, False])
def test_grpo_matches_naive_loop(std, eps, layout, seed, binary):
    rewards, group_ids = make_batch(random_groups(LAYOUTS[layout], seed, binary), seed)
    got = ADVANTAGES["grpo"](rewards, group_ids, std=std, eps=eps)
    assert_close(got, per_group(grpo_ref, rewards, group_ids, std=std, eps=eps), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_matches_naive_loop(layout, seed):
    rewards, group_ids = make_batch(random_groups(LAYOUTS[layout], seed, binary=False), seed)
    assert_close(ADVANTAGES["rloo"](rewards, group_ids), per_group(rloo_ref, rewards, group_ids))


def test_grpo_and_rloo_edge_cases():
    rewards, group_ids = torch.tensor([0.7, 1.0, 1.0, 1.0, 0.0, 1.0]), torch.tensor([5, 9, 9, 9, 2, 2])
    for std in ("population", "sample", "none"):
        got = ADVANTAGES["grpo"](rewards, group_ids, std=std, eps=0.0)  # ε = 0 must not give NaN
        assert torch.equal(got[:4], torch.zeros(4))  # group of one, all-equal group
    assert torch.equal(ADVANTAGES["rloo"](rewards, group_ids)[:4], torch.zeros(4))
    with pytest.raises(ValueError, match=r"std must be one of \('population', 'sample', 'none'\); got 'pop'"):
        ADVANTAGES["grpo"](rewards, group_ids, std="pop")


# ----------------------------------------------------------------------------- passk (analytical)


@pytest.mark.parametrize("layout", ["equal", "unequal", "one_group"])
@pytest.mark.parametrize("seed", SEEDS)
def test_passk_equals_average_normalised_advantage_of_subsets_containing_the_row(layout, seed):
    rewards, group_ids = make_batch(random_groups(LAYOUTS[layout], seed), seed)
    for k in range(1, min(LAYOUTS[layout]) + 1):
        got = ADVANTAGES["passk"](rewards, group_ids, k=k)
        assert_close(got, per_group(passk_subsets_ref, rewards, group_ids, k=k))


@pytest.mark.parametrize("n", [1, 2, 3, 6, 16, 33])
def test_passk_methods_formula_and_closed_forms_for_every_count_and_k(n):
    for n_pos in range(n + 1):
        rewards = torch.tensor([1.0] * n_pos + [0.0] * (n - n_pos))
        for k in range(1, n + 1):
            got = ADVANTAGES["passk"](rewards, torch.zeros(n, dtype=torch.long), k=k)
            a_pos, a_neg = passk_formula_ref(n, n_pos, k)
            assert_close(got, torch.tensor([a_pos] * n_pos + [a_neg] * (n - n_pos)))
            n_neg, rho = n - n_pos, 1 - Fraction(comb(n - n_pos, k), comb(n, k))
            if n_pos == 0 or n_neg < k:  # all subsets share one reward
                assert torch.equal(got, torch.zeros(n))
            else:
                closed = math.sqrt((1 - rho) / rho)
                assert got[0].item() == pytest.approx(closed, rel=1e-6)
                assert got[-1].item() == pytest.approx(-n_pos / n_neg * closed, rel=1e-6)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", SEEDS)
def test_passk_at_k1_is_grpo_with_population_std(layout, seed):
    rewards, group_ids = make_batch(random_groups(LAYOUTS[layout], seed), seed)
    got = ADVANTAGES["passk"](rewards, group_ids, k=1)
    assert torch.allclose(got, ADVANTAGES["grpo"](rewards, group_ids, std="population", eps=0.0), rtol=1e-6, atol=0)
    assert torch.allclose(got, ADVANTAGES["grpo"](rewards, group_ids), rtol=1e-5, atol=0)


@pytest.mark.parametrize("k", [1, 2, 16, 256, 1000])
def test_passk_exact_at_n_1024(k):
    n, counts = 1024, [1, 2, 3, 10, 100, 512, 1000, 1020, 1023]
    got_pos, got_neg = _passk_pos_neg(
        torch.full((len(counts),), float(n), dtype=torch.float64), torch.tensor(counts, dtype=torch.float64), k
    )
    for i, c in enumerate(counts):
        q = Fraction(comb(n - c, k), comb(n, k))  # 1 − ρ, exact
        want = math.sqrt(q / (1 - q)) if 0 < q < 1 else 0.0  # q/(1−q) rounded once, then sqrt
        assert got_pos[i].item() == pytest.approx(want, rel=1e-12, abs=0)
        assert got_neg[i].item() == pytest.approx(-c / (n - c) * want if c < n else 0.0, rel=1e-12, abs=0)
    # the public float32 path: one group per count, rows interleaved
    rewards = torch.cat([torch.tensor([1.0] * c + [0.0] * (n - c)) for c in counts])
    group_ids = torch.arange(len(counts)).repeat_interleave(n)
    perm = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(k))
    got = ADVANTAGES["passk"](rewards[perm], group_ids[perm], k=k)
    want = torch.where(rewards > 0, got_pos[group_ids], got_neg[group_ids])[perm]
    assert got.isfinite().all()
    torch.testing.assert_close(got, want.float(), rtol=1e-7, atol=0)


# ----------------------------------------------------------------------------- passk_full


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("binary", [True, False])
def test_passk_full_matches_naive_loop(layout, seed, binary):
    rewards, group_ids = make_batch(random_groups(LAYOUTS[layout], seed, binary), seed)
    for k in range(1, min(LAYOUTS[layout]) + 1):
        got = ADVANTAGES["passk_full"](rewards, group_ids, k=k)
        assert_close(got, per_group(passk_full_ref, rewards, group_ids, k=k))


@pytest.mark.parametrize(
    ("rs", "k"),
    [
        ([1, 0, 0, 0, 0, 0], 2),
        ([1, 1, 0, 0, 0, 0], 3),
        ([1, 0, 0, 1, 0, 0, 0], 3),
        ([0, 1, 0, 0, 1], 2),
        ([1, 0, 0, 0], 2),
    ],
)
def test_passk_full_expectation_over_row_orders(rs, k):
    """Average the estimator over every order of a group's rows (one group per permutation, all in
    one batch) and compare with the expectation from enumerating subsets and partitions."""
    n = len(rs)
    perms = list(permutations(range(n)))
    order = torch.tensor(perms).flatten()  # row j of permutation p is original row perms[p][j]
    rewards = torch.tensor(rs, dtype=torch.float32)[order]
    group_ids = torch.arange(len(perms)).repeat_interleave(n) * 7 - 300
    got = ADVANTAGES["passk_full"](rewards, group_ids, k=k).double()
    mean_by_row = torch.zeros(n, dtype=torch.float64).index_add_(0, order, got) / len(perms)
    assert torch.allclose(mean_by_row, torch.tensor(passk_full_expectation(rs, k), dtype=torch.float64), atol=1e-6)


# ----------------------------------------------------------------------------- passk_bootstrap


@pytest.mark.parametrize(
    ("rs", "k", "num_groups"), [([1, 0, 0, 0], 2, None), ([1, 1, 0, 0], 3, None), ([0, 1, 0, 1, 0], 2, 3)]
)
def test_passk_bootstrap_converges_to_its_exact_expectation(rs, k, num_groups):
    n, copies = len(rs), 20000
    want = torch.tensor(bootstrap_expectation(rs, k, num_groups or n), dtype=torch.float64)
    perm = torch.randperm(copies * n, generator=torch.Generator().manual_seed(1))
    rewards = torch.tensor(rs, dtype=torch.float32).repeat(copies)[perm]
    group_ids = torch.arange(copies).repeat_interleave(n)[perm]
    got = ADVANTAGES["passk_bootstrap"](
        rewards, group_ids, k=k, num_groups=num_groups, generator=torch.Generator().manual_seed(2)
    ).double()
    position = torch.arange(n).repeat(copies)[perm]
    for i in range(n):
        draws = got[position == i]
        stderr = draws.std().item() / math.sqrt(copies)
        assert abs(draws.mean().item() - want[i].item()) < 5 * stderr + 1e-9, (i, draws.mean(), want[i])


@pytest.mark.parametrize("seed", SEEDS)
def test_passk_bootstrap_is_seeded_and_sums_to_zero_per_group(seed):
    rewards, group_ids = make_batch(random_groups(LAYOUTS["unequal"], seed, binary=False), seed)
    run = lambda s, m=None: ADVANTAGES["passk_bootstrap"](  # noqa: E731
        rewards, group_ids, k=1, num_groups=m, generator=torch.Generator().manual_seed(s)
    )
    assert torch.equal(run(seed), run(seed))
    for out in (run(seed), run(seed, m=7)):
        sums = torch.zeros(2000).index_add_(0, group_ids + 50, out)
        assert sums.abs().max() < 1e-5
    assert not torch.equal(run(seed, m=50), run(seed + 1, m=50))
    assert torch.equal(run(seed, m=1), torch.zeros(len(rewards)))  # one subset: nothing to compare with
    out = ADVANTAGES["passk_bootstrap"](rewards, group_ids, k=1)  # global generator
    assert out.shape == rewards.shape and out.isfinite().all()


# ----------------------------------------------------------------------------- combined, entropy


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", SEEDS)
def test_passk_combined_is_eq18_mix(layout, seed):
    rewards, group_ids = make_batch(random_groups(LAYOUTS[layout], seed), seed)
    for k in range(1, min(LAYOUTS[layout]) + 1):
        mix = lambda rs, k: [  # noqa: E731
            sum(rs) / len(rs) * a + (1 - sum(rs) / len(rs)) * b
            for a, b in zip(passk_ref(rs, k), grpo_ref(rs, "population", 0.0))
        ]
        assert_close(ADVANTAGES["passk_combined"](rewards, group_ids, k=k), per_group(mix, rewards, group_ids, k=k))


@pytest.mark.parametrize("layout", ["equal", "unequal"])
@pytest.mark.parametrize("seed", SEEDS)
def test_passk_entropy_adaptive_routes_top_half_to_pass1(layout, seed):
    rewards, group_ids = make_batch(random_groups(LAYOUTS[layout], seed), seed)
    entropies = entropies_for(group_ids, seed)
    for k in (1, min(LAYOUTS[layout])):
        got = ADVANTAGES["passk_entropy_adaptive"](rewards, group_ids, k=k, entropies=entropies)
        assert_close(got, entropy_adaptive_ref(rewards, group_ids, entropies, k))


def test_passk_entropy_adaptive_tie_and_odd_rules():
    # three prompts, equal mean entropy: ⌊3/2⌋ = 1 goes to Pass@1, the smallest id
    one_group = [1.0, 0.0, 0.0, 0.0]
    rewards = torch.tensor(one_group * 3)
    group_ids = torch.tensor([40] * 4 + [-3] * 4 + [12] * 4)
    entropies = torch.tensor([0.5, 1.5, 1.0, 1.0] * 3)  # every group's mean is 1.0
    got = ADVANTAGES["passk_entropy_adaptive"](rewards, group_ids, k=2, entropies=entropies)
    pass1, pass2 = torch.tensor(grpo_ref(one_group, "population", 0.0)), torch.tensor(passk_ref(one_group, 2))
    assert_close(got, torch.cat([pass2, pass1, pass2]))
    single = ADVANTAGES["passk_entropy_adaptive"](rewards[:4], group_ids[:4], k=2, entropies=entropies[:4])
    assert_close(single, pass2)  # one prompt: Pass@k
    with pytest.raises(ValueError, match=r"entropies must have the shape of rewards \(12,\); got \(4,\)"):
        ADVANTAGES["passk_entropy_adaptive"](rewards, group_ids, k=2, entropies=entropies[:4])


# ----------------------------------------------------------------------------- pkpo


@pytest.mark.parametrize("baseline", ["none", "loo", "loo_minus_one"])
@pytest.mark.parametrize("layout", ["equal", "unequal"])
@pytest.mark.parametrize("seed", SEEDS)
def test_pkpo_matches_subset_enumeration_of_the_paper(baseline, layout, seed):
    sizes = [n for n in LAYOUTS[layout] if n >= 2] if baseline == "loo" else LAYOUTS[layout]
    rewards, group_ids = make_batch(random_groups(sizes, seed), seed)
    top = min(sizes) - (baseline == "loo")
    for k in range(1, top + 1):
        got = ADVANTAGES["pkpo"](rewards, group_ids, k=k, baseline=baseline)
        assert_close(got, per_group(pkpo_ref, rewards, group_ids, k=k, baseline=baseline))


@pytest.mark.parametrize("n", [1, 2, 5, 8, 33])
def test_pkpo_rewards_sum_to_k_times_unbiased_pass_at_k(n):
    """Eq. 8 rewards: mean_i r_i = (k/N)·ρ(N, c, k), i.e. the mean of (N/k)·r_i is pass@k."""
    for c in range(n + 1):
        rewards = torch.tensor([1.0] * c + [0.0] * (n - c))
        for k in range(1, n + 1):
            r = ADVANTAGES["pkpo"](rewards, torch.zeros(n, dtype=torch.long), k=k, baseline="none")
            assert (r.double().mean() * n / k).item() == pytest.approx(pass_at_k(n, c, k), abs=1e-6)
            assert r[:c].eq(r[0]).all() and (c == 0 or r[0].item() == pytest.approx(k / n))


@pytest.mark.parametrize(
    ("baseline", "n", "k"),
    [
        (b, n, k)
        for b in ("none", "loo", "loo_minus_one")
        for n, k in [(2, 1), (3, 2), (4, 1), (4, 2), (4, 3), (5, 4), (5, 5)]
        if b != "loo" or k <= n - 1
    ],
)
def test_pkpo_gradient_is_exactly_unbiased_for_pass_at_k(baseline, n, k):
    """For a Bernoulli(p) policy, E[Σ_i A_i ∂log π(x_i)/∂p] over all 2^N outcomes = d pass@k/dp
    (the 'loo' baseline needs k <= N − 1)."""
    p = 2 / 7
    outcomes = list(product([0.0, 1.0], repeat=n))
    rewards = torch.tensor(outcomes).flatten()
    group_ids = torch.arange(len(outcomes)).repeat_interleave(n)
    adv = ADVANTAGES["pkpo"](rewards, group_ids, k=k, baseline=baseline).double().view(-1, n)
    score = torch.where(torch.tensor(outcomes) > 0, 1 / p, -1 / (1 - p))  # ∂log π(x)/∂p
    prob = torch.tensor([p ** sum(o) * (1 - p) ** (n - sum(o)) for o in outcomes], dtype=torch.float64)
    expected_grad = (prob * (adv * score).sum(1)).sum().item()
    assert expected_grad == pytest.approx(k * (1 - p) ** (k - 1), rel=1e-5)


def test_pkpo_bad_options():
    rewards, group_ids = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([8, 8, 8])
    with pytest.raises(ValueError, match=r"baseline must be one of .*got 'loo1'"):
        ADVANTAGES["pkpo"](rewards, group_ids, k=2, baseline="loo1")
    with pytest.raises(ValueError, match=r"'loo' needs k <= group size - 1; group 8 has 3 rows and k=3"):
        ADVANTAGES["pkpo"](rewards, group_ids, k=3, baseline="loo")


# ----------------------------------------------------------------------------- max_minus_second


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", SEEDS)
def test_max_minus_second_matches_leave_one_out_max(layout, seed):
    rewards, group_ids = make_batch(random_groups(LAYOUTS[layout], seed, binary=False), seed)
    got = ADVANTAGES["max_minus_second"](rewards, group_ids)
    assert_close(got, per_group(max_minus_second_ref, rewards, group_ids))
    assert (got != 0).sum() <= len(set(group_ids.tolist()))  # at most the best row of each group


def test_max_minus_second_ties_and_singletons():
    got = ADVANTAGES["max_minus_second"](torch.tensor([0.5, 0.9, 0.9, 0.3, 0.8]), torch.tensor([1, 1, 1, 2, 3]))
    assert torch.equal(got, torch.zeros(5))


# ----------------------------------------------------------------------------- max_rl


# Tajwar et al. 2026 (MaxRL, arXiv 2602.02710), released code Zanette-Labs/MaxRL at
# 76e04d1e7863b397edbcb83d5bdc76104eedd020, verl/trainer/ppo/core_algos.py
# compute_p_normalization_outcome_advantage (the estimator `p_normalization` that math/smollm.sh
# trains with and the project page shows as MaxRL's one-line change to GRPO), transcribed: only its
# unused std statistics and commented-out lines are left out. (verl/trainer/ppo/maclaurin.py holds
# the truncated Maclaurin-series weights and vr_cond_weights, not this estimator.)
def released_p_normalization(token_level_rewards, response_mask, index, epsilon=1e-6):
    from collections import defaultdict

    scores = token_level_rewards.sum(dim=-1)
    id2score = defaultdict(list)
    id2mean = {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        N = len(id2score[index[0]])  # number of responses per prompt
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
            elif len(id2score[idx]) > 1:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
            else:
                raise ValueError(f"no score in prompt index: {idx}")
        for i in range(bsz):
            if id2mean[index[i]] == 0.0:
                scores[i] = 0.0
            else:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2mean[index[i]] + epsilon)
        scores = scores.unsqueeze(-1) * response_mask / N
    return scores, scores


# prime-rl (PrimeIntellect-ai/prime-rl at 559b44772e471d1538537b8805cc77f3824a5e64),
# src/prime_rl/orchestrator/algo/max_rl.py MaxRLAlgorithm.score_group, one group's rewards at a time:
def prime_rl_max_rl(rewards: list[float]) -> list[float]:
    rewards = torch.tensor(rewards, dtype=torch.float32)
    mean = rewards.mean()
    advantages = torch.zeros_like(rewards) if mean <= 0 else (rewards - mean) / mean
    return advantages.tolist()


def release_max_rl(rewards: torch.Tensor, group_ids: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The release's advantages of one-token rows, in float64 (so that what is compared is the formula,
    not float32 rounding), times its N (the size of the first row's group) to undo its extra 1/N."""
    index = group_ids.tolist()
    out, _ = released_p_normalization(
        rewards.double()[:, None], torch.ones(len(index), 1, dtype=torch.float64), index, epsilon
    )
    return out[:, 0] * index.count(index[0])


# a fraction solved (r̄ = 1/4), none (r̄ = 0), all, a group of one (correct, incorrect), r̄ = 3/7, r̄ = 1/2
MAX_RL_GROUPS = [
    [1.0, 0.0, 0.0, 0.0],
    [0.0, 0.0, 0.0],
    [1.0] * 5,
    [1.0],
    [0.0],
    [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0],
    [0.0, 1.0],
]


@pytest.mark.parametrize("first", range(len(MAX_RL_GROUPS)))  # which group the release takes its N from
def test_max_rl_equals_the_released_code_on_hand_made_groups(first):
    groups = MAX_RL_GROUPS[first:] + MAX_RL_GROUPS[:first]
    rewards, group_ids = make_batch(groups, seed=first, shuffle=False)
    got = ADVANTAGES["max_rl"](rewards, group_ids)
    assert_close(got, release_max_rl(rewards, group_ids, epsilon=0.0), rtol=0, atol=1e-6)
    assert_close(got, per_group(prime_rl_max_rl, rewards, group_ids), rtol=0, atol=1e-6)
    by_group = {tuple(rs): got[group_ids == gid].tolist() for rs, gid in zip(groups, dict.fromkeys(group_ids.tolist()))}
    assert by_group[(1.0, 0.0, 0.0, 0.0)] == [3.0, -1.0, -1.0, -1.0]  # (N − K)/K and −1
    assert by_group[(0.0, 0.0, 0.0)] == [0.0] * 3 and by_group[(1.0,) * 5] == [0.0] * 5
    assert by_group[(1.0,)] == [0.0] and by_group[(0.0,)] == [0.0]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", SEEDS)
def test_max_rl_equals_the_released_code_on_random_groups(layout, seed):
    rewards, group_ids = make_batch(random_groups(LAYOUTS[layout], seed), seed)
    got = ADVANTAGES["max_rl"](rewards, group_ids)
    assert_close(got, release_max_rl(rewards, group_ids, epsilon=0.0), rtol=0, atol=1e-6)
    assert_close(got, per_group(prime_rl_max_rl, rewards, group_ids), rtol=0, atol=1e-6)
    # the release's ε = 1e-6 moves each value by at most N·ε relative (r̄ ≥ 1/N when it is not 0)
    n = max(LAYOUTS[layout])
    assert_close(got, release_max_rl(rewards, group_ids, epsilon=1e-6), rtol=n * 1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
def test_max_rl_gradient_is_unbiased_for_the_pass_at_k_sum_below_n(n):
    """For a Bernoulli(p) policy, E[(1/N)·Σ_i A_i ∂log π(x_i)/∂p] over all 2^N outcomes is
    d/dp Σ_{k=1..N−1} pass@k/k = Σ_{k<N} (1 − p)^(k−1): giving the all-wrong group 0 instead of the
    control variate's −1 costs the paper's order-N term."""
    p = 2 / 7
    outcomes = list(product([0.0, 1.0], repeat=n))
    rewards = torch.tensor(outcomes).flatten()
    group_ids = torch.arange(len(outcomes)).repeat_interleave(n)
    adv = ADVANTAGES["max_rl"](rewards, group_ids).double().view(-1, n)
    score = torch.where(torch.tensor(outcomes) > 0, 1 / p, -1 / (1 - p))  # ∂log π(x)/∂p
    prob = torch.tensor([p ** sum(o) * (1 - p) ** (n - sum(o)) for o in outcomes], dtype=torch.float64)
    expected_grad = (prob * (adv * score).sum(1) / n).sum().item()
    assert expected_grad == pytest.approx(sum((1 - p) ** (k - 1) for k in range(1, n)), rel=1e-6, abs=1e-9)


def test_max_rl_needs_two_samples_per_prompt():
    from lit_rlvr.options import LossOptions

    assert ADVANTAGES.trait("max_rl", "min_group_size", {}, default=1) == 2
    with pytest.raises(ValueError, match=r"model.sampling.n=1: advantage 'max_rl' compares the samples of a prompt"):
        LossOptions().with_advantage("max_rl", group_size=1)
    assert ADVANTAGES.options("max_rl") == []


# ----------------------------------------------------------------------------- shared edge cases and errors


@pytest.mark.parametrize("name", sorted(set(ADVANTAGES) - {*POLARITY_ENTRIES, "unlikeliness"}))
def test_group_of_one_and_all_equal_groups_get_zero(name):
    """Group-relative estimators (not PSR/NSR/W-REINFORCE, whose advantage is the reward's sign, nor
    the unlikeliness reward, which ranks an all-correct group by likelihood: tested below)."""
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    group_ids = torch.tensor([3, 3, 3, 3, 5, 5, 5, 9])  # all correct, all wrong, a single row
    out = ADVANTAGES[name](rewards, group_ids, **options_for(name, rewards, group_ids, k=1))
    assert torch.equal(out, torch.zeros(8))


@pytest.mark.parametrize("name", ["passk", "passk_full", "passk_bootstrap", "pkpo"])
@pytest.mark.parametrize("seed", SEEDS)
def test_k_equal_to_group_size_gives_zero(name, seed):
    rewards, group_ids = make_batch(random_groups([5, 5, 5], seed), seed)
    out = ADVANTAGES[name](rewards, group_ids, **options_for(name, rewards, group_ids, k=5))
    if name == "pkpo":  # loo−1 at k = N: only a sole success gets 1/C(N, N) = 1
        want = per_group(lambda rs: [float(r == 1 and sum(rs) == 1) for r in rs], rewards, group_ids)
        assert_close(out, want)
    else:
        assert torch.equal(out, torch.zeros(15))


@pytest.mark.parametrize("name", K_ENTRIES)
def test_k_errors_name_the_group_its_size_and_k(name):
    rewards, group_ids = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0]), torch.tensor([913, 913, 913, 4, 4])
    opts = options_for(name, rewards, group_ids)
    with pytest.raises(ValueError, match=r"k=3 exceeds the size of group 4 \(2 rows\)"):
        ADVANTAGES[name](rewards, group_ids, **{**opts, "k": 3})
    with pytest.raises(ValueError, match=r"k must be an integer >= 1; got k=0"):
        ADVANTAGES[name](rewards, group_ids, **{**opts, "k": 0})
    with pytest.raises(ValueError, match=r"k must be an integer >= 1; got 1.5"):
        ADVANTAGES[name](rewards, group_ids, **{**opts, "k": 1.5})


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_shape_errors_show_both_shapes(name):
    rewards, group_ids = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 1])
    with pytest.raises(ValueError, match=r"rewards \(4,\) and group_ids \(3,\)"):
        ADVANTAGES[name](rewards, group_ids, **options_for(name, rewards, rewards.long()))
    with pytest.raises(ValueError, match=r"rewards \(2, 2\) and group_ids \(2, 2\)"):
        ADVANTAGES[name](rewards.view(2, 2), rewards.long().view(2, 2), **options_for(name, rewards, rewards.long()))


@pytest.mark.parametrize("name", BINARY_ENTRIES)
def test_non_binary_rewards_are_rejected_by_value(name):
    rewards, group_ids = torch.tensor([1.0, 0.0, 0.5, 1.0]), torch.tensor([0, 0, 0, 0])
    with pytest.raises(ValueError, match=rf"{name} needs binary rewards in \{{0, 1\}}; got 0.5 at row 2"):
        ADVANTAGES[name](rewards, group_ids, **options_for(name, rewards, group_ids))


# ----------------------------------------------------------------------------- PSR, NSR, W-REINFORCE, unlikeliness

# Zhu et al. 2025 (arXiv 2506.01347), released code TianHongZXY/RLVR-Decomposed at a5d4e7c1,
# verl/trainer/ppo/core_algos.py compute_psr_nsr_outcome_advantage, run on these rows (one token
# each, token_level_rewards = token_level_scores = the 0/1 reward, eos_mask 1, gamma 1):
POLARITY_REWARDS = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
RELEASED_POLARITY = {  # advantage= 'positive' / 'negative' / 'weighted' (positive_advantage_weight 0.1)
    "psr": [1.0, 0.0, 0.0, 1.0, 0.0, 1.0],
    "nsr": [0.0, -1.0, -1.0, 0.0, -1.0, 0.0],
    "w_reinforce": [0.1, -1.0, -1.0, 0.1, -1.0, 0.1],
}


@pytest.mark.parametrize("name", POLARITY_ENTRIES)
def test_polarity_estimators_equal_the_released_code(name):
    rewards, group_ids = torch.tensor(POLARITY_REWARDS), torch.tensor([0, 0, 0, 1, 1, 2])
    assert_close(ADVANTAGES[name](rewards, group_ids), torch.tensor(RELEASED_POLARITY[name]))


@pytest.mark.parametrize("weight", [0.0, 0.1, 0.5, 1.0])
def test_w_reinforce_spans_nsr_to_reinforce(weight):
    rewards, group_ids = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.zeros(4, dtype=torch.long)
    got = ADVANTAGES["w_reinforce"](rewards, group_ids, positive_advantage_weight=weight)
    assert_close(got, torch.tensor([weight, -1.0, weight, weight]))
    if weight == 0.0:
        assert torch.equal(got, ADVANTAGES["nsr"](rewards, group_ids))
    if weight == 1.0:  # REINFORCE with reward ±1 = PSR + NSR
        assert torch.equal(got, ADVANTAGES["psr"](rewards, group_ids) + ADVANTAGES["nsr"](rewards, group_ids))


def test_w_reinforce_weight_is_checked_at_start_up():
    with pytest.raises(ValueError, match=r"positive_advantage_weight \(λ\) must be in \[0, 1\]"):
        ADVANTAGES.get_checked("w_reinforce", "adv", {"positive_advantage_weight": 1.5})


def unlikeliness_ref(rewards: list[float], logps: list[float], beta: float, std: str, eps: float) -> list[float]:
    """The release's group step written out: rank by mean log-prob (0 = least likely), scale, z-score."""
    n = len(rewards)
    rank = {i: r for r, i in enumerate(sorted(range(n), key=lambda i: (logps[i], i)))}
    shaped = [rewards[i] * (1 - beta * rank[i] / n) for i in range(n)]
    if len(set(shaped)) == 1:
        return [0.0] * n
    m = sum(shaped) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in shaped) / (n - 1 if std == "sample" else n))
    return [(x - m) / (sd + eps) for x in shaped]


@pytest.mark.parametrize("std", ["sample", "population"])
@pytest.mark.parametrize("beta", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", SEEDS)
def test_unlikeliness_matches_naive_loop(std, beta, layout, seed):
    rewards, group_ids = make_batch(random_groups(LAYOUTS[layout], seed), seed)
    logps = -entropies_for(group_ids, seed + 7)
    got = ADVANTAGES["unlikeliness"](rewards, group_ids, mean_logprobs=logps, rank_penalty=beta, std=std)
    want = torch.zeros(len(rewards))
    for g in set(group_ids.tolist()):
        rows = [i for i, h in enumerate(group_ids.tolist()) if h == g]
        ref = unlikeliness_ref([float(rewards[i]) for i in rows], [float(logps[i]) for i in rows], beta, std, 1e-6)
        want[rows] = torch.tensor(ref)
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    if beta == 0.0:  # no penalty: GRPO with the same std
        assert_close(got, ADVANTAGES["grpo"](rewards, group_ids, std=std), rtol=1e-6, atol=1e-7)


# He et al. 2025 (arXiv 2506.02355), released code AndreHe02/rewarding-unlikely-release at ca1cff05,
# verl/trainer/ppo/ray_lean_trainer.py RayLeanTrainer._compute_advantages with lean.rank_penalty
# 0.25, run on these two groups of 4 (old_log_probs one row per token below, eos_mask 1 on the
# tokens given; group "b" has every sample correct):
RELEASED_UNLIKELY_ROWS = [  # (uid, reward, per-token old log-probs)
    ("a", 1.0, [-0.1, -0.3]),
    ("a", 1.0, [-2.0, -1.0]),
    ("a", 0.0, [-1.0, -0.5]),
    ("a", 0.0, [-3.0, -0.2]),
    ("b", 1.0, [-0.5, -0.5]),
    ("b", 1.0, [-0.2, -0.1]),
    ("b", 1.0, [-1.5, -0.4]),
    ("b", 1.0, [-0.9, -0.6]),
]
RELEASED_UNLIKELY = [0.7385474, 0.9847299, -0.8616387, -0.8616387, -0.3872935, -1.1618806, 1.1618806, 0.3872935]


def test_unlikeliness_equals_the_released_code():
    rewards = torch.tensor([r for _, r, _ in RELEASED_UNLIKELY_ROWS])
    group_ids = torch.tensor([0 if u == "a" else 1 for u, _, _ in RELEASED_UNLIKELY_ROWS])
    mean_logprobs = torch.tensor([sum(lp) / len(lp) for _, _, lp in RELEASED_UNLIKELY_ROWS])
    got = ADVANTAGES["unlikeliness"](rewards, group_ids, mean_logprobs=mean_logprobs, rank_penalty=0.25)
    assert_close(got, torch.tensor(RELEASED_UNLIKELY), rtol=0, atol=1e-6)
    assert got[5] < got[4] < got[7] < got[6]  # all correct: the likelier, the lower


def test_unlikeliness_options_and_injected_logprobs():
    assert ADVANTAGES.declares("unlikeliness", "mean_logprobs") and "mean_logprobs" not in ADVANTAGES.options(
        "unlikeliness"
    )
    with pytest.raises(ValueError, match=r"rank_penalty \(β_rank\) must be in \[0, 1\]"):
        ADVANTAGES.get_checked("unlikeliness", "adv", {"rank_penalty": 2.0})
    with pytest.raises(ValueError, match="mean_logprobs must have the shape of rewards"):
        ADVANTAGES["unlikeliness"](torch.ones(3), torch.zeros(3, dtype=torch.long), mean_logprobs=torch.zeros(2))
    nan = ADVANTAGES["unlikeliness"](
        torch.ones(3), torch.zeros(3, dtype=torch.long), mean_logprobs=torch.tensor([float("nan"), -1.0, -2.0])
    )
    assert nan.isfinite().all() and nan[0] == nan.max()  # no usable mass ranks least likely: the largest reward


@pytest.mark.parametrize(("name", "silent"), [("psr", 0.0), ("nsr", 1.0)])
def test_the_other_signs_rows_get_exactly_zero_gradient(name, silent):
    """PSR moves only the correct rows, NSR only the incorrect ones: the others' tokens get no gradient."""
    from lit_rlvr.functional.losses import policy_loss

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    lp = torch.full((4, 3), -1.0, requires_grad=True)
    loss, _ = policy_loss(
        lp, lp.detach() - 0.05, ADVANTAGES[name](rewards, torch.zeros(4, dtype=torch.long)), torch.ones(4, 3)
    )
    loss.backward()
    assert (lp.grad[rewards == silent] == 0).all() and (lp.grad[rewards != silent] != 0).all()


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_an_estimator_that_checks_for_binary_rewards_declares_it(name):
    """The module refuses rewards known to be non-binary at start-up by the `binary_rewards` trait;
    an estimator that checks each batch for 0/1 rewards without declaring it would be missed."""
    checks = "_check_binary(" in inspect.getsource(ADVANTAGES[name])
    assert ADVANTAGES.trait(name, "binary_rewards", default=False) == checks


# ----------------------------------------------------------------------------- failed environments
def test_invalid_rows_are_left_out_of_their_groups_statistics_by_hand():
    """Group 0: rewards 1, 0, [failed 0], 1; group 1: 1, [failed 0] (one valid row left); group 2: 1, 0, 0, [failed]."""
    from lit_rlvr.functional.advantages import valid_row_advantages

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    valid = torch.tensor([True, True, False, True, True, False, True, True, True, False])
    # GRPO on group 0's valid 1, 0, 1: mean 2/3, population std √2/3; group 2's 1, 0, 0: mean 1/3, std √2/3
    s = math.sqrt(2) / 3
    want = [(1 / 3) / s, (-2 / 3) / s, 0, (1 / 3) / s, 0, 0, (2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0]
    got = valid_row_advantages(ADVANTAGES["grpo"], rewards, groups, valid, eps=0.0)
    assert_close(got, torch.tensor(want))
    # RLOO: each valid row against the mean of its group's other valid rows
    want = [1 - 0.5, 0 - 1, 0, 1 - 0.5, 0, 0, 1 - 0, 0 - 0.5, 0 - 0.5, 0]
    assert_close(valid_row_advantages(ADVANTAGES["rloo"], rewards, groups, valid), torch.tensor(want))
    # Pass@2 counts N and N_pos over valid rows: group 2 is N = 3, N_pos = 1, ρ = 1 − C(2,2)/C(3,2) = 2/3,
    # A_pos = √((1 − ρ)/ρ) = √½, A_neg = −(N_pos/N_neg)·A_pos; group 0 (N_neg = 1 < k) gets 0, as in the estimator
    a = math.sqrt(0.5)
    want = [0, 0, 0, 0, 0, 0, a, -a / 2, -a / 2, 0]
    assert_close(valid_row_advantages(ADVANTAGES["passk"], rewards, groups, valid, k=2), torch.tensor(want))
    # a group left with fewer than min_valid rows: 0 (here k = 3 > group 0's and group 2's 3 valid rows is fine)
    got = valid_row_advantages(ADVANTAGES["passk"], rewards, groups, valid, k=3, min_valid=3)
    assert got[4:6].tolist() == [0.0, 0.0] and got[[2, 5, 9]].tolist() == [0.0, 0.0, 0.0]
    # row-aligned inputs travel with the rows kept
    ent = torch.arange(10, dtype=torch.float64)
    got = valid_row_advantages(
        ADVANTAGES["passk_entropy_adaptive"], rewards, groups, valid, k=2, row_options={"entropies": ent}
    )
    keep = valid & torch.tensor([True] * 4 + [False] * 2 + [True] * 4)
    want = torch.zeros(10)
    want[keep] = ADVANTAGES["passk_entropy_adaptive"](rewards[keep], groups[keep], k=2, entropies=ent[keep])
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["grpo", "rloo", "passk", "max_rl", "pkpo"])
def test_with_every_row_valid_the_estimator_is_unchanged_bit_for_bit(name):
    from lit_rlvr.functional.advantages import valid_row_advantages

    rewards, groups = make_batch(random_groups([4, 4, 3], seed=1), seed=1)
    options = {"k": 2} if name in ("passk", "pkpo") else {}
    want = ADVANTAGES[name](rewards, groups, **options)
    for valid in (None, torch.ones_like(rewards, dtype=torch.bool)):
        assert torch.equal(valid_row_advantages(ADVANTAGES[name], rewards, groups, valid, **options), want)
    with pytest.raises(ValueError, match=r"valid must be a \(B,\) bool tensor"):
        valid_row_advantages(ADVANTAGES[name], rewards, groups, torch.ones(3, dtype=torch.bool), **options)
