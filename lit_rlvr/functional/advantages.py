"""Advantage estimators: GRPO, RLOO, the Pass@k Training family, PKPO, max-minus-second, MaxRL, the
sample-polarity REINFORCE family (PSR, NSR, W-REINFORCE) and the unlikeliness reward.

Every entry of :data:`ADVANTAGES` has the signature

    fn(rewards (B,), group_ids (B,), *, <keyword-only options>) -> advantages (B,) float32

A group is the set of rows sharing a ``group_id`` (one prompt's completions). Ids are arbitrary
integers, rows of different groups may be interleaved and groups may differ in size. Within a
group, "row order" means the order of its rows in the batch (only ``passk_full`` depends on it).
All arithmetic is float64; the result is cast to float32 at the end.

Sources (formulas in ``docs/methods.md`` §1 and §3):

- ``grpo``: Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300), std choices as in verl and
  Dr. GRPO (arXiv 2503.20783). ``rloo``: Ahmadian et al. 2024 (arXiv 2402.14740).
- ``passk``, ``passk_full``, ``passk_bootstrap``, ``passk_combined``, ``passk_entropy_adaptive``:
  Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and Exploitation"
  (arXiv 2508.10751), §3-§5, Eq. 18 for the combination.
- ``pkpo``: Walder & Karkhanis 2025 (arXiv 2505.15201), Eq. 8, 29 and 33.
- ``max_minus_second``: Tang et al. 2025 (arXiv 2503.19595), leave-one-out control variate for
  the pass@n objective.
- ``max_rl``: Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning" (MaxRL, arXiv
  2602.02710, ICML 2026): the group mean as baseline and as normaliser.
- ``psr``, ``nsr``, ``w_reinforce``: Zhu et al. 2025, "The Surprising Effectiveness of Negative
  Reinforcement in LLM Reasoning" (arXiv 2506.01347): REINFORCE with reward ±1 split by sign.
- ``unlikeliness``: He et al. 2025, "Rewarding the Unlikely: Lifting GRPO Beyond Distribution
  Sharpening" (arXiv 2506.02355): GRPO on rewards lowered for the samples the policy finds likely.

Where this code departs from (or pins down) the papers, and why:

- A group whose normalised values are all equal (all rewards equal, or a group of one row) gets
  advantage exactly 0, instead of ``(r − mean) / ε`` rounding noise. This is the only case in
  which the standard deviation is 0, so no other value changes.
- The Pass@k family normalises without ε (``passk`` has none in the paper's closed form, and
  ``passk_full`` / ``passk_bootstrap`` must agree with it in expectation). ``passk_combined`` and
  ``passk_entropy_adaptive`` use ``passk`` at k = 1 as the Pass@1 advantage, which is exactly GRPO
  with population std and ε = 0.
- ``passk`` evaluates C(N_neg, k)/C(N, k) as Σ_{i<k} log1p(−N_pos/(N − i)) in float64 (the product
  form of the binomial ratio) rather than as an lgamma difference: lgamma(1025) ≈ 6079 leaves
  ~1e-12 absolute error in the log, which becomes ~1e-9 relative error in A when ρ is small.
- ``pkpo`` returns the paper's PKPO transform ``s^(loo−1)`` (Eq. 33, the one used in all its LLM
  experiments) by default; see :func:`pkpo` for the reading of the formulas and of k = 1.
- ``psr`` / ``nsr`` keep every row (the other sign's rows get 0); the release drops them from the
  batch, which changes only the loss's normaliser (see :func:`nsr`).
- ``max_rl`` is the paper's (r − r̄)/r̄ without the release's ε and without its extra 1/N (see
  :func:`max_rl`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lit_rlvr.registry import Registry

ADVANTAGES = Registry("advantage estimator", injected=("entropies", "generator", "mean_logprobs"))
"""Name → ``fn(rewards (B,), group_ids (B,), *, options) -> (B,)``. ``entropies`` (each row's mean
token entropy), ``generator`` and ``mean_logprobs`` (each row's mean token log π_old) are passed by
the module to the estimators that declare them; every other keyword-only parameter is an option
(``model.loss.advantage_options``), checked at start-up. An estimator that compares a prompt's
samples with each other (a group baseline: every one here but PKPO without a baseline) declares
``min_group_size=2`` (:meth:`~lit_rlvr.registry.Registry.trait`): with one sample per prompt its
advantages are all 0, so the module refuses ``model.sampling.n`` below it at start-up. One that
needs rewards in {0, 1} (Pass@k's, PSR/NSR's) declares ``binary_rewards=True``: rewards known to
take other values are refused at start-up, the others checked on every batch."""
register_advantage = ADVANTAGES.register

STD_MODES = ("population", "sample", "none")
UNLIKELINESS_STD_MODES = ("sample", "population")
PKPO_BASELINES = ("loo_minus_one", "loo", "none")


class _Groups(NamedTuple):
    """Rows gathered by group: ``ids (P,)`` sorted unique ids, ``index (B,)`` each row's position
    in ``ids``, ``counts (P,)`` rows per group."""

    ids: Tensor
    index: Tensor
    counts: Tensor

    def sum(self, values: Tensor) -> Tensor:
        """Per-group sums of ``values (B,)`` as float64: ``(P,)``."""
        out = torch.zeros(len(self.ids), dtype=torch.float64, device=values.device)
        return out.index_add_(0, self.index, values.double())

    def mean(self, values: Tensor) -> Tensor:
        """Per-group means of ``values (B,)``: ``(P,)``."""
        return self.sum(values) / self.counts

    def blocks(self) -> list[Tensor]:
        """Row indices laid out as one ``(P_n, n)`` matrix per distinct group size ``n``, each
        matrix row one group in row order. Lets the subset-based estimators work on matrices."""
        order = torch.argsort(self.index, stable=True)  # (B,) grouped, row order kept inside
        starts = torch.cumsum(self.counts, 0) - self.counts  # (P,)
        out = []
        for n in torch.unique(self.counts).tolist():
            members = (self.counts == n).nonzero().squeeze(1)  # (P_n,)
            positions = starts[members, None] + torch.arange(n, device=self.counts.device)
            out.append(order[positions])  # (P_n, n)
        return out


def _grouped(rewards: Tensor, group_ids: Tensor) -> _Groups:
    """Validate the (B,) shapes and group the rows."""
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            "rewards and group_ids must both have shape (B,); got rewards "
            f"{tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)}"
        )
    ids, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return _Groups(ids, index, counts)


def _positive_int(value, name: str) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= 1; got {value!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1; got {name}={value}")
    return value


def _check_k_option(k) -> None:
    """The option check of the Pass@k estimators (``k`` against the group size is checked per batch)."""
    _positive_int(k, "k")


def _check_grpo(std: str, eps: float) -> None:
    if std not in STD_MODES:
        raise ValueError(f"grpo: std must be one of {STD_MODES}; got {std!r}")
    if not eps >= 0:
        raise ValueError(f"grpo: eps must be >= 0; got {eps}")


def _check_bootstrap(k, num_groups) -> None:
    _positive_int(k, "k")
    if num_groups is not None:
        _positive_int(num_groups, "num_groups")


def _check_pkpo(k, baseline: str) -> None:
    _positive_int(k, "k")
    if baseline not in PKPO_BASELINES:
        raise ValueError(f"pkpo: baseline must be one of {PKPO_BASELINES}; got {baseline!r}")


def _pkpo_min_group_size(k, baseline: str) -> int:
    """PKPO without a baseline (Eq. 8) scores a lone sample; its baselines need a second one."""
    return 1 if baseline == "none" else 2


def _check_k(k: int, groups: _Groups) -> int:
    """``k`` must be an integer with 1 <= k <= every group's size; errors name the group."""
    k = _positive_int(k, "k")
    too_small = (groups.counts < k).nonzero()
    if len(too_small):
        p = int(too_small[0])
        raise ValueError(
            f"k={k} exceeds the size of group {int(groups.ids[p])} ({int(groups.counts[p])} rows); "
            "pass@k needs at least k samples per prompt: lower k or sample more per prompt"
        )
    return k


def _check_binary(rewards: Tensor, name: str) -> None:
    bad = ((rewards != 0) & (rewards != 1)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{name} needs binary rewards in {{0, 1}}; got {rewards[i].item()!r} at row {i}")


def _zscore(x: Tensor, std: str = "population", eps: float = 0.0) -> Tensor:
    """Normalise each row of ``x (P, M)`` across its M values; rows with one distinct value -> 0."""
    centred = x - x.mean(-1, keepdim=True)
    if std == "none":
        z = centred
    else:
        dof = max(x.shape[-1] - (std == "sample"), 1)
        z = centred / ((centred.square().sum(-1, keepdim=True) / dof).sqrt() + eps)
    constant = (x == x[..., :1]).all(-1, keepdim=True)
    return torch.where(constant, 0.0, z)


def _log_miss(n: Tensor, c: Tensor, k: int) -> Tensor:
    """log C(n − c, k)/C(n, k) (the chance that a random k-subset holds none of c correct), as
    Σ_{i<k} log1p(−c/(n − i)); −inf when n − c < k. ``n``, ``c``: float64 of any shape."""
    i = torch.arange(k, dtype=torch.float64, device=n.device)
    feasible = n - c >= k
    terms = torch.log1p(-c[..., None] / (n[..., None] - i).clamp(min=1.0))
    total = torch.where(feasible[..., None], terms, 0.0).sum(-1)
    return torch.where(feasible, total, -torch.inf)


def _passk_pos_neg(n: Tensor, n_pos: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Analytical Pass@k advantages (A_pos, A_neg) of groups with ``n (P,)`` rows, ``n_pos (P,)``
    correct, float64: A_pos = sqrt((1 − ρ)/ρ), A_neg = −(N_pos/N_neg)·A_pos; 0 when ρ ∈ {0, 1}."""
    n_neg = n - n_pos
    live = (n_pos > 0) & (n_neg >= k)
    log_q = torch.where(live, _log_miss(n, n_pos, k), -1.0)  # log(1 − ρ); dummy where not live
    a_pos = torch.where(live, torch.exp(0.5 * (log_q - torch.log(-torch.expm1(log_q)))), 0.0)
    return a_pos, -a_pos * n_pos / n_neg.clamp(min=1.0)


def _passk(rewards: Tensor, groups: _Groups, k: int) -> Tensor:
    """Row advantages (B,) float64 of the analytical Pass@k estimator (inputs already checked)."""
    a_pos, a_neg = _passk_pos_neg(groups.counts.double(), groups.sum(rewards), k)
    return torch.where(rewards > 0, a_pos[groups.index], a_neg[groups.index])


def valid_row_advantages(
    estimator: Callable[..., Tensor],
    rewards: Tensor,
    group_ids: Tensor,
    valid: Tensor | None,
    *,
    min_valid: int | None = None,
    row_options: Mapping[str, Tensor] | None = None,
    **options: Any,
) -> Tensor:
    """``estimator``'s advantages with the invalid rows (a trajectory whose environment failed) left out of
    every group statistic: baselines, normalisers and the Pass@k counts see the valid rows only.

    Args:
        estimator: an entry of :data:`ADVANTAGES`.
        rewards: ``(B,)`` rewards.
        group_ids: ``(B,)`` integer group of each row.
        valid: ``(B,)`` bool, the rows that count; None (or all True): the estimator's own result, unchanged.
        min_valid: a group with fewer valid rows gets advantage 0; None: ``max(2, k)`` (a baseline needs
            another sample, the Pass@k family's ``k`` option needs k).
        row_options: ``(B,)`` row-aligned inputs of the estimator (``entropies``, ``mean_logprobs``),
            restricted with the rows.
        options: the estimator's other options.

    Returns:
        ``(B,)`` float32: the estimator on the valid rows of the groups keeping at least ``min_valid``
        of them, 0 on every other row.

    Example:
        >>> r, g = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 1, 1])
        >>> valid_row_advantages(rloo, r, g, torch.tensor([True, True, False, True, False]))
        tensor([ 1., -1.,  0.,  0.,  0.])
    """
    row_options = dict(row_options or {})
    min_valid = max(2, int(options.get("k", 1))) if min_valid is None else min_valid
    if valid is not None and (valid.shape != rewards.shape or valid.dtype != torch.bool):
        raise ValueError(
            f"valid must be a (B,) bool tensor like rewards {tuple(rewards.shape)}; "
            f"got {tuple(valid.shape)} {valid.dtype}"
        )
    if valid is None or bool(valid.all()):
        return estimator(rewards, group_ids, **row_options, **options)
    groups = _grouped(rewards, group_ids)
    counts = torch.zeros(len(groups.ids), dtype=torch.long, device=valid.device).index_add_(
        0, groups.index, valid.long()
    )
    keep = valid & (counts[groups.index] >= min_valid)  # (B,)
    out = torch.zeros(rewards.shape, dtype=torch.float32, device=rewards.device)
    if keep.any():
        kept = {name: value[keep.to(value.device)] for name, value in row_options.items()}
        out[keep] = estimator(rewards[keep], group_ids[keep], **kept, **options).float()
    return out


@register_advantage("grpo", check=_check_grpo, min_group_size=2)
def grpo(rewards: Tensor, group_ids: Tensor, *, std: str = "population", eps: float = 1e-6) -> Tensor:
    """GRPO: A_i = (r_i − mean_g) / (std_g + ε) within each group (docs/methods.md §1).

    Args:
        rewards: ``(B,)`` rewards.
        group_ids: ``(B,)`` integer group (prompt) of each row.
        std: ``"population"`` (1/G, default, as the Pass@k paper), ``"sample"`` (1/(G − 1), verl)
            or ``"none"`` (no division, Dr. GRPO).
        eps: added to the std.

    Returns:
        ``(B,)`` float32 advantages; exactly 0 for groups whose rewards are all equal (including
        groups of one row).

    Example:
        >>> grpo(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0]), torch.tensor([7, 7, 7, 7, 3]))
        tensor([ 1.7320, -0.5773, -0.5773, -0.5773,  0.0000])
        >>> grpo(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([7, 7, 7, 7]), std="none")
        tensor([ 0.7500, -0.2500, -0.2500, -0.2500])
    """
    _check_grpo(std, eps)
    groups = _grouped(rewards, group_ids)
    r = rewards.double()
    out = torch.zeros_like(r)
    for rows in groups.blocks():  # (P_n, n)
        out[rows] = _zscore(r[rows], std, eps)
    return out.float()


@register_advantage("rloo", min_group_size=2)
def rloo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: A_i = r_i − mean of the other G − 1 rewards of the group (docs/methods.md §1).

    Args:
        rewards: ``(B,)`` rewards.
        group_ids: ``(B,)`` integer group of each row.

    Returns:
        ``(B,)`` float32 advantages; 0 for a group of one row (no other sample to compare with).

    Example:
        >>> rloo(torch.tensor([1.0, 0.0, 0.0, 5.0]), torch.tensor([0, 0, 0, 1]))
        tensor([ 1.0000, -0.5000, -0.5000,  0.0000])
    """
    groups = _grouped(rewards, group_ids)
    r = rewards.double()
    n = groups.counts[groups.index].double()
    others = (groups.sum(r)[groups.index] - r) / (n - 1).clamp(min=1.0)
    return torch.where(n > 1, r - others, 0.0).float()


