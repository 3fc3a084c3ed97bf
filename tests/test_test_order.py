"""The test suite's own order over pytest-xdist workers (tests/conftest.py): checked against the
real ``worksteal`` scheduler, so an xdist upgrade that changes its first split shows here."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from durations import DURATIONS, balanced_order, read, xdist_initial_sizes  # noqa: E402


class Worker:
    """What the scheduler sees of a worker: it is sent indices to run."""

    shutting_down = False
    gateway = SimpleNamespace(id="gw")

    def __init__(self):
        self.sent: list[int] = []

    def send_runtest_some(self, indices):
        self.sent += indices


@pytest.mark.parametrize("n, workers", [(2979, 2), (2979, 3), (10, 4), (5, 2)])
def test_each_worker_is_first_sent_the_block_balanced_order_built_for_it(n, workers):
    from xdist.scheduler.worksteal import WorkStealingScheduling

    scheduler = WorkStealingScheduling(SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"]))
    nodes = [Worker() for _ in range(workers)]
    collection = [f"t{i}" for i in range(n)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    sizes = xdist_initial_sizes(n, workers)
    starts = [sum(sizes[:i]) for i in range(workers)]
    assert [node.sent for node in nodes] == [list(range(s, s + size)) for s, size in zip(starts, sizes)]


def test_the_slow_tests_spread_over_the_workers_longest_first_and_blocks_keep_their_size():
    seconds = {f"slow{i}": 10.0 * (6 - i) for i in range(6)}  # 60, 50, ..., 10 s
    items = [f"fast{i}" for i in range(20)] + list(seconds)
    order = balanced_order(items, seconds.get, 2)
    first, second = order[:13], order[13:]
    assert sorted(order) == sorted(items) and [len(first), len(second)] == xdist_initial_sizes(26, 2) == [13, 13]
    assert first[:3] == ["slow0", "slow3", "slow4"] and second[:3] == ["slow1", "slow2", "slow5"]  # 60+30+20 vs 50+40+10
    assert all(t.startswith("fast") for t in first[3:] + second[3:])  # stealing takes a block's tail: short tests


def test_durations_file_lists_known_tests_with_seconds():
    """tests/durations.json (tests/scripts/durations.py) names tests by node id, in seconds."""
    known = json.loads(DURATIONS.read_text())
    assert known and all(isinstance(v, float) and v > 0 for v in known.values())
    assert all(k.startswith("tests/") and "::" in k for k in known)


def test_durations_script_sums_setup_call_and_teardown_and_takes_the_median_over_logs(tmp_path):
    (tmp_path / "a.log").write_text("== slowest 3 durations ==\n12.50s call     tests/a.py::t[x]\n1.00s setup    tests/a.py::t[x]\n"
                                    "3.00s call     tests/b.py::u\n")  # fmt: skip
    (tmp_path / "b.log").write_text("20.00s call     tests/a.py::t[x]\n5.00s call     tests/b.py::u\n")
    (tmp_path / "c.log").write_text("30.00s call     tests/a.py::t[x]\n")
    assert read([str(tmp_path / f"{n}.log") for n in "abc"]) == {"tests/a.py::t[x]": 20.0, "tests/b.py::u": 4.0}
