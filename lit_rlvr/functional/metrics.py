"""Evaluation metrics as pure functions: pass@k ladders, maj@k, and diversity-collapse signals.

The :mod:`lit_rlvr.metrics` classes are thin ``torchmetrics.Metric`` shells over these (CONTRIBUTING.md, "A functional core in thin shells"):
each function below returns per-prompt (or per-group) values whose sums are the metric states, so
distributed reduction is a plain sum.

- pass@k: unbiased per-prompt estimate of Chen et al. 2021 ("Evaluating Large Language Models
  Trained on Code", Eq. 1), averaged over prompts; see :func:`lit_rlvr.functional.pass_at_k`.
- pass^k: the unbiased chance that k samples are all correct, C(c, k)/C(n, k) (τ-bench, arXiv
  2406.12045; docs/methods.md §4.5), averaged over prompts; see :func:`lit_rlvr.functional.passk.pass_hat_k`.
- maj@k: majority vote over final answers (Wang et al. 2023, "Self-Consistency Improves Chain of
  Thought Reasoning", arXiv 2203.11171) on the first k samples of each prompt. Samples are i.i.d.,
  so the first k are a uniform draw of k, and the per-prompt value is an unbiased (if noisier than
  an all-subsets average) estimate of maj@k.
- Diversity signals (docs/methods.md §4): distinct final answers, distinct correct answers and distinct
  completions per group; share of zero-variance groups; mean token entropy.

Answers are canonical keys (strings already normalised by the reward's own equivalence);
``None`` means the completion had no extractable answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lit_rlvr.functional.passk import pass_at_k, pass_hat_k

Answers = Sequence[Sequence["str | None"]]


def check_ks(k: Sequence[int], name: str) -> tuple[int, ...]:
    """Validate a ladder of budgets: positive ints, no duplicates. Returns it as a tuple.

    Example:
        >>> check_ks([1, 4], "PassAtK")
        (1, 4)
    """
    ks = tuple(k)
    if not ks or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in ks):
        raise ValueError(f"{name}: k must be a non-empty sequence of ints >= 1, got {k!r}")
    if len(set(ks)) != len(ks):
        raise ValueError(f"{name}: k has duplicate budgets, got {k!r}")
    return ks


def pass_k_ladder(n: int) -> list[int]:
    """The budgets a validation set reports: 1, 2, 4, … up to ``n``, and ``n`` itself.

    Example:
        >>> pass_k_ladder(32), pass_k_ladder(12), pass_k_ladder(1)
        ([1, 2, 4, 8, 16, 32], [1, 2, 4, 8, 12], [1])
    """
    if n < 1:
        raise ValueError(f"pass_k_ladder needs n >= 1 samples per prompt, got {n}")
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks + ([n] if ks[-1] != n else [])


def _check_k_le_n(ks: tuple[int, ...], n_min: int, name: str) -> None:
    if max(ks) > n_min:
        raise ValueError(
            f"{name}: k={max(ks)} exceeds n={n_min} samples per prompt; every k must be <= n "
            f"(got k={ks}). Draw more samples or drop the larger budgets."
        )


def _binary(correct: Tensor, name: str) -> Tensor:
    """``correct (P, n)`` bool or 0/1 → bool, with a specific error otherwise."""
    if not isinstance(correct, Tensor) or correct.dim() != 2:
        shape = tuple(correct.shape) if isinstance(correct, Tensor) else type(correct).__name__
        raise ValueError(f"{name}: correct must be a (P, n) tensor, got {shape}")
    if correct.dtype != torch.bool:
        if correct.numel() and not ((correct == 0) | (correct == 1)).all():
            raise ValueError(f"{name}: correct must be bool or 0/1, got values {correct.unique().tolist()[:8]}")
        correct = correct.bool()
    return correct


def correct_counts(
    correct: Tensor | None = None, *, num_correct: Tensor | None = None, n: int | Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Normalise the two input forms of pass@k to per-prompt counts.

    Args:
        correct: ``(P, n)`` bool or 0/1, one row of samples per prompt.
        num_correct: ``(P,)`` correct samples per prompt (instead of ``correct``).
        n: samples per prompt with ``num_correct``: an int or an ``(P,)`` tensor.

    Returns:
        ``(c, n)``, both ``(P,)`` long.

    Example:
        >>> correct_counts(torch.tensor([[1, 0, 1], [0, 0, 0]]))
        (tensor([2, 0]), tensor([3, 3]))
        >>> correct_counts(num_correct=torch.tensor([2, 0]), n=3)
        (tensor([2, 0]), tensor([3, 3]))
    """
    if (correct is None) == (num_correct is None):
        raise ValueError("pass@k: give exactly one of `correct` (P, n) or `num_correct` (P,) with `n`")
    if correct is not None:
        if n is not None:
            raise ValueError(f"pass@k: `n` is implied by correct's shape; got n={n} as well")
        correct = _binary(correct, "pass@k")
        P, N = correct.shape
        return correct.sum(1, dtype=torch.int32).long(), torch.full((P,), N, dtype=torch.long, device=correct.device)
    if n is None:
        raise ValueError("pass@k: `num_correct` needs `n`, the number of samples per prompt")
    c = torch.as_tensor(num_correct)
    if c.dim() != 1 or c.is_floating_point() and not (c == c.round()).all():
        raise ValueError(f"pass@k: num_correct must be a (P,) tensor of integer counts, got {c}")
    n_t = torch.as_tensor(n, device=c.device).long().expand_as(c)
    c = c.long()
    if ((c < 0) | (c > n_t)).any():
        i = int(((c < 0) | (c > n_t)).nonzero()[0])
        raise ValueError(f"pass@k: need 0 <= num_correct <= n; got num_correct={int(c[i])}, n={int(n_t[i])}")
    return c, n_t.contiguous()