@register_advantage("passk", check=_check_k_option, min_group_size=2, binary_rewards=True)
def passk(rewards: Tensor, group_ids: Tensor, *, k: int) -> Tensor:
    """Analytical Pass@k advantage (Pass@k Training, arXiv 2508.10751, §4; docs/methods.md §3).

    With ρ = 1 − C(N_neg, k)/C(N, k) and σ = sqrt(ρ(1 − ρ)):
    A_pos = (1 − ρ)/σ = sqrt((1 − ρ)/ρ) and
    A_neg = (1 − ρ − C(N_neg − 1, k − 1)/C(N − 1, k − 1))/σ = −(N_pos/N_neg)·A_pos.
    This is the full-enumeration limit of the bootstrap: over all C(N, k) k-subsets with reward
    max, ρ and σ are the mean and population std of the subset rewards, and each row gets the
    average normalised advantage (R_S − ρ)/σ of the subsets S that contain it. At k = 1 it is GRPO
    with population std and ε = 0. Both values are 0 when N_pos = 0, N_pos = N or N_neg < k (then
    every subset has the same reward), so k = N gives 0 everywhere.

    Args:
        rewards: ``(B,)`` binary rewards (0/1).
        group_ids: ``(B,)`` integer group of each row.
        k: subset size, 1 <= k <= every group's size.

    Returns:
        ``(B,)`` float32 advantages, accurate to ~1e-12 relative (before the cast) for N up to
        thousands.

    Raises:
        ValueError: non-binary rewards, k < 1, or k larger than some group (names it).

    Example:
        >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0])
        >>> passk(r, torch.zeros(4, dtype=torch.long), k=2)  # ρ = 1/2
        tensor([ 1.0000, -0.3333, -0.3333, -0.3333])
        >>> passk(r, torch.zeros(4, dtype=torch.long), k=1)  # = grpo population
        tensor([ 1.7321, -0.5774, -0.5774, -0.5774])
    """
    groups = _grouped(rewards, group_ids)
    k = _check_k(k, groups)
    _check_binary(rewards, "passk")
    return _passk(rewards.double(), groups, k).float()


