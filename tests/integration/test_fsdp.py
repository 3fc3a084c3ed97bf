"""FSDP2 (ModelParallelStrategy) on CPU with 2 gloo processes: a step equals one process; weight streaming."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import processes

SCRIPT = Path(__file__).parent / "scripts" / "fsdp2_step.py"


def run_step(model_dir, out: Path, devices: int, in_process=None) -> list[dict]:
    """The script's rank files; one device through ``in_process`` (the ``script_in_process`` fixture) when given."""
    if in_process is not None:
        in_process(SCRIPT, "main", str(model_dir), str(out), devices)
    else:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        proc = processes.run_script(
            SCRIPT, [str(model_dir), str(out), str(devices)], env=env, cwd=out.parent, timeout=240
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(devices)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp2_two_processes_match_single_process(tiny_model_dir, tmp_path, script_in_process):
    (single,) = run_step(tiny_model_dir, tmp_path / "single", 1, in_process=script_in_process)
    ranks = run_step(tiny_model_dir, tmp_path / "fsdp", 2)
    assert not single["sharded"] and all(r["sharded"] for r in ranks)
    for r in ranks:  # every rank saw the same batch: same first-step loss
        assert r["losses"][0] == pytest.approx(single["losses"][0], abs=1e-5)
    for name, values in single["params"].items():  # and the same update
        assert ranks[0]["params"][name] == pytest.approx(values, abs=1e-5), name


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp2_fit_with_live_rollouts_on_two_processes(tiny_model_dir, toy_prompts, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    out = tmp_path / "fit"
    proc = processes.run_script(
        SCRIPT.with_name("fsdp2_fit.py"),
        [str(tiny_model_dir), toy_prompts(8), str(out)],
        env=env,
        cwd=tmp_path,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(2):
        result = json.loads(Path(f"{out}.rank{rank}").read_text())
        assert result["steps"] == 2 and result["loss"] == result["loss"]  # finite, not NaN
        assert result["fused"] is True  # the default fused AdamW steps sharded (DTensor) parameters


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_fsdp2_weight_stream_gathers_one_parameter_at_a_time(tmp_path):
    """What a vLLM engine receives from a sharded policy: full tensors equal to the unsharded model's
    (LoRA merged; or, for adapter-only sync, the base weights and the adapter), plain ``torch.Tensor``s
    (not DTensors), never more than one alive at a time, and the shards restored afterwards (LoRA:
    merge, stream, unmerge)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    out = tmp_path / "weights"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(SCRIPT.with_name("fsdp2_weights.py")),
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(2):
        results = json.loads(Path(f"{out}.rank{rank}").read_text())
        assert sorted(results) == ["lora", "lora_adapter", "lora_base", "plain"]
        for kind, r in results.items():
            assert r["tensors"] == r["expected"] and r["err"] == 0.0 and r["plain"], (rank, kind, r)
            assert r["max_alive"] == 0, (rank, kind, r)  # the stream keeps no gathered tensor
            assert r["shard_moved"] < 1e-6, (rank, kind, r)  # float32 rounding of merge/unmerge at most


UNEVEN = SCRIPT.with_name("uneven_ranks_step.py")


def run_uneven(model_dir, out: Path, strategy: str, cases: tuple[str, ...], in_process=None) -> dict[str, list[dict]]:
    """Each case's rank files (one launch runs every case: the ranks start once); ``single``, the
    one-process reference, through ``in_process`` (the ``script_in_process`` fixture) when given."""
    if in_process is not None:
        in_process(UNEVEN, "main", str(model_dir), str(out), strategy, ",".join(cases))
    else:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        proc = processes.run_script(
            UNEVEN, [str(model_dir), str(out), strategy, ",".join(cases)], env=env, cwd=out.parent, timeout=300
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {
        case: [json.loads(Path(f"{out}.{case}.rank{r}").read_text()) for r in range(1 if strategy == "single" else 2)]
        for case in cases
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_uneven_ranks_take_the_global_batchs_step(tiny_model_dir, tmp_path, script_in_process):
    """Ranks with different token counts and micro-batch counts (``tokens``), or one rank with no row
    left after dynamic sampling (``dropped``): DDP and FSDP2 end the step (nobody waits in a
    collective) with the update of one process on the whole global batch (token-mean over all ranks).
    Both cases run in the same launch of each strategy, one after the other; ``dropped`` with each
    prompt forwarded once (``shared_prompts``: two forwards per pass, the rank without rows' too)."""
    cases = ("tokens", "dropped")
    single = run_uneven(tiny_model_dir, tmp_path / "single", "single", cases, in_process=script_in_process)
    for strategy in ("ddp", "fsdp2"):
        per_case = run_uneven(tiny_model_dir, tmp_path / strategy, strategy, cases)
        for case, ranks in per_case.items():
            assert all(r["steps"] == 1 for r in ranks), case
            for name, values in single[case][0]["params"].items():
                for r in ranks:
                    assert r["params"][name] == pytest.approx(values, abs=1e-5), (strategy, case, name)