def valid_pass_at_k_sums(
    correct: Tensor, valid: Tensor, k: Sequence[int], per_prompt: Callable[..., Tensor] | None = None
) -> tuple[Tensor, Tensor]:
    """Sums of the unbiased pass@k over prompts counting only their valid samples (a trajectory whose
    environment failed is left out, not counted a miss), and how many prompts each budget counts.

    Args:
        correct: ``(P, n)`` bool or 0/1.
        valid: ``(P, n)`` bool, the samples that count.
        k: budgets; for budget k only prompts with at least k valid samples count.
        per_prompt: the per-prompt estimator, ``(num_correct, n, k) -> (P, K)``: None is
            :func:`per_prompt_pass_at_k`, :func:`per_prompt_pass_hat_k` gives pass^k's sums.

    Returns:
        ``(sums (K,), prompts (K,))`` float64: Σ over the counted prompts of pass@k[j], and their number.

    Example:
        >>> c = torch.tensor([[1, 0, 0], [0, 1, 0]])
        >>> valid_pass_at_k_sums(c, torch.tensor([[True, True, False], [True, True, True]]), [1, 3])
        (tensor([0.8333, 1.0000], dtype=torch.float64), tensor([2., 1.], dtype=torch.float64))
    """
    ks = check_ks(k, "pass@k")
    if correct.shape != valid.shape or correct.dim() != 2:
        raise ValueError(
            f"pass@k: correct and valid must both be (P, n); got {tuple(correct.shape)} and {tuple(valid.shape)}"
        )
    per_prompt = per_prompt or per_prompt_pass_at_k
    valid = valid.bool()
    c, n = (_binary(correct, "pass@k").bool() & valid).sum(1), valid.sum(1)
    sums, prompts = torch.zeros(len(ks), dtype=torch.float64), torch.zeros(len(ks), dtype=torch.float64)
    for j, kj in enumerate(ks):
        rows = n >= kj
        if rows.any():
            sums[j] = per_prompt(c[rows], n[rows], [kj])[:, 0].sum().cpu()
            prompts[j] = float(rows.sum())
    return sums, prompts


def per_prompt_pass_at_k(num_correct: Tensor, n: Tensor, k: Sequence[int]) -> Tensor:
    """Unbiased pass@k of every prompt for a ladder of budgets.

    Prompts are grouped by their n, so each (n, k) pair uses ``pass_at_k``'s scalar fast path
    (one cumulative-sum table of length n + 1, then a gather).

    Args:
        num_correct: ``(P,)`` correct samples per prompt.
        n: ``(P,)`` samples per prompt (may differ between prompts).
        k: budgets, each <= min(n).

    Returns:
        ``(P, K)`` float64, column j is pass@k[j].

    Raises:
        ValueError: when a budget exceeds the smallest n, naming both.

    Example:
        >>> per_prompt_pass_at_k(torch.tensor([1, 0]), torch.tensor([4, 4]), [1, 2])
        tensor([[0.2500, 0.5000],
                [0.0000, 0.0000]], dtype=torch.float64)
    """
    ks = check_ks(k, "pass@k")
    device = num_correct.device
    num_correct, n = num_correct.cpu(), n.cpu()  # pass_at_k builds its tables on the CPU
    out = torch.empty(num_correct.shape[0], len(ks), dtype=torch.float64)
    if num_correct.numel() == 0:
        return out.to(device)
    _check_k_le_n(ks, int(n.min()), "pass@k")
    n_values = n.unique()
    for n_val in n_values.tolist():
        rows = None if len(n_values) == 1 else n == n_val
        c = num_correct if rows is None else num_correct[rows]
        col = torch.stack([pass_at_k(int(n_val), c, kj) for kj in ks], dim=1)  # (P_n, K)
        if rows is None:
            out = col
        else:
            out[rows] = col
    return out.to(device)