@register_advantage("passk_full", check=_check_k_option, min_group_size=2)
def passk_full(rewards: Tensor, group_ids: Tensor, *, k: int) -> Tensor:
    """Pass@k "full sampling" advantage (arXiv 2508.10751, §3; docs/methods.md §3).

    Each group's rows, in row order, are cut into ⌊N/k⌋ consecutive chunks of k; the rows left
    over (the last N mod k) get 0. A chunk's reward is its max, chunk rewards are normalised
    across the group's chunks (mean, population std, no ε; all-equal -> 0), and every row gets
    its chunk's advantage. Rewards need not be binary.

    Args:
        rewards: ``(B,)`` rewards.
        group_ids: ``(B,)`` integer group of each row.
        k: chunk size, 1 <= k <= every group's size.

    Returns:
        ``(B,)`` float32 advantages.

    Example:
        >>> r = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
        >>> passk_full(r, torch.zeros(7, dtype=torch.long), k=2)  # chunks [0,1] [0,0] [1,1]; row 6 left over
        tensor([ 0.7071,  0.7071, -1.4142, -1.4142,  0.7071,  0.7071,  0.0000])
    """
    groups = _grouped(rewards, group_ids)
    k = _check_k(k, groups)
    r = rewards.double()
    out = torch.zeros_like(r)
    for rows in groups.blocks():  # (P_n, n)
        m = rows.shape[1] // k
        used = rows[:, : m * k]  # (P_n, m·k)
        chunk_max = r[used].view(len(rows), m, k).amax(-1)  # (P_n, m)
        out[used] = _zscore(chunk_max).repeat_interleave(k, dim=1)
    return out.float()


