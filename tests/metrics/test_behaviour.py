"""Multi-turn behaviour metrics: the functional core against a reference written out by hand, the
torchmetrics shells against the functional core over several updates, and their edge cases."""

from __future__ import annotations

import random

import pytest
import torch

from lit_rlvr.functional.metrics import TURN_HISTOGRAM_BINS, behaviour_means, behaviour_sums, distinct_tool_sequences
from lit_rlvr.metrics import DistinctToolSequences, TurnBehaviour, ValidationPanel


def trajectories(seed: int, B: int, max_turns: int):
    """B random trajectories: (turns, tool calls, failed calls, environment failed, their call sequences)."""
    rng = random.Random(seed)
    out = []
    for _ in range(B):
        failed = rng.random() < 0.1
        turns = 0 if failed and rng.random() < 0.5 else rng.randint(1, max_turns)
        calls = [rng.choice(["SELECT 1", "SELECT 2", "3+4"]) for _ in range(rng.randint(0, max(turns - 1, 0)))]
        out.append((turns, calls, rng.randint(0, len(calls)), failed))
    return out


def reference(rows, max_turns: int) -> dict[str, float]:
    """The behaviour, counted one trajectory at a time."""
    B = len(rows)
    ref = {
        "turns": sum(r[0] for r in rows) / B,
        "tool_calls": sum(len(r[1]) for r in rows) / B,
        "tool_errors": sum(r[2] for r in rows) / B,
        "env_failed": sum(r[3] for r in rows) / B,
        "single_turn": sum(r[0] == 1 for r in rows) / B,
    }
    last = TURN_HISTOGRAM_BINS  # the histogram's last possible bin counts its turns or more
    ref.update({f"turns_{t}": sum(r[0] == t for r in rows) / B for t in range(1, min(max_turns + 1, last))})
    if max_turns >= last:
        ref[f"turns_{last}_plus"] = sum(r[0] >= last for r in rows) / B
    return ref


def tensors(rows):
    return (
        torch.tensor([r[0] for r in rows]),
        torch.tensor([len(r[1]) for r in rows]),
        torch.tensor([r[2] for r in rows]),
        torch.tensor([r[3] for r in rows]),
    )


@pytest.mark.parametrize("seed,B,max_turns", [(0, 1, 1), (1, 7, 3), (2, 40, 5), (3, 16, 2), (4, 60, 16), (5, 80, 100)])
def test_the_functional_core_matches_counting_by_hand(seed, B, max_turns):
    rows = trajectories(seed, B, max_turns)
    got = {k: float(v) for k, v in behaviour_means(behaviour_sums(*tensors(rows), max_turns)).items()}
    assert got == pytest.approx(reference(rows, max_turns), rel=1e-12)
    groups = [[tuple(r[1]) for r in rows[g : g + 4]] for g in range(0, B, 4)]
    assert distinct_tool_sequences(groups).tolist() == [len(set(g)) for g in groups]


def test_the_shells_over_several_updates_equal_the_core_over_all_the_data():
    rows = trajectories(5, 30, 4)
    metric, distinct = TurnBehaviour(max_turns=4), DistinctToolSequences()
    for lo, hi in ((0, 7), (7, 8), (8, 30)):
        metric.update(*tensors(rows[lo:hi]))
        distinct.update([[tuple(r[1]) for r in rows[lo:hi]]])
    assert {k: float(v) for k, v in metric.compute().items()} == pytest.approx(reference(rows, 4), rel=1e-12)
    assert float(distinct.compute()) == pytest.approx(
        sum(len({tuple(r[1]) for r in rows[lo:hi]}) for lo, hi in ((0, 7), (7, 8), (8, 30))) / 3
    )


def test_a_large_turn_limit_logs_a_bounded_histogram():
    """2,000 turns once gave 2,033 logged (and CSV) columns: the tail is one bin, whatever the limit."""
    rows = [(t, [], 0, False) for t in (1, 2, 15, 16, 17, 99, 2000)]
    for metric in (TurnBehaviour(max_turns=2000), TurnBehaviour(max_turns=100)):
        metric.update(*tensors([r for r in rows if r[0] <= metric.max_turns]))
        names = list(metric.compute())
        assert len(names) == 5 + TURN_HISTOGRAM_BINS and names[-1] == "turns_16_plus" and "turns_15" in names
    assert float(metric.compute()["turns_16_plus"]) == pytest.approx(3 / 6)


def test_edge_cases_no_trajectory_and_bad_shapes():
    empty = behaviour_means(
        behaviour_sums(*(torch.zeros(0, dtype=torch.long),) * 3, torch.zeros(0, dtype=torch.bool), max_turns=2)
    )
    assert all(torch.isnan(v) for v in empty.values()) and sorted(empty) == sorted(reference([(1, [], 0, False)], 2))
    assert distinct_tool_sequences([[(), ()], [("a",), ()]]).tolist() == [1, 2]  # no call is one behaviour
    with pytest.raises(ValueError, match="max_turns=2 must be >= 1 and >= every trajectory's turns"):
        behaviour_sums(torch.tensor([3]), torch.tensor([0]), torch.tensor([0]), torch.tensor([False]), max_turns=2)
    with pytest.raises(ValueError, match="must all be \\(B,\\)"):
        behaviour_sums(torch.tensor([1, 1]), torch.tensor([0]), torch.tensor([0]), torch.tensor([False]), max_turns=2)


def test_a_multi_turn_panel_reports_the_behaviour_and_asks_for_it():
    panel = ValidationPanel(n=2, max_turns=3)
    rows = trajectories(9, 4, 3)
    correct = torch.tensor([[True, False], [False, False]])
    args = dict(answers=[["1", "2"], [None, "3"]], texts=[["a", "b"], ["c", "d"]], rewards=correct.flatten().float())
    panel.update(
        correct,
        **args,
        behaviour=tensors(rows),
        tool_sequences=[[tuple(r[1]) for r in rows[:2]], [tuple(r[1]) for r in rows[2:]]],
    )
    values = {k: float(v) for k, v in panel.compute().items()}
    assert {k: values[k] for k in reference(rows, 3)} == pytest.approx(reference(rows, 3))
    assert "distinct_tool_sequences" in values and values["pass@1"] == 0.25
    with pytest.raises(ValueError, match="reports multi-turn behaviour: update it with behaviour and tool_sequences"):
        panel.update(correct, **args)
    assert "turns" not in ValidationPanel(n=2).compute()  # single-turn panels have no behaviour metrics
