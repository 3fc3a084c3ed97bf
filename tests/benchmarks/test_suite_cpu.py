"""benchmarks/suite_cpu.py: the census finds every process a command starts, its CPU and the test it ran under,
and the plugin adds each test's own CPU."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import suite_cpu  # noqa: E402

BUSY = "import time; t = time.process_time(); exec('while time.process_time() - t < 1.0: pass')"


def test_a_grandchild_nobody_waits_for_is_counted_with_the_test_it_started_under(tmp_path):
    """A child that starts a grandchild and exits without reaping it (it waits for its end, as a test must leave
    no process behind, with WNOWAIT): getrusage sees neither's CPU, the census both."""
    orphan = (
        f"import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {BUSY!r}]); {BUSY}; "
        "os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)"
    )
    code, wall, processes, own = suite_cpu.census(
        [sys.executable, "-c", f"import os, subprocess, sys; subprocess.run([sys.executable, '-c', {orphan!r}])"],
        env={"PYTEST_CURRENT_TEST": "tests/x.py::test_y (call)"},
    )
    assert code == 0 and wall > 1.0 and own == {}
    busy = [p for p in processes if p["cpu"] >= 0.5]
    assert len(busy) == 2, processes  # the child and the grandchild, each ~1 s of CPU
    assert {p["test"] for p in busy} == {"tests/x.py::test_y"}
    assert all(suite_cpu.kind(p["command"]) == "python -c" for p in busy)


def test_the_plugin_adds_each_tests_own_cpu_and_the_report_ranks_them(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_toy.py").write_text(
        textwrap.dedent(f"""
        import os, subprocess, sys, time

        def test_spins():
            {BUSY}

        def test_starts_a_process():
            subprocess.run([sys.executable, "-c", {BUSY!r}], check=True)

        def test_idles():
            time.sleep(0.6)

        def test_forks():  # the child's environment in /proc is its parent's at start: no test's name
            pid = os.fork()
            if pid == 0:
                {BUSY}
                os._exit(0)
            os.waitpid(pid, 0)
        """)
    )
    command = [sys.executable, "-m", "pytest", "-p", "suite_cpu", "-q", "-c", str(tmp_path / "pytest.ini")]
    # (the inner pytest must not carry this test's PYTEST_CURRENT_TEST: the census would give it to this test)
    code, wall, processes, own = suite_cpu.census(
        [*command, str(tmp_path / "test_toy.py")], env={"PYTEST_CURRENT_TEST": ""}
    )
    assert code == 0
    assert {t.split("::")[1] for t in own} == {"test_spins", "test_starts_a_process", "test_idles", "test_forks"}, own
    spins = next(v for t, v in own.items() if t.endswith("test_spins"))
    idles = next(v for t, v in own.items() if t.endswith("test_idles"))
    assert spins >= 0.9 and idles < 0.3
    child = [p for p in processes if p["test"].endswith("test_starts_a_process")]
    assert len(child) == 1 and child[0]["cpu"] >= 0.5
    forked = [p for p in processes if p["test"].endswith("test_forks")]  # named by when it started, in which worker
    assert len(forked) == 1 and forked[0]["cpu"] >= 0.5 and forked[0]["command"] == child_of_pytest(processes)
    lines = suite_cpu.report(code, wall, processes, own, ["--", "test_toy.py"], top=4)
    ranked = [line for line in lines if line.startswith("| `") and "::" in line]
    assert len(ranked) == 4 and "test_idles" in ranked[3]
    assert any(line.startswith("| pytest |") for line in lines)


def test_the_command_line(tmp_path):
    cfg = suite_cpu.parse_args(["--out", str(tmp_path / "s.md"), "--top", "5", "--", "-n", "1", "tests/functional"])
    assert cfg.top == 5 and cfg.pytest_args == ["-n", "1", "tests/functional"]
    assert suite_cpu.parse_args([]).pytest_args == []


def test_ci_runs_the_entry_point_with_the_plugin_and_leaves_make_its_own_settings():
    command, env, make_settings = suite_cpu.command_of(suite_cpu.parse_args(["--ci"]))
    assert command == ["bash", ".ci/run"] and (suite_cpu.ROOT / ".ci" / "run").exists()
    assert env["PYTEST_ADDOPTS"] == "-p suite_cpu" and not make_settings  # make's nproc would read OMP_NUM_THREADS
    command, env, make_settings = suite_cpu.command_of(suite_cpu.parse_args(["--", "-n", "1", "tests/functional"]))
    assert command[1:] == ["-m", "pytest", "-p", "suite_cpu", "-q", "-n", "1", "tests/functional"] and make_settings


def child_of_pytest(processes: list[dict]) -> str:
    """The inner pytest's command line (a forked child shows its parent's)."""
    return next(p["command"] for p in processes if suite_cpu.kind(p["command"]) == "pytest")


def test_attribution_walks_up_to_the_worker_and_picks_the_test_running_when_the_process_started():
    worker = {"pid": 10, "ppid": 1, "start": 0, "test": "", "command": "w", "cpu": 0}
    launcher = {"pid": 11, "ppid": 10, "start": 5, "test": "t::a", "command": "l", "cpu": 0}
    run = {"pid": 12, "ppid": 11, "start": 25, "test": "t::a", "command": "r", "cpu": 0}  # forked: a's name
    stray = {"pid": 13, "ppid": 99, "start": 25, "test": "t::c", "command": "s", "cpu": 0}  # no worker above it
    runs = [{"pid": 10, "test": "t::a", "start": 0, "end": 10}, {"pid": 10, "test": "t::b", "start": 20, "end": 30}]
    suite_cpu.attribute([worker, launcher, run, stray], runs)
    assert (launcher["test"], run["test"], stray["test"]) == ("t::a", "t::b", "t::c")


def test_a_forkserver_is_a_multiprocessing_worker_whatever_its_preload_names():
    python = "/repo/.venv/bin/python"
    forkserver = (
        f"{python} -c from multiprocessing.forkserver import main; main(6, 8, ['common', 'vllm.entrypoints.llm'])"
    )
    assert suite_cpu.kind(forkserver) == "multiprocessing worker"
    assert suite_cpu.kind(f"{python} -m vllm.entrypoints.openai.api_server --model m") == "vllm serve"
    assert suite_cpu.kind(f"{python} -m lit_rlvr.cli fit --config c.yaml") == "lit-rlvr"