@register_advantage("passk_bootstrap", check=_check_bootstrap, min_group_size=2)
def passk_bootstrap(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    k: int,
    generator: torch.Generator | None = None,
    num_groups: int | None = None,
) -> Tensor:
    """Pass@k "bootstrap sampling" advantage (arXiv 2508.10751, §3; docs/methods.md §3).

    For each prompt group of N rows, draw ``num_groups`` (default N) k-subsets of distinct rows,
    each uniformly and independently (the same subset may be drawn twice). A subset's reward is
    its max; subset rewards are normalised across the drawn subsets (mean, population std, no ε;
    all-equal -> 0); a row's advantage is the SUM of the advantages of the drawn subsets that
    contain it (0 if none). Rewards need not be binary.

    Args:
        rewards: ``(B,)`` rewards.
        group_ids: ``(B,)`` integer group of each row.
        k: subset size, 1 <= k <= every group's size.
        generator: source of randomness (``None``: torch's global generator); random numbers are
            drawn on its device.
        num_groups: subsets drawn per prompt group (default: that group's size).

    Returns:
        ``(B,)`` float32 advantages. Within a group they sum to 0.

    Example:
        >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0])
        >>> a = passk_bootstrap(r, torch.zeros(4, dtype=torch.long), k=2,
        ...                     generator=torch.Generator().manual_seed(0))
        >>> a.shape, round(float(a.sum()), 6)
        (torch.Size([4]), 0.0)
    """
    groups = _grouped(rewards, group_ids)
    k = _check_k(k, groups)
    if num_groups is not None:
        num_groups = _positive_int(num_groups, "num_groups")
    device = generator.device if generator is not None else rewards.device
    r = rewards.double()
    out = torch.zeros_like(r)
    for rows in groups.blocks():  # (P_n, n)
        p, n = rows.shape
        m = n if num_groups is None else num_groups
        keys = torch.rand(p, m, n, generator=generator, device=device)
        picked = keys.argsort(-1)[..., :k].to(r.device)  # (P_n, m, k) uniform k-subsets
        subset_max = r[rows].gather(1, picked.reshape(p, m * k)).view(p, m, k).amax(-1)  # (P_n, m)
        adv = _zscore(subset_max).repeat_interleave(k, dim=1)  # (P_n, m·k)
        sums = torch.zeros(p, n, dtype=r.dtype, device=r.device)
        out[rows] = sums.scatter_add_(1, picked.reshape(p, m * k), adv)
    return out.float()