def per_prompt_pass_hat_k(num_correct: Tensor, n: Tensor, k: Sequence[int]) -> Tensor:
    """pass^k of every prompt, C(c, k)/C(n, k), for a ladder of budgets (docs/methods.md §4.5).

    Args:
        num_correct: ``(P,)`` correct samples per prompt.
        n: ``(P,)`` samples per prompt (may differ between prompts).
        k: budgets, each <= min(n).

    Returns:
        ``(P, K)`` float64, column j is pass^k[j].

    Raises:
        ValueError: when a budget exceeds the smallest n, naming both.

    Example:
        >>> per_prompt_pass_hat_k(torch.tensor([3, 1]), torch.tensor([4, 4]), [1, 2])
        tensor([[0.7500, 0.5000],
                [0.2500, 0.0000]], dtype=torch.float64)
    """
    ks = check_ks(k, "pass^k")
    if num_correct.numel() == 0:
        return torch.empty(0, len(ks), dtype=torch.float64, device=num_correct.device)
    _check_k_le_n(ks, int(n.min()), "pass^k")
    return torch.stack([pass_hat_k(n, num_correct, kj) for kj in ks], dim=1)


def pass_at_k_curve(
    correct: Tensor | None = None,
    *,
    num_correct: Tensor | None = None,
    n: int | Tensor | None = None,
    k: Sequence[int] = (1, 2, 4, 8, 16),
) -> dict[str, Tensor]:
    """Mean over prompts of the unbiased pass@k, for a ladder of budgets.

    Args:
        correct: ``(P, n)`` bool or 0/1 per sample; or give ``num_correct`` and ``n``.
        num_correct: ``(P,)`` correct samples per prompt.
        n: samples per prompt (int or ``(P,)``), only with ``num_correct``.
        k: budgets, each <= n.

    Returns:
        ``{"pass@1": tensor, ...}`` float64 scalars.

    Example:
        >>> pass_at_k_curve(torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]]), k=(1, 2))
        {'pass@1': tensor(0.3750, dtype=torch.float64), 'pass@2': tensor(0.6667, dtype=torch.float64)}
    """
    ks = check_ks(k, "pass@k")
    c, n_t = correct_counts(correct, num_correct=num_correct, n=n)
    mean = per_prompt_pass_at_k(c, n_t, ks).mean(0)
    return {f"pass@{kj}": mean[j] for j, kj in enumerate(ks)}


def _majority_prefix_correct(answers: Sequence[str | None], correct: Sequence[bool], upto: int) -> list[bool]:
    """Whether the majority answer of the first m samples is correct, for m = 1..upto.

    The leader is the answer with the most votes, ties going to the earliest first occurrence;
    adding one vote can only promote the voted answer, so the leader is updated in O(1) per sample.
    """
    votes: dict[str, int] = {}
    first: dict[str, int] = {}
    leader: str | None = None
    out = []
    for i in range(upto):
        a = answers[i]
        if a is not None:
            if a not in votes:
                votes[a], first[a] = 0, i
            votes[a] += 1
            if leader is None or votes[a] > votes[leader] or (votes[a] == votes[leader] and first[a] < first[leader]):
                leader = a
        out.append(leader is not None and bool(correct[first[leader]]))
    return out


def _check_answers(answers: Answers, correct: Tensor, name: str) -> list[list[bool]]:
    correct = _binary(correct, name)
    P, N = correct.shape
    if len(answers) != P or any(len(row) != N for row in answers):
        lens = sorted({len(row) for row in answers})
        raise ValueError(
            f"{name}: answers must be P={P} lists of n={N} keys like correct; "
            f"got {len(answers)} lists of lengths {lens}"
        )
    return correct.tolist()


