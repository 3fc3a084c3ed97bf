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
        import subprocess, sys, time

        def test_spins():
            {BUSY}

        def test_starts_a_process():
            subprocess.run([sys.executable, "-c", {BUSY!r}], check=True)

        def test_idles():
            time.sleep(0.6)
        """)
    )
    command = [sys.executable, "-m", "pytest", "-p", "suite_cpu", "-q", "-c", str(tmp_path / "pytest.ini")]
    # (the inner pytest must not carry this test's PYTEST_CURRENT_TEST: the census would give it to this test)
    code, wall, processes, own = suite_cpu.census(
        [*command, str(tmp_path / "test_toy.py")], env={"PYTEST_CURRENT_TEST": ""}
    )
    assert code == 0
    assert {t.split("::")[1] for t in own} == {"test_spins", "test_starts_a_process", "test_idles"}, own
    spins = next(v for t, v in own.items() if t.endswith("test_spins"))
    idles = next(v for t, v in own.items() if t.endswith("test_idles"))
    assert spins >= 0.9 and idles < 0.3
    child = [p for p in processes if p["test"].endswith("test_starts_a_process")]
    assert len(child) == 1 and child[0]["cpu"] >= 0.5
    lines = suite_cpu.report(code, wall, processes, own, ["--", "test_toy.py"], top=3)
    ranked = [line for line in lines if line.startswith("| `") and "::" in line]
    assert len(ranked) == 3 and ranked[0].split("::")[1].startswith(("test_spins", "test_starts_a_process"))
    assert "test_idles" in ranked[2]
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