@register_advantage("passk_combined", check=_check_k_option, min_group_size=2, binary_rewards=True)
def passk_combined(rewards: Tensor, group_ids: Tensor, *, k: int) -> Tensor:
    """Pass@k/Pass@1 mix (arXiv 2508.10751, Eq. 18): A = (N_pos/N)·A_passk + (1 − N_pos/N)·A_pass1.

    Easy prompts (many correct) lean on the Pass@k advantage, hard ones on Pass@1. A_pass1 is
    ``passk`` at k = 1, i.e. GRPO with population std and ε = 0.

    Args:
        rewards: ``(B,)`` binary rewards.
        group_ids: ``(B,)`` integer group of each row.
        k: subset size of the Pass@k term.

    Returns:
        ``(B,)`` float32 advantages.

    Example:
        >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0])
        >>> passk_combined(r, torch.zeros(4, dtype=torch.long), k=2)  # ¼·passk(2) + ¾·passk(1)
        tensor([ 1.5490, -0.5163, -0.5163, -0.5163])
    """
    groups = _grouped(rewards, group_ids)
    k = _check_k(k, groups)
    _check_binary(rewards, "passk_combined")
    r = rewards.double()
    share = (groups.sum(r) / groups.counts)[groups.index]  # N_pos/N per row
    return (share * _passk(r, groups, k) + (1 - share) * _passk(r, groups, 1)).float()