def per_prompt_majority_at_k(answers: Answers, correct: Tensor, k: Sequence[int]) -> Tensor:
    """maj@k of every prompt: is the majority answer of its first k samples correct?

    Votes go to final-answer keys; ``None`` (no answer) never votes, so it wins only when all k
    samples are ``None``, which counts as incorrect. Ties go to the answer seen first. The majority
    answer's correctness is that of its first sample.

    Args:
        answers: P lists of n canonical answer keys (``None`` = no answer).
        correct: ``(P, n)`` bool or 0/1, correctness of each sample.
        k: budgets, each <= n.

    Returns:
        ``(P, K)`` float64 of 0/1.

    Example:
        >>> answers = [["7", "5", "5", None], ["2", "3", "3", "2"]]
        >>> correct = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 1]])
        >>> per_prompt_majority_at_k(answers, correct, (1, 3, 4))  # prompt 2 at k=4: "2" ties "3", seen first
        tensor([[1., 0., 0.],
                [1., 0., 1.]], dtype=torch.float64)
    """
    ks = check_ks(k, "maj@k")
    rows = _check_answers(answers, correct, "maj@k")
    if not rows:
        return torch.empty(0, len(ks), dtype=torch.float64)
    _check_k_le_n(ks, len(rows[0]), "maj@k")
    idx = [kj - 1 for kj in ks]
    table = [_majority_prefix_correct(a, c, max(ks)) for a, c in zip(answers, rows)]
    return torch.tensor([[t[i] for i in idx] for t in table], dtype=torch.float64)


def majority_at_k(answers: Answers, correct: Tensor, k: Sequence[int] = (1, 4, 8, 16)) -> dict[str, Tensor]:
    """Mean over prompts of maj@k (see :func:`per_prompt_majority_at_k`).

    Example:
        >>> majority_at_k([["a", "b", "b"], ["c", None, None]], torch.tensor([[0, 1, 1], [1, 0, 0]]), k=(1, 3))
        {'maj@1': tensor(0.5000, dtype=torch.float64), 'maj@3': tensor(1., dtype=torch.float64)}
    """
    ks = check_ks(k, "maj@k")
    mean = per_prompt_majority_at_k(answers, correct, ks).mean(0)
    return {f"maj@{kj}": mean[j] for j, kj in enumerate(ks)}


def distinct_answers(answers: Answers) -> Tensor:
    """Distinct final answers in each group (``None`` = no answer is not counted).

    Args:
        answers: P groups of answer keys (groups may differ in size).

    Returns:
        ``(P,)`` long.

    Example:
        >>> distinct_answers([["1", "1", "2", None], [None, None]])
        tensor([2, 0])
    """
    return torch.tensor([len({a for a in row if a is not None}) for row in answers], dtype=torch.long)


def distinct_correct_answers(answers: Answers, correct: Tensor) -> Tensor:
    """Distinct final answers among the correct samples of each group.

    With a strict canonicalisation this is at most 1 for single-answer tasks; it exceeds 1 where
    several surface forms (e.g. SQL queries with equal results) are all judged correct.

    Args:
        answers: P lists of n answer keys (``None`` = no answer, never counted).
        correct: ``(P, n)`` bool or 0/1.

    Returns:
        ``(P,)`` long.

    Example:
        >>> distinct_correct_answers([["x", "y", "z"], ["x", "x", None]], torch.tensor([[1, 1, 0], [1, 1, 1]]))
        tensor([2, 1])
    """
    rows = _check_answers(answers, correct, "distinct_correct_answers")
    return torch.tensor(
        [len({a for a, c in zip(ans, row) if c and a is not None}) for ans, row in zip(answers, rows)],
        dtype=torch.long,
    )


def distinct_completions(completions: Sequence[Sequence[str]]) -> Tensor:
    """Distinct completion texts (exact string match) in each group.

    Args:
        completions: P groups of completion texts.

    Returns:
        ``(P,)`` long.

    Example:
        >>> distinct_completions([["SELECT 1", "SELECT 1", "select 1"], ["a"]])
        tensor([2, 1])
    """
    return torch.tensor([len(set(row)) for row in completions], dtype=torch.long)


