"""The processes of a started server, watched from the trainer (:class:`ServerProcesses`), on a
stand-in tree under the real guard: guard → "API server" → "engine core" (no vLLM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit_rlvr.rollout import server_processes as server_module
from lit_rlvr.rollout.server_processes import ServerProcesses

GUARD = Path(server_module.__file__).with_name("server_guard.py")
# the "API server": starts an "engine core" it never waits for (a killed one stays a zombie, as in vLLM until it reaps it)
API = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"


def _until(condition, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (out := condition()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return out


@pytest.fixture
def tree():
    guard = subprocess.Popen([sys.executable, str(GUARD), "--", sys.executable, "-c", API], start_new_session=True)
    processes = ServerProcesses(guard)
    api = _until(lambda: server_module._children(guard.pid))
    engine = _until(lambda: server_module._children(api[0]))
    processes.record()
    yield processes, api[0], engine[0]
    os.killpg(guard.pid, signal.SIGKILL)
    guard.wait()


@pytest.mark.timeout(60)
def test_a_killed_engine_core_is_seen_while_the_api_server_still_runs(tree):
    processes, api, engine = tree
    assert [pid for pid, _, _ in processes.watched] == [api, engine] and processes.fault() is None
    os.kill(engine, signal.SIGKILL)
    fault = _until(processes.fault)
    assert fault.startswith(f"is broken: python (pid {engine}) is gone (killed") and processes.guard.poll() is None


@pytest.mark.timeout(60)
def test_a_stopped_process_is_reported_once_it_has_been_stopped_for_the_grace_time(tree):
    processes, api, engine = tree
    os.kill(engine, signal.SIGSTOP)
    assert _until(lambda: processes.fault(stopped_for=60.0) is None and (server_module._stat(engine) or "?")[0] == "T")
    time.sleep(0.6)
    assert processes.fault(stopped_for=0.5).startswith(f"is stopped: python (pid {engine}) has been stopped (SIGSTOP")
    os.kill(engine, signal.SIGCONT)
    assert _until(lambda: processes.fault(stopped_for=0.0) is None)


@pytest.mark.timeout(60)
def test_a_killed_api_server_ends_the_guard_with_its_exit_code(tree):
    processes, api, engine = tree
    os.kill(api, signal.SIGKILL)
    assert _until(lambda: processes.guard.poll() is not None)
    assert processes.fault() == "exited with code 137 (killed by signal 9, SIGKILL)"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("to", ["group", "guard"])
def test_a_stop_lets_the_engine_processes_clean_up_before_the_group_is_killed(tmp_path, to):
    """SIGTERM to the group (``VLLMServer.stop``) or to the guard alone (the trainer died: its death signal):
    the "engine core" — whose SIGTERM handler removes what it owns, as vLLM's removes its shared memory —
    finishes it, then the rest of the group (an API server that would not stop) is killed, well within
    the grace time."""
    from lit_rlvr.rollout.server_guard import GRACE_S

    cleaned = tmp_path / "cleaned"
    core = (
        "import pathlib, signal, sys, time\n"
        f"def stop(*_): time.sleep(0.3); pathlib.Path({str(cleaned)!r}).touch(); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop); time.sleep(600)"
    )
    api = (  # ignores SIGTERM, as a server waiting on its open connections
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"subprocess.Popen([sys.executable, '-c', {core!r}]); time.sleep(600)"
    )
    guard = subprocess.Popen([sys.executable, str(GUARD), "--", sys.executable, "-c", api], start_new_session=True)
    (api_pid,) = _until(lambda: server_module._children(guard.pid))
    assert _until(lambda: server_module._children(api_pid))
    time.sleep(0.5)  # the engine core's handler is installed
    t0 = time.monotonic()
    if to == "group":
        os.killpg(guard.pid, signal.SIGTERM)
    else:
        guard.send_signal(signal.SIGTERM)
    assert guard.wait(timeout=30) == -signal.SIGKILL  # the guard ends with its group
    assert cleaned.exists() and time.monotonic() - t0 < GRACE_S
    assert _until(lambda: (server_module._stat(api_pid) or ("gone",))[0] in ("gone", "Z"), 10)  # the API server too
