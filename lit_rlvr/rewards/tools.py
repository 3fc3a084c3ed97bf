"""Rewards that read a multi-turn trajectory's behaviour: the tool-call bonus (docs/agents.md, docs/methods.md §1.9).

A multi-turn policy can learn to skip its tools and answer at once: the turns per trajectory
collapse to one answer (docs/agents.md). verl's multi-turn GSM8K recipe met this (verl issue #1569:
the tool run did no better than the no-tool baseline, its turns collapsing to 2, the model skipping
``<tool_call>``); verl PR #4998 kept the correctness reward and added +0.1 to every trajectory that
called a tool at least once, which took validation accuracy from 0.608 to 0.717. ``tool_call`` is
that bonus as a reward term any multi-turn run adds with its weight::

    model:
      scoring:
        reward_funcs: [row, tool_call]     # each row's own reward, and the bonus
        reward_weights: [1.0, 0.1]         # verl PR #4998's +0.1
        correctness: row                   # the bonus never makes an answer correct

Registered with ``trajectory=True``, so :class:`~lit_rlvr.rewards.combine.RewardMix` gives its
rows the trajectory's ``tool_calls`` and scores it beside an environment's own reward too.
"""

from __future__ import annotations

from collections.abc import Sequence

from lit_rlvr.rewards.base import register_reward


@register_reward("tool_call", values=(0.0, 1.0), trajectory=True)
def tool_call(completion: str, answer=None, **row) -> float | None:
    """1.0 for a trajectory that called a tool at least once, 0.0 for one that did not; None (not
    applicable: left out of the weighted sum) for a single-turn completion, which has no trajectory.

    The row's ``tool_calls`` is the trajectory's :attr:`~lit_rlvr.rollout.types.Episode.tool_calls`,
    which :class:`~lit_rlvr.rewards.combine.RewardMix` puts in this reward's rows (a row field, not an
    option); a call that failed counts (verl's bonus is for a ``<tool_call>`` in the trajectory,
    whatever the tool answered).

    Example:
        >>> tool_call("3*7+5;", "26", tool_calls=("3*7+5",)), tool_call("26;", "26", tool_calls=()), tool_call("26", "26")
        (1.0, 0.0, None)
    """
    calls: Sequence[str] | None = row.get("tool_calls")
    if calls is None:
        return None
    return float(len(calls) > 0)