def zero_variance_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Which groups have all-equal rewards (and so zero group-normalised advantage, DAPO §3.2).

    Args:
        rewards: ``(B,)`` rewards.
        group_ids: ``(B,)`` group of each row, any ids, any order, any group sizes.

    Returns:
        ``(G,)`` bool over the sorted unique group ids; a group of one row counts as zero-variance.

    Example:
        >>> zero_variance_groups(torch.tensor([1., 1., 0., 1., 0., 0.]), torch.tensor([5, 5, 2, 2, 9, 9]))
        tensor([False,  True,  True])
    """
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(
            f"rewards and group_ids must both be (B,); got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    ids, inv = group_ids.unique(return_inverse=True)
    r = rewards.double()
    hi = torch.full((len(ids),), -torch.inf, dtype=torch.float64, device=r.device).scatter_reduce(0, inv, r, "amax")
    lo = torch.full((len(ids),), torch.inf, dtype=torch.float64, device=r.device).scatter_reduce(0, inv, r, "amin")
    return hi == lo


def mixed_reward_rows(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``(B,)`` bool: rows of groups whose rewards are not all equal (DAPO's dynamic sampling keeps these).

    Example:
        >>> mixed_reward_rows(torch.tensor([1., 1., 0., 1., 0., 0.]), torch.tensor([5, 5, 2, 2, 9, 9]))
        tensor([False, False,  True,  True, False, False])
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return ~zero_variance_groups(rewards, group_ids)[inverse]


def masked_entropy_sum(entropy: Tensor, loss_tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Sum of per-token entropy over ``loss_tokens``, and their count (the metric states).

    Padding positions are ignored even if they hold non-finite values.

    Args:
        entropy: ``(B, T)`` per-token entropy of the sampling distribution.
        loss_tokens: ``(B, T)`` the tokens the loss reads (``StepData.loss_tokens``).

    Returns:
        ``(sum, count)``, float64 scalars.

    Example:
        >>> masked_entropy_sum(torch.tensor([[1.0, 3.0], [2.0, float("nan")]]), torch.tensor([[1, 1], [1, 0]]))
        (tensor(6., dtype=torch.float64), tensor(3., dtype=torch.float64))
    """
    if entropy.shape != loss_tokens.shape:
        raise ValueError(
            "entropy and loss_tokens must have the same (B, T) shape; "
            f"got {tuple(entropy.shape)} and {tuple(loss_tokens.shape)}"
        )
    mask = loss_tokens.bool()
    return torch.where(mask, entropy.double(), 0.0).sum(), mask.sum().double()


def mean_token_entropy(entropy: Tensor, loss_tokens: Tensor) -> Tensor:
    """Mean entropy over all ``loss_tokens`` of the batch (token-weighted; nan if none).

    Example:
        >>> mean_token_entropy(torch.tensor([[1.0, 3.0], [2.0, 9.0]]), torch.tensor([[1, 1], [1, 0]]))
        tensor(2., dtype=torch.float64)
    """
    total, count = masked_entropy_sum(entropy, loss_tokens)
    return total / count


# ------------------------------------------------------------------ multi-turn behaviour (docs/agents.md)
BEHAVIOUR_SUMS = ("trajectories", "turns", "tool_calls", "tool_errors", "env_failed")
"""The leading entries of :func:`behaviour_sums`; the turn histogram's counts follow."""

TURN_HISTOGRAM_BINS = 16
"""The turn histogram's most bins: t = 1 … 15 turns, then one bin (``turns_16_plus``) for 16 or more, so
that a large ``max_turns`` cannot add a logged column (and a CSV column) per turn."""


