"""Metrics synced over 2 gloo processes equal the single-process result over all the data."""

import socket
import sys

import pytest
import torch
import torch.distributed as dist

from lit_rlvr.functional.metrics import majority_at_k, pass_at_k_curve
from lit_rlvr.metrics import (
    DistinctToolSequences,
    MajorityAtK,
    MeanTokenEntropy,
    PassAtK,
    TurnBehaviour,
    ZeroVarianceShare,
)
from tests import processes

KS = (1, 2, 4, 8)


def shard_data(rank: int) -> dict:
    """Different prompts per rank, different numbers of updates, and different n."""
    gen = torch.Generator().manual_seed(100 + rank)
    n = 8 if rank == 0 else 12
    sizes = (5, 3) if rank == 0 else (9,)
    correct = [torch.rand(P, n, generator=gen) < torch.rand(P, 1, generator=gen) for P in sizes]
    keys = [torch.randint(0, 3, c.shape, generator=gen).tolist() for c in correct]  # 2 = no answer
    answers = [[["ab"[x] if x < 2 else None for x in row] for row in k] for k in keys]
    rewards = [c.flatten().float() for c in correct]
    group_ids = [torch.arange(c.shape[0]).repeat_interleave(c.shape[1]) for c in correct]
    entropy = torch.rand(4, 6, generator=gen)
    mask = (torch.rand(4, 6, generator=gen) < 0.7).long()
    B = 6 + 4 * rank  # multi-turn trajectories: turns in 0..3, their calls and failures
    turns = torch.randint(0, 4, (B,), generator=gen)
    calls = torch.minimum(turns, torch.randint(0, 3, (B,), generator=gen))
    behaviour = (turns, calls, torch.minimum(calls, torch.randint(0, 2, (B,), generator=gen)), turns == 0)
    sequences = [
        [tuple("ab"[int(x)] for x in torch.randint(0, 2, (int(c),), generator=gen)) for c in calls[g::2]]
        for g in range(2)
    ]
    return dict(
        correct=correct,
        answers=answers,
        rewards=rewards,
        group_ids=group_ids,
        entropy=entropy,
        mask=mask,
        behaviour=behaviour,
        sequences=sequences,
    )


def compute_all(data_by_rank: list[dict]) -> dict:
    metrics = dict(
        passk=PassAtK(k=KS),
        pass4=PassAtK(k=4),
        maj=MajorityAtK(k=KS),
        zv=ZeroVarianceShare(),
        ent=MeanTokenEntropy(),
        turns=TurnBehaviour(max_turns=3),
        tools=DistinctToolSequences(),
    )
    for data in data_by_rank:
        for c, a, r, g in zip(data["correct"], data["answers"], data["rewards"], data["group_ids"]):
            metrics["passk"].update(c)
            metrics["pass4"].update(c)
            metrics["maj"].update(a, c)
            metrics["zv"].update(r, g)
        metrics["ent"].update(data["entropy"], data["mask"])
        metrics["turns"].update(*data["behaviour"])
        metrics["tools"].update(data["sequences"])
    return {name: m.compute() for name, m in metrics.items()}


def worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.save(compute_all([shard_data(rank)]), f"{out_dir}/rank{rank}.pt")  # compute() syncs
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_process_gloo_equals_single_process(tmp_path):
    port = free_port()  # each rank: this file run as a script, forked warm (tests/processes.py)
    ranks = [processes.start_script(__file__, [str(rank), str(port), str(tmp_path)]) for rank in range(2)]
    try:
        for rank in ranks:
            assert rank.wait(100) == 0, rank.stderr[-3000:]
    finally:  # a rank that failed leaves the other waiting for it
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait(30)
    data = [shard_data(0), shard_data(1)]
    single = compute_all(data)
    # the single-process run itself matches the functional core over all prompts
    all_counts = torch.cat([c.sum(1) for d in data for c in d["correct"]])
    all_n = torch.cat([torch.full((c.shape[0],), c.shape[1]) for d in data for c in d["correct"]])
    functional = pass_at_k_curve(num_correct=all_counts, n=all_n, k=KS)
    for key in functional:
        assert single["passk"][key].item() == pytest.approx(functional[key].item(), rel=1e-13)
    assert single["pass4"].ndim == 0 and single["pass4"] == single["passk"]["pass@4"]  # the scalar form
    maj_per_update = [majority_at_k(a, c, k=KS) for d in data for a, c in zip(d["answers"], d["correct"])]
    sizes = [c.shape[0] for d in data for c in d["correct"]]
    for key in maj_per_update[0]:
        want = sum(m[key].item() * s for m, s in zip(maj_per_update, sizes)) / sum(sizes)
        assert single["maj"][key].item() == pytest.approx(want, rel=1e-13)
    for rank in range(2):
        synced = torch.load(tmp_path / f"rank{rank}.pt")
        for name in ("passk", "maj", "turns"):
            assert synced[name].keys() == single[name].keys()
            for key in single[name]:
                assert synced[name][key].item() == pytest.approx(single[name][key].item(), rel=1e-13), (rank, key)
        for name in ("pass4", "zv", "ent", "tools"):
            assert synced[name].item() == pytest.approx(single[name].item(), rel=1e-13), (rank, name)


if __name__ == "__main__":  # python test_ddp.py RANK PORT OUT_DIR: one rank of the test above
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