@register_advantage("passk_entropy_adaptive", check=_check_k_option, min_group_size=2, binary_rewards=True)
def passk_entropy_adaptive(rewards: Tensor, group_ids: Tensor, *, k: int, entropies: Tensor) -> Tensor:
    """Entropy-routed Pass@1/Pass@k advantage (arXiv 2508.10751, §5; docs/methods.md §3).

    Prompts are ranked by the mean of their rows' entropies. The ⌊P/2⌋ highest-entropy prompts
    (already exploring) get the Pass@1 advantage (``passk`` at k = 1 = GRPO, population std, ε = 0);
    the others get ``passk`` with ``k``. With an odd number of prompts the middle one goes to
    Pass@k (a batch of one prompt is all Pass@k). Ties in mean entropy are broken by group id: the
    smaller id ranks as the higher entropy.

    Args:
        rewards: ``(B,)`` binary rewards.
        group_ids: ``(B,)`` integer group of each row.
        k: subset size of the Pass@k branch.
        entropies: ``(B,)`` mean token entropy of each row's completion.

    Returns:
        ``(B,)`` float32 advantages.

    Example:
        >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
        >>> g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
        >>> h = torch.tensor([0.1, 0.1, 0.1, 0.1, 2.0, 2.0, 2.0, 2.0])  # group 1 explores more
        >>> passk_entropy_adaptive(r, g, k=2, entropies=h)
        tensor([ 1.0000, -0.3333, -0.3333, -0.3333,  1.7321, -0.5774, -0.5774, -0.5774])
    """
    groups = _grouped(rewards, group_ids)
    k = _check_k(k, groups)
    _check_binary(rewards, "passk_entropy_adaptive")
    if entropies.shape != rewards.shape:
        raise ValueError(
            f"entropies must have the shape of rewards {tuple(rewards.shape)}; got {tuple(entropies.shape)}"
        )
    r = rewards.double()
    order = torch.argsort(groups.mean(entropies), descending=True, stable=True)  # ids ascending on ties
    high = torch.zeros(len(groups.ids), dtype=torch.bool, device=r.device)
    high[order[: len(groups.ids) // 2]] = True
    return torch.where(high[groups.index], _passk(r, groups, 1), _passk(r, groups, k)).float()


@register_advantage("pkpo", check=_check_pkpo, min_group_size=_pkpo_min_group_size, binary_rewards=True)
def pkpo(rewards: Tensor, group_ids: Tensor, *, k: int, baseline: str = "loo_minus_one") -> Tensor:
    """Pass@k Policy Optimization reward transform (Walder & Karkhanis, arXiv 2505.15201).

    With N rows, c = N_pos correct, and ρ(n, c, k) = 1 − C(n − c, k)/C(n, k) (unbiased pass@k):

    - ``"none"`` (Eq. 8): r_i = k/N if correct else (k/N)·ρ(N − 1, c, k − 1). This is
      s_i = (1/C(N, k))·Σ_{|I|=k, i∈I} max_{j∈I} r_j, and Σ_i r_i ∇log π(y_i) is unbiased for
      ∇pass@k. Note Σ_i r_i = k·ρ(N, c, k): the mean of the r_i is (k/N)·pass@k (the mean of
      (N/k)·r_i is the unbiased pass@k estimate), since each k-subset is counted once per member.
    - ``"loo"`` (Eq. 29): s_i − (1/(N − 1))·Σ_{j≠i} S(j, k, rows∖i) = s_i − (k/(N − 1))·ρ(N − 1,
      c − r_i, k), the same estimator on the other N − 1 rows as baseline. Needs k <= N − 1.
    - ``"loo_minus_one"`` (Eq. 33, default; the variant the paper calls PKPO in its LLM runs):
      (1/C(N, k))·Σ_{|I|=k, i∈I} (max_I r − max_{I∖i} r). For binary rewards this is
      C(N − c, k − 1)/C(N, k) for a correct row (the subsets where it is the only success) and 0 for
      an incorrect one. At k = 1 the baseline subset is empty; the paper then uses plain LOO mean
      centring (its Eq. 26); we use it scaled by 1/N, (r_i − mean_{j≠i} r_j)/N, so that
      Σ_i A_i ∇log π(y_i) stays an unbiased estimate of ∇pass@k on one scale for every k (the
      paper's unscaled form is N times larger).

    No std normalisation is applied: magnitudes are those of the paper (order k/N).

    Args:
        rewards: ``(B,)`` binary rewards.
        group_ids: ``(B,)`` integer group of each row.
        k: the pass@k being optimised.
        baseline: ``"loo_minus_one"`` (default), ``"loo"`` or ``"none"``.

    Returns:
        ``(B,)`` float32 advantages.

    Example:
        >>> r, g = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long)
        >>> pkpo(r, g, k=2, baseline="none")  # 2/4 and (2/4)·ρ(3, 2, 1) = 1/2 · 2/3
        tensor([0.5000, 0.5000, 0.3333, 0.3333])
        >>> pkpo(r, g, k=2)  # C(2, 1)/C(4, 2) = 1/3 for each success, 0 otherwise
        tensor([0.3333, 0.3333, 0.0000, 0.0000])
    """
    _check_pkpo(k, baseline)
    groups = _grouped(rewards, group_ids)
    k = _check_k(k, groups)
    _check_binary(rewards, "pkpo")
    r = rewards.double()
    n = groups.counts.double()[groups.index]  # (B,) group size per row
    c = groups.sum(r)[groups.index]  # (B,) correct per row's group
    if baseline == "loo_minus_one":
        if k == 1:
            return (torch.where(n > 1, r - (c - r) / (n - 1).clamp(min=1.0), 0.0) / n).float()
        return (r * (k / n) * torch.exp(_log_miss(n - 1, c - 1, k - 1))).float()
    s = (k / n) * torch.where(r > 0, 1.0, -torch.expm1(_log_miss(n - 1, c, k - 1)))
    if baseline == "none":
        return s.float()
    if int(groups.counts.min()) <= k:
        p = int(groups.counts.argmin())
        raise ValueError(
            f"pkpo baseline 'loo' needs k <= group size - 1; group {int(groups.ids[p])} has "
            f"{int(groups.counts[p])} rows and k={k} (use baseline='loo_minus_one')"
        )
    return (s - k / (n - 1) * -torch.expm1(_log_miss(n - 1, c - r, k))).float()


@register_advantage("max_minus_second", min_group_size=2)
def max_minus_second(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Leave-one-out max advantage (Tang et al., arXiv 2503.19595): A_i = max_g r − max_{g∖i} r.

    Only the best row of a group gets a non-zero advantage, r_max − r_2nd; every other row's
    leave-one-out max is the group max, so it gets 0. Ties at the top give 0 to every row (the
    second best equals the best). A group of one row gets 0.

    Args:
        rewards: ``(B,)`` rewards.
        group_ids: ``(B,)`` integer group of each row.

    Returns:
        ``(B,)`` float32 advantages.

    Example:
        >>> max_minus_second(torch.tensor([0.2, 0.9, 0.5, 1.0, 1.0]), torch.tensor([0, 0, 0, 1, 1]))
        tensor([0.0000, 0.4000, 0.0000, 0.0000, 0.0000])
    """
    groups = _grouped(rewards, group_ids)
    r = rewards.double()
    out = torch.zeros_like(r)
    for rows in groups.blocks():  # (P_n, n)
        if rows.shape[1] < 2:
            continue
        x = r[rows]
        top2 = x.topk(2, dim=1).values  # (P_n, 2)
        best = rows.gather(1, x.argmax(1, keepdim=True)).squeeze(1)  # (P_n,)
        out[best] = top2[:, 0] - top2[:, 1]
    return out.float()


@register_advantage("max_rl", min_group_size=2, binary_rewards=True)
def max_rl(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """MaxRL (Tajwar et al. 2026, arXiv 2602.02710): A_i = (r_i − r̄_g)/r̄_g, 0 when r̄_g = 0 (docs/methods.md §9).

    The group mean r̄_g = K/N (K correct of N) is both the baseline and the normaliser, where GRPO
    divides by the standard deviation. A correct row gets (N − K)/K, an incorrect one −1; a group
    with no correct row gets 0, and an all-correct group and a group of one row get 0 by the
    formula. For K ≥ 1, (1/N)·Σ_i A_i ∇log π(y_i) = (1/K)·Σ_{correct} ∇log π − (1/N)·Σ_all ∇log π:
    the paper's estimator ĝ_N (the mean score of the correct samples) less its control variate V_N
    (the mean score of all samples). A prompt solved at rate p weighs about 1/p, as in
    maximum likelihood, instead of 1. Giving the K = 0 group 0 (the release's and prime-rl's
    choice) drops the control variate there, so the gradient is unbiased for
    ∇ Σ_{k=1..N−1} pass@k/k, one order less than the paper's N (a test checks this exactly).

    Equal, on binary rewards, to the authors' release (Zanette-Labs/MaxRL 76e04d1e,
    ``compute_p_normalization_outcome_advantage``) with ε = 0, times the size of the batch's first
    group, and to prime-rl's ``max_rl``. Departures from the release: no ε in (r − r̄)/(r̄ + ε), so
    the values are the formula's exactly (r̄ ≥ 1/N whenever it is not 0, so ε = 1e-6 moved them by
    up to N·1e-6 relative); no extra 1/N (the loss's aggregation already averages over rows; the
    release divides every group by the first group's size, which scales the whole gradient down).

    Args:
        rewards: ``(B,)`` binary rewards (0/1).
        group_ids: ``(B,)`` integer group of each row.

    Returns:
        ``(B,)`` float32 advantages.

    Raises:
        ValueError: non-binary rewards (names the first one and its row).

    Example:
        >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
        >>> max_rl(r, torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 3]))  # r̄ = 1/4, 1, 0, and a group of one
        tensor([ 3., -1., -1., -1.,  0.,  0.,  0.,  0.,  0.])
    """
    groups = _grouped(rewards, group_ids)
    _check_binary(rewards, "max_rl")
    r = rewards.double()
    mean = groups.mean(r)[groups.index]  # (B,) r̄ of each row's group
    solved = mean > 0
    return torch.where(solved, (r - mean) / torch.where(solved, mean, 1.0), 0.0).float()


@register_advantage("psr", binary_rewards=True)
def psr(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Positive sample reinforcement (Zhu et al. 2025, arXiv 2506.01347): A = 1 for a correct row, 0 otherwise.

    The PSR half of REINFORCE with reward ±1 (the paper's decomposition L = L_PSR + L_NSR):
    only correct samples are reinforced, which sharpens the policy (pass@1 up, pass@k down in the
    paper). No baseline, no group normalisation.

    Args:
        rewards: ``(B,)`` binary rewards.
        group_ids: ``(B,)`` (unused: PSR compares no rows).

    Example:
        >>> psr(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]))
        tensor([1., 0., 1.])
    """
    _grouped(rewards, group_ids)
    _check_binary(rewards, "psr")
    return rewards.float()