def behaviour_sums(
    turns: Tensor, tool_calls: Tensor, tool_errors: Tensor, env_failed: Tensor, max_turns: int
) -> Tensor:
    """What B multi-turn trajectories did, as sums (the states of :class:`~lit_rlvr.metrics.TurnBehaviour`).

    The behaviour whose collapse agents show under RL ("collapses to single-turn answers": VerlTool,
    arXiv 2509.01055): how many turns a trajectory takes, how many tools it calls, how many fail.

    Args:
        turns: ``(B,)`` the model's turns of each trajectory (0: its environment failed at reset).
        tool_calls: ``(B,)`` tool calls of each.
        tool_errors: ``(B,)`` failed tool calls of each.
        env_failed: ``(B,)`` bool, its environment raised or hung (the trajectory is not trained on).
        max_turns: the loop's turn limit: the histogram has ``min(max_turns, TURN_HISTOGRAM_BINS)``
            bins, the last of :data:`TURN_HISTOGRAM_BINS` counting that many turns or more.

    Returns:
        ``(5 + bins,)`` float64: :data:`BEHAVIOUR_SUMS` (B, Σ turns, Σ tool calls, Σ tool
        errors, environment failures), then the trajectories with exactly t turns, t = 1 … bins
        (at most :data:`TURN_HISTOGRAM_BINS`: its last bin counts t ≥ that many).

    Example:
        >>> behaviour_sums(torch.tensor([1, 3, 2]), torch.tensor([0, 2, 1]), torch.tensor([0, 1, 0]),
        ...                torch.tensor([False, False, True]), max_turns=3)
        tensor([3., 6., 3., 1., 1., 1., 1., 1.], dtype=torch.float64)
        >>> behaviour_sums(torch.tensor([1, 16, 40]), torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.bool),
        ...                max_turns=100).shape  # 15 bins of exactly t turns, one of 16 or more
        torch.Size([21])
    """
    if not turns.shape == tool_calls.shape == tool_errors.shape == env_failed.shape or turns.dim() != 1:
        raise ValueError(
            f"behaviour_sums: turns, tool_calls, tool_errors and env_failed must all be (B,); got "
            f"{[tuple(t.shape) for t in (turns, tool_calls, tool_errors, env_failed)]}"
        )
    if max_turns < 1 or (turns.numel() and int(turns.max()) > max_turns):
        raise ValueError(f"behaviour_sums: max_turns={max_turns} must be >= 1 and >= every trajectory's turns")
    head = torch.stack(
        [
            torch.tensor(float(turns.numel()), dtype=torch.float64),
            turns.double().sum(),
            tool_calls.double().sum(),
            tool_errors.double().sum(),
            env_failed.double().sum(),
        ]
    )
    bins = min(max_turns, TURN_HISTOGRAM_BINS)
    histogram = torch.bincount(turns.long().cpu().clamp(max=bins), minlength=bins + 1)[1:].double()  # (bins,)
    return torch.cat([head.cpu(), histogram])


def behaviour_means(sums: Tensor) -> dict[str, Tensor]:
    """The logged behaviour from :func:`behaviour_sums` (of one batch, or summed over batches and ranks).

    Returns:
        ``turns`` (mean turns per trajectory), ``tool_calls`` and ``tool_errors`` (means per
        trajectory), ``env_failed`` (share whose environment failed), ``single_turn`` (share with
        exactly one turn), and ``turns_<t>`` (share with exactly t turns: the histogram; its bin
        :data:`TURN_HISTOGRAM_BINS`, when it has that many, is ``turns_16_plus``, 16 turns or more). NaN
        with no trajectory.

    Example:
        >>> means = behaviour_means(torch.tensor([4., 6., 2., 1., 0., 2., 1., 1.], dtype=torch.float64))
        >>> {k: float(v) for k, v in means.items()}  # doctest: +NORMALIZE_WHITESPACE
        {'turns': 1.5, 'tool_calls': 0.5, 'tool_errors': 0.25, 'env_failed': 0.0, 'single_turn': 0.5,
         'turns_1': 0.5, 'turns_2': 0.25, 'turns_3': 0.25}
    """
    B = sums[0]
    means = {name: sums[i] / B for i, name in enumerate(BEHAVIOUR_SUMS) if i}
    means["single_turn"] = sums[len(BEHAVIOUR_SUMS)] / B
    bins = len(sums) - len(BEHAVIOUR_SUMS)
    if bins > TURN_HISTOGRAM_BINS:
        raise ValueError(f"behaviour_means: {bins} histogram bins, more than TURN_HISTOGRAM_BINS={TURN_HISTOGRAM_BINS}")
    for t in range(1, bins + 1):
        name = f"turns_{t}_plus" if t == TURN_HISTOGRAM_BINS else f"turns_{t}"
        means[name] = sums[len(BEHAVIOUR_SUMS) + t - 1] / B
    return means


def distinct_tool_sequences(sequences: Sequence[Sequence[Sequence[str]]]) -> Tensor:
    """Distinct tool-call sequences in each group: how many behaviours a prompt's trajectories show.

    A trajectory's sequence is its tool calls in order (the empty sequence, no call, counts as one
    behaviour): a group that collapsed onto one way of using the tools has 1.

    Args:
        sequences: P groups, each of its trajectories' tool-call sequences.

    Returns:
        ``(P,)`` long.

    Example:
        >>> distinct_tool_sequences([[("a",), ("a",), ()], [("b", "c"), ("c", "b")]])
        tensor([2, 2])
    """
    return torch.tensor([len({tuple(s) for s in group}) for group in sequences], dtype=torch.long)
