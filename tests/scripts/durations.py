"""The test suite's order over pytest-xdist workers, and tests/durations.json that it reads.

    python tests/scripts/durations.py LOG [LOG ...]   # write tests/durations.json: per test, the median over the logs

``make test`` prints its slowest tests (``--durations``); their seconds order the suite over the
workers (tests/conftest.py calls ``balanced_order``). A stale or missing entry costs balance,
never a result.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

# Seconds a test takes, for the order: the slowest tests' times from `make test`'s --durations
# output (tests/durations.json, written by this script), else a guess
DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
GUESS_SLOW_S, GUESS_FAST_S = 10.0, 0.15


def xdist_initial_sizes(n: int, workers: int) -> list[int]:
    """How many of ``n`` tests each of ``workers`` idle workers is first sent by pytest-xdist's
    ``worksteal`` scheduler: contiguous blocks, ``len(pending) // workers_remaining`` each."""
    sizes = []
    for i in range(workers):
        sizes.append((n - sum(sizes)) // (workers - i))
    return sizes


def balanced_order(items: list, seconds, workers: int) -> list:
    """``items`` reordered for ``workers`` worksteal workers: the slow tests spread over the
    workers' first blocks, longest first (greedy: each to the worker with the least time so far),
    every block then filled with fast tests to the size xdist sends it. Stealing takes from a
    block's tail, so what moves between workers at the end are short tests, and no worker ends
    the run alone with a queue of long ones.

        >>> balanced_order(list("abcdefgh"), {"a": 9, "b": 8, "c": 1}.get, 2)
        ['a', 'd', 'e', 'f', 'b', 'c', 'g', 'h']
    """
    sizes = xdist_initial_sizes(len(items), workers)
    long_first = sorted(items, key=lambda item: -(seconds(item) or 0.0))
    blocks, load = [[] for _ in sizes], [0.0] * len(sizes)
    slow = [item for item in long_first if seconds(item)]
    for item in slow:
        open_ = [i for i in range(len(sizes)) if len(blocks[i]) < sizes[i]]
        i = min(open_, key=lambda i: load[i])
        blocks[i].append(item)
        load[i] += seconds(item)
    rest = iter([item for item in items if not seconds(item)])
    for i, block in enumerate(blocks):
        block += [next(rest) for _ in range(sizes[i] - len(block))]
    return [item for block in blocks for item in block]




def known() -> dict[str, float]:
    """tests/durations.json, ``{}`` when absent."""
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S.*?)\s*$")


def read(logs: list[str]) -> dict[str, float]:
    """``{nodeid: seconds}``: setup + call + teardown in each log, the median over logs."""
    per_log = []
    for log in logs:
        seconds: dict[str, float] = defaultdict(float)
        for line in Path(log).read_text(errors="replace").splitlines():
            if m := LINE.match(line):
                seconds[m[2]] += float(m[1])
        per_log.append(seconds)
    ids = {i for s in per_log for i in s}
    return {i: round(statistics.median(s[i] for s in per_log if i in s), 1) for i in sorted(ids)}


if __name__ == "__main__":
    durations = read(sys.argv[1:])
    DURATIONS.write_text(json.dumps(dict(sorted(durations.items(), key=lambda kv: -kv[1])), indent=1) + "\n")
    print(f"{DURATIONS}: {len(durations)} tests, {sum(durations.values()):.0f} s")