@register_advantage("nsr", binary_rewards=True)
def nsr(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Negative sample reinforcement (Zhu et al. 2025, arXiv 2506.01347): A = −1 for an incorrect row, 0 otherwise.

    The NSR half of REINFORCE with reward ±1: only incorrect samples are pushed down, and the
    mass they lose goes to the other tokens in proportion to their probability, which the paper
    finds keeps pass@k across the whole k range. The authors' release
    (TianHongZXY/RLVR-Decomposed a5d4e7c1, ``compute_psr_nsr_outcome_advantage`` with
    ``advantage='negative'``) gives the same values (``returns − 1`` with the 0/1 reward as return)
    and then drops the correct rows from the batch; here they stay with A = 0, so they add nothing
    to the gradient but count in the loss's normaliser (with ``token_mean`` the loss is the
    release's × tokens of incorrect rows / all tokens).

    Args:
        rewards: ``(B,)`` binary rewards.
        group_ids: ``(B,)`` (unused: NSR compares no rows).

    Example:
        >>> nsr(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 1]))
        tensor([ 0., -1., -1.])
    """
    _grouped(rewards, group_ids)
    _check_binary(rewards, "nsr")
    return rewards.float() - 1.0


def _check_weight(positive_advantage_weight) -> None:
    w = positive_advantage_weight
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0:
        raise ValueError(f"w_reinforce: positive_advantage_weight (λ) must be in [0, 1] (0.1 in the paper), got {w!r}")


@register_advantage("w_reinforce", check=_check_weight, binary_rewards=True)
def w_reinforce(rewards: Tensor, group_ids: Tensor, *, positive_advantage_weight: float = 0.1) -> Tensor:
    """Weighted REINFORCE (Zhu et al. 2025, arXiv 2506.01347): A = λ for a correct row, −1 for an incorrect one.

    L = λ·L_PSR + L_NSR: positive samples down-weighted by λ (0.1 in the paper), so the update is
    mostly negative reinforcement with a little sharpening. λ = 0 is NSR, λ = 1 REINFORCE with
    reward ±1. Equal to the release's ``advantage='weighted'`` (which also keeps every row).

    Args:
        rewards: ``(B,)`` binary rewards.
        group_ids: ``(B,)`` (unused).
        positive_advantage_weight: λ ∈ [0, 1] (the release's name).

    Example:
        >>> w_reinforce(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
        tensor([ 0.1000, -1.0000])
    """
    _check_weight(positive_advantage_weight)
    _grouped(rewards, group_ids)
    _check_binary(rewards, "w_reinforce")
    r = rewards.double()
    return torch.where(r > 0, positive_advantage_weight * r, r - 1.0).float()


def _check_unlikeliness(rank_penalty, std, eps) -> None:
    if isinstance(rank_penalty, bool) or not isinstance(rank_penalty, (int, float)) or not 0.0 <= rank_penalty <= 1.0:
        raise ValueError(
            f"unlikeliness: rank_penalty (β_rank) must be in [0, 1] (0.25 in the paper), got {rank_penalty!r}"
        )
    if std not in UNLIKELINESS_STD_MODES:
        raise ValueError(f"unlikeliness: std must be one of {UNLIKELINESS_STD_MODES}; got {std!r}")
    if not eps >= 0:
        raise ValueError(f"unlikeliness: eps must be >= 0; got {eps}")


@register_advantage("unlikeliness", check=_check_unlikeliness, min_group_size=2)
def unlikeliness(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    mean_logprobs: Tensor,
    rank_penalty: float = 0.25,
    std: str = "sample",
    eps: float = 1e-6,
) -> Tensor:
    """The unlikeliness reward (He et al. 2025, arXiv 2506.02355), then GRPO.

    GRPO's update favours the samples the policy already finds likely (rank bias), so it sharpens
    the distribution instead of widening it. The unlikeliness reward lowers the reward of a likely
    sample: within each group of G rows ranked by the policy's likelihood (rank 0 = least likely,
    G − 1 = most likely),

        r̃_i = r_i · (1 − β_rank · rank_i / G)

    so of two correct samples the less likely one gets the larger reward (an incorrect one keeps
    0), and A = GRPO(r̃). Equal to the authors' release (AndreHe02/rewarding-unlikely-release
    ca1cff05, ``RayLeanTrainer._compute_advantages`` with ``lean.rank_penalty``): the likelihood is
    the mean per-token log π_old of the completion, ranks are over the whole group, the std is the
    sample std (G − 1) and ε = 1e-6. Departures: a group whose r̃ are all equal gets exactly 0 (as
    ``grpo``; the release gives a group of one row its r̃, with mean 0 and std 1), and ties in
    likelihood rank by row order (the release's ``argsort`` leaves them unspecified).

    Args:
        rewards: ``(B,)`` rewards (binary in the paper; any value is scaled the same way).
        group_ids: ``(B,)`` integer group of each row.
        mean_logprobs: ``(B,)`` mean token log π_old of each row's completion (the module passes it).
        rank_penalty: β_rank ∈ [0, 1] (the release's name; 0.25 in the paper's runs). 0 is GRPO.
        std: ``"sample"`` (the release) or ``"population"``.
        eps: added to the std.

    Returns:
        ``(B,)`` float32 advantages.

    Example:
        >>> r = torch.tensor([1.0, 1.0, 0.0, 0.0])
        >>> unlikeliness(r, torch.zeros(4, dtype=torch.long), mean_logprobs=torch.tensor([-0.1, -2.0, -1.0, -3.0]))
        tensor([ 0.7385,  0.9847, -0.8616, -0.8616])
    """
    _check_unlikeliness(rank_penalty, std, eps)
    groups = _grouped(rewards, group_ids)
    if mean_logprobs.shape != rewards.shape:
        raise ValueError(
            f"mean_logprobs must have the shape of rewards {tuple(rewards.shape)}; got {tuple(mean_logprobs.shape)}"
        )
    r = rewards.double()
    likelihood = torch.nan_to_num(mean_logprobs.double(), nan=float("-inf"))
    out = torch.zeros_like(r)
    for rows in groups.blocks():  # (P_n, n)
        n = rows.shape[1]
        order = torch.argsort(likelihood[rows], dim=1, stable=True)  # least likely first
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(n, device=order.device).expand_as(order))
        shaped = r[rows] * (1.0 - rank_penalty * rank.double() / n)  # (P_n, n)
        out[rows] = _zscore(shaped, std, eps)
    return out.float()
