"""Rank-fault detection (lit_rlvr.ranks): one process, dead peers from /proc, and 2 gloo processes in which
one rank fails, hangs or dies while the other is told so by name.

The fits that go through it (a failing vLLM engine, a rank stuck in its weight sync, a dead DDP rank)
are in tests/integration/test_multiprocess_vllm.py and tests/integration/test_faults.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from lit_rlvr.ranks import RankGroup, RolloutRankError, dead_ranks

HOST = socket.gethostname()


def test_one_process_runs_the_operation_and_lets_its_error_through():
    def fail():
        raise ValueError("bad value")

    group = RankGroup()
    assert group.run_on_all("add", lambda: 2 + 3, timeout_s=1.0) == 5
    with pytest.raises(ValueError, match="bad value"):
        group.run_on_all("fail", fail, timeout_s=None)
    assert RankGroup.join(world_size=1).group is None  # nothing to exchange, whatever torch.distributed holds


def test_dead_ranks_names_ended_and_zombie_processes_on_this_host_only():
    ended = subprocess.Popen(["true"])
    ended.wait()  # reaped: no /proc entry left
    zombie = subprocess.Popen(["true"])  # ended, not reaped yet
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not end"
        time.sleep(0.01)
    alive = subprocess.Popen(["sleep", "30"])
    try:
        peers = [
            (HOST, os.getpid()),
            (HOST, ended.pid),
            (HOST, zombie.pid),
            (HOST, alive.pid),
            ("another-host", ended.pid),
        ]
        assert dead_ranks(peers, me=0) == [1, 2]
        assert dead_ranks(peers, me=1) == [2]  # a rank does not judge itself
    finally:
        alive.kill()
        alive.wait()
        zombie.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outcome(group: RankGroup, what: str, fn, timeout_s: float | None) -> dict:
    try:
        return {"value": group.run_on_all(what, fn, timeout_s)}
    except RolloutRankError as err:
        cause = err.__cause__
        return {"error": str(err), "cause": None if cause is None else f"{type(cause).__name__}: {cause}"}


def _rank_main(rank: int, port: int, out: str, scenario: str) -> None:
    """Rank ``rank`` of 2: join the group, run the scenario's operations, write what each returned or raised."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = RankGroup.join(world_size=2, skew_s=0.5)
    results = {"peers": group.peers, "pid": os.getpid()}

    def record() -> None:
        Path(f"{out}.rank{rank}").write_text(json.dumps(results))

    results["ok"] = _outcome(group, "ok", lambda: rank * 10, timeout_s=5.0)
    if scenario == "fail_then_die":

        def fail():
            if rank == 1:
                raise ValueError(f"engine broke on rank {rank}")
            return "fine"

        results["fail"] = _outcome(group, "hf generate", fail, timeout_s=5.0)
        record()
        if rank == 1:
            os._exit(3)  # dies inside the next operation, as under the OOM killer
        results["die"] = _outcome(group, "hf weight sync", lambda: None, timeout_s=30.0)
    else:  # stuck: rank 1 takes 4 s, rank 0 waits 0.2 s + skew 0.5 s
        results["stuck"] = _outcome(
            group, "hf weight sync", lambda: time.sleep(4.0 if rank == 1 else 0.0), timeout_s=0.2
        )
    record()
    os._exit(0)  # the group's state after a failure is undefined: no teardown collective


def _launch(tmp_path: Path, scenario: str) -> list[dict]:
    out = str(tmp_path / scenario)
    ctx = mp.start_processes(_rank_main, args=(_free_port(), out, scenario), nprocs=2, join=False, start_method="spawn")
    for p in ctx.processes:
        p.join(timeout=120)
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_failed_rank_is_named_on_every_rank_then_a_dead_one_as_dead(tmp_path):
    ranks = _launch(tmp_path, "fail_then_die")
    for rank, r in enumerate(ranks):
        assert r["ok"] == {"value": rank * 10}  # success: each rank its own value
        assert r["peers"] == [[HOST, ranks[0]["pid"]], [HOST, ranks[1]["pid"]]]  # every rank knows every rank's process
        assert r["fail"]["error"] == "hf generate failed on rank 1 of 2: rank 1: ValueError: engine broke on rank 1"
    assert ranks[1]["fail"]["cause"] == "ValueError: engine broke on rank 1"  # the failing rank keeps its own exception
    assert ranks[0]["fail"]["cause"] is None
    assert ranks[0]["die"]["error"].startswith(
        "hf weight sync: rank 1 of 2 died (its process ended: a crash, the OOM killer"
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_stuck_rank_is_named_within_its_timeout_plus_the_skew(tmp_path):
    ranks = _launch(tmp_path, "stuck")
    assert ranks[0]["ok"] == {"value": 0}
    error = ranks[0]["stuck"]["error"]
    assert error.startswith(
        "hf weight sync: not every rank of 2 finished within 0.7 s (the operation's timeout + 0.5 s)"
    ), error
    assert "Ranks 1 failed to pass monitoredBarrier" in error
