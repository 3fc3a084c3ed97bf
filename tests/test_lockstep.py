"""Lockstep: the passes and weights of one optimizer step, in one process and against a second rank.

A second rank is simulated by a stand-in trainer whose strategy's ``reduce`` combines this rank's
value with the next value the other rank contributes (in the order :meth:`Lockstep.plan` asks), so
what the real collectives would return is known exactly. The real multi-process runs (uneven
ranks under DDP and FSDP2) are in tests/integration/test_fsdp.py.
"""

from __future__ import annotations

import types

import pytest
import torch

from lit_rlvr.lockstep import Lockstep, StepPlan


def rows(*lengths: int, width: int = 6) -> types.SimpleNamespace:
    """Rows whose ``loss_tokens`` have these many leading ones each."""
    mask = torch.zeros(len(lengths), width)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return types.SimpleNamespace(loss_tokens=mask)


def two_ranks(*others: float) -> Lockstep:
    """A Lockstep of 2 ranks, the other rank contributing ``others`` to successive reductions."""
    queue = list(others)

    def reduce(value, reduce_op):
        assert value.device.type == "cpu" and queue, "a reduction the test did not plan for"
        other = torch.tensor(float(queue.pop(0)))
        return torch.maximum(value, other) if reduce_op == "max" else value + other

    strategy = types.SimpleNamespace(reduce=reduce, root_device=torch.device("cpu"))
    lockstep = Lockstep(types.SimpleNamespace(world_size=2, strategy=strategy))
    lockstep.pending = queue  # what the other rank still has to contribute
    return lockstep


def test_one_process_reduces_to_the_value_itself():
    lockstep = Lockstep()
    assert lockstep.world == 1
    assert lockstep.reduce(3, "sum") == 3.0 and lockstep.reduce(2.5, "max") == 2.5
    value = torch.tensor([1.0, 2.0])
    assert lockstep.reduce_tensor(value) is value
    assert lockstep.most(4) == 4


@pytest.mark.parametrize("rows_, size, steps", [(5, 2, 3), (4, 2, 2), (5, None, 1), (0, 2, 0), (0, None, 0)])
def test_optimizer_steps_in_one_process_are_the_mini_batches_of_its_rows(rows_, size, steps):
    assert Lockstep().optimizer_steps(rows_, size) == steps


def test_one_process_weights_micro_batches_by_their_share_of_the_mini_batch():
    mini = rows(3, 1, 4)
    parts = [rows(3, 1), rows(4)]
    plan = Lockstep().plan(mini, parts, "token_mean")
    assert plan == StepPlan(loss_weights=[0.5, 0.5], anchor_weights=[], filler_passes=0)
    by_rows = Lockstep().plan(mini, parts, "seq_mean_token_sum_norm")
    assert by_rows.loss_weights == pytest.approx([2 / 3, 1 / 3])


def test_one_process_weights_anchor_micro_batches_by_their_units():
    anchor = rows(2, 2, 4)
    anchors = [rows(2), rows(2, 4)]
    tokens = Lockstep().plan(rows(1), [rows(1)], "token_mean", anchor, anchors, "token")
    assert tokens.anchor_weights == pytest.approx([0.25, 0.75]) and tokens.filler_passes == 0
    sequences = Lockstep().plan(rows(1), [rows(1)], "token_mean", anchor, anchors, "sequence")
    assert sequences.anchor_weights == pytest.approx([1 / 3, 2 / 3])


def test_a_rank_with_fewer_passes_runs_fillers_to_the_most_any_rank_has():
    lockstep = two_ranks(5)
    assert lockstep.most(2) == 5 and not lockstep.pending
    lockstep = two_ranks(1)
    assert lockstep.most(3) == 3


def test_optimizer_steps_are_the_most_any_rank_needs():
    assert two_ranks(4).optimizer_steps(3, 1) == 4  # the other rank has 4 mini-batches
    assert two_ranks(0).optimizer_steps(0, 2) == 0  # no rank has a row
    assert two_ranks(1).optimizer_steps(0, 2) == 1  # this rank has none: it still steps with the other


def test_loss_weights_divide_by_the_ranks_mean_normaliser():
    """This rank has 4 tokens, the other 8: each micro-batch's weight is its tokens over the mean, 6, so
    the averaged gradient is the 12-token global batch's."""
    mini = rows(3, 1)
    lockstep = two_ranks(3, 8.0)  # the other rank: 3 passes, 8 tokens
    plan = lockstep.plan(mini, [rows(3), rows(1)], "token_mean")
    assert plan.loss_weights == pytest.approx([3 / 6, 1 / 6])
    assert plan.filler_passes == 1 and not lockstep.pending


def test_a_rank_without_rows_this_step_only_runs_fillers():
    lockstep = two_ranks(2, 5.0)
    plan = lockstep.plan(None, [], "token_mean")
    assert plan == StepPlan(loss_weights=[], anchor_weights=[], filler_passes=2) and not lockstep.pending


def test_anchor_weights_divide_by_the_ranks_mean_units_and_are_zero_without_any():
    lockstep = two_ranks(2, 4.0, 6.0)  # the other rank: 2 passes, 4 loss tokens, 6 anchor tokens
    plan = lockstep.plan(rows(4), [rows(4)], "token_mean", rows(2, 2), [rows(2, 2)], "token")
    # own units 4, the ranks' mean (4 + 6) / 2 = 5
    assert plan.loss_weights == pytest.approx([1.0]) and plan.anchor_weights == pytest.approx([4 / 5])
    assert plan.filler_passes == 0 and not lockstep.pending
    nothing = two_ranks(1, 0.0, 0.0).plan(rows(0), [rows(0)], "token_mean", rows(0), [rows(0)], "token")
    assert nothing.loss_weights == [0.0] and nothing.anchor_weights == [0.0]
