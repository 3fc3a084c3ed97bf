"""The worker launcher: reward workers are forked from one launcher per process, get the asking
process's environment, directory, ``sys.path`` and stdio at the time they are asked for, survive
their launcher, and the launcher ends with its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from lit_rlvr.rewards import BatchScorer, ScoreResult
from lit_rlvr.rewards.launcher import Launcher, LauncherGone, run_and_exit
from lit_rlvr.rewards.scorer import _PRELOAD

PROBE = '''
import os, sys

from lit_rlvr.rewards import register_reward


@register_reward("launcher_probe")
def launcher_probe(completion, answer, **row):
    """1 when the worker sees what the row asks about: an environment variable, its directory, a file."""
    if completion == "env":
        return float(os.environ.get("LIT_RLVR_LAUNCHER_PROBE") == answer)
    if completion == "cwd":
        return float(os.getcwd() == answer)
    if completion == "ppid":
        return float(str(os.getppid()) == answer)
    if completion == "speak":
        print("probe says hello on stderr", file=sys.stderr, flush=True)
        return 1.0
    if completion == "die":
        os._exit(3)
    if completion == "frozen":  # what the launcher imported is out of the cyclic collector's walks
        import gc

        return float(gc.get_freeze_count() > int(answer))
    return 0.0
'''


def row(answer: str) -> dict:
    return {"id": "p", "reward": "launcher_probe", "answer": answer}


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """The probe reward in a folder put on ``sys.path`` only now (after the launcher may have started)."""
    from lit_rlvr.rewards import REWARDS

    folder = tmp_path / f"plugin_{time.monotonic_ns()}"
    folder.mkdir()
    (folder / "lit_rlvr_launcher_probe.py").write_text(textwrap.dedent(PROBE))
    monkeypatch.syspath_prepend(str(folder))
    import lit_rlvr_launcher_probe  # noqa: F401

    yield
    REWARDS.pop("launcher_probe", None)
    sys.modules.pop("lit_rlvr_launcher_probe", None)


@pytest.mark.timeout(120)
def test_workers_of_every_scorer_come_from_one_launcher_and_see_the_asking_processs_state(
    probe_module, tmp_path, monkeypatch
):
    launcher = Launcher.get(_PRELOAD)  # started before the probe's folder, variable and directory below
    monkeypatch.setenv("LIT_RLVR_LAUNCHER_PROBE", "set-after-the-launcher")
    monkeypatch.chdir(tmp_path)
    with BatchScorer(workers=2, timeout_s=5.0) as a, BatchScorer(workers=1, timeout_s=5.0) as b:
        assert Launcher.get(_PRELOAD) is launcher
        pids = {w.proc.pid for w in a._workers + b._workers}
        assert len(pids) == 3 and os.getpid() not in pids
        launcher_pid = str(launcher.proc.pid)
        assert (
            a.score(["env", "cwd", "ppid"], [row("set-after-the-launcher"), row(str(tmp_path)), row(launcher_pid)])
            == [ScoreResult(1.0, "ok")] * 3
        )
        # a worker that dies is replaced by a fork of the same launcher, which runs the next items
        results = b.score(["die", "ppid", "env"], [row(""), row(launcher_pid), row("set-after-the-launcher")])
        assert results[0] == ScoreResult(0.0, "error", "worker died (exit code 3)")
        assert results[1:] == [ScoreResult(1.0, "ok")] * 2
        assert b._workers[0].proc.pid not in pids


@pytest.mark.timeout(120)
def test_a_start_request_larger_than_the_socket_buffer_arrives_whole(probe_module, monkeypatch):
    """The request carries the whole environment and ``sys.path``: a large one (at least 0.7 MB, two
    socket buffers or more) reaches the worker intact instead of failing the start."""
    import socket as socketlib

    a, b = socketlib.socketpair()
    buffer = a.getsockopt(socketlib.SOL_SOCKET, socketlib.SO_SNDBUF)
    a.close(), b.close()
    monkeypatch.setenv("LIT_RLVR_LAUNCHER_PROBE", "x" * 100_000)  # one variable stays under exec's 128 KiB limit
    for i in range(max(6, 2 * buffer // 100_000 + 1)):  # within exec's 2 MiB for the launcher's own start
        monkeypatch.setenv(f"LIT_RLVR_LAUNCHER_PADDING_{i}", "y" * 100_000)
    with BatchScorer(workers=1, timeout_s=5.0) as pool:
        assert pool.score(["env"], [row("x" * 100_000)]) == [ScoreResult(1.0, "ok")]


@pytest.mark.timeout(120)
def test_a_worker_starts_with_what_its_launcher_preloaded_frozen(probe_module):
    """The launcher freezes its heap once its preload is imported (gc.freeze): the workers' full
    collections do not walk those objects again, nor copy their pages by touching them."""
    with BatchScorer(workers=1, timeout_s=5.0) as pool:
        assert pool.score(["frozen"], [row("10000")]) == [ScoreResult(1.0, "ok")]


@pytest.mark.timeout(120)
def test_a_workers_stderr_is_the_asking_processs_stderr_at_the_time(probe_module, capfd):
    Launcher.get(_PRELOAD)
    capfd.readouterr()
    with BatchScorer(workers=1, timeout_s=5.0) as pool:
        assert pool.score(["speak"], [row("")]) == [ScoreResult(1.0, "ok")]
    assert "probe says hello on stderr" in capfd.readouterr().err


@pytest.mark.timeout(120)
def test_a_worker_can_be_given_its_own_environment_directory_and_output(tmp_path, monkeypatch):
    """``spawn(env=…, cwd=…, stdio=…)`` instead of the asking process's (what the tests' forked `lit-rlvr`
    runs ask for, tests/processes.py): the worker sees them, the asking process keeps its own."""
    import socket

    folder = tmp_path / "module"
    folder.mkdir()
    (folder / "lit_rlvr_spawn_probe.py").write_text(
        "import os, sys\n\n\ndef report(fd):\n"
        "    print(os.environ.get('LIT_RLVR_SPAWN_PROBE'), os.getcwd(), flush=True)\n"
        "    print('on stderr', file=sys.stderr, flush=True)\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    launcher = Launcher(_PRELOAD)  # one of its own: the process's reward launcher is not touched
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    mine, theirs = socket.socketpair()
    try:
        with open(out, "w") as o, open(err, "w") as e:
            env = {**os.environ, "LIT_RLVR_SPAWN_PROBE": "given"}
            proc = launcher.spawn(
                "lit_rlvr_spawn_probe:report", theirs, env=env, cwd=str(folder), stdio=(o.fileno(), e.fileno())
            )
        theirs.close()
        assert proc.wait(60) == 0
        assert out.read_text() == f"given {folder}\n" and err.read_text() == "on stderr\n"
        assert "LIT_RLVR_SPAWN_PROBE" not in os.environ and os.getcwd() != str(folder)
    finally:
        mine.close()
        launcher.sock.close()  # its parent's end closed: the launcher exits
        launcher.proc.wait(30)


@pytest.mark.timeout(120)
def test_workers_outlive_a_killed_launcher_and_the_next_scorer_starts_a_new_one(probe_module):
    with BatchScorer(workers=1, timeout_s=5.0) as pool:
        old = Launcher.get(_PRELOAD)
        assert pool.score(["ppid"], [row(str(old.proc.pid))]) == [ScoreResult(1.0, "ok")]
        os.kill(old.proc.pid, signal.SIGKILL)
        old.proc.wait()
        assert pool.score(["env"], [row("unset")]) == [ScoreResult(0.0, "ok")]  # the running worker still scores
        with pytest.raises(LauncherGone, match="exited"):
            old.call("wait", 1)
        results = pool.score(["die", "env"], [row(""), row("unset")])  # its replacement comes from a new launcher
        assert results[0].status == "error" and "worker died" in results[0].reason
        assert results[1] == ScoreResult(0.0, "ok")
        new = Launcher.get(_PRELOAD)
        assert new is not old and pool.score(["ppid"], [row(str(new.proc.pid))]) == [ScoreResult(1.0, "ok")]


@pytest.mark.timeout(120)
def test_the_launcher_exits_with_the_process_that_started_it():
    code = (
        "from lit_rlvr.rewards import BatchScorer; from lit_rlvr.rewards.launcher import Launcher\n"
        "from lit_rlvr.rewards.scorer import _PRELOAD\n"
        "pool = BatchScorer(workers=1); pool.score(['\\\\boxed{2}'], [{'id': 'a', 'reward': 'math', 'answer': '2'}])\n"
        "print(Launcher.get(_PRELOAD).proc.pid, pool._workers[0].proc.pid, flush=True)\n"
        "import os; os._exit(0)  # no clean-up: only the closed socket tells the launcher and the worker\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pids = [int(p) for p in proc.stdout.split()]
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(120)
def test_a_launcher_that_stops_answering_is_killed_and_the_next_worker_comes_from_a_new_one(probe_module, monkeypatch):
    monkeypatch.setattr(Launcher, "answer_timeout_s", 1.0)
    old = Launcher.get(_PRELOAD)
    os.kill(old.proc.pid, signal.SIGSTOP)  # alive, but answers nothing
    try:
        with BatchScorer(workers=1, timeout_s=5.0, start_timeout_s=2.0) as pool:
            with pytest.raises(RuntimeError, match="did not start within 2.0 s"):
                pool.score(["env"], [row("unset")])
            assert old.proc.wait(timeout=10) == -signal.SIGKILL and "did not start a worker within 1 s" in old.gone
            new = Launcher.get(_PRELOAD)
            assert new is not old and pool.score(["ppid"], [row(str(new.proc.pid))]) == [ScoreResult(1.0, "ok")]
    finally:
        if old.proc.poll() is None:
            old.proc.kill()


@pytest.mark.timeout(120)
def test_a_launcher_that_cannot_import_its_preload_fails_the_scorer_clearly(monkeypatch, capfd):
    import lit_rlvr.rewards.scorer as scorer

    monkeypatch.setattr(Launcher, "_instance", None)
    monkeypatch.setattr(scorer, "_PRELOAD", "lit_rlvr_no_such_module:prepare")
    with pytest.raises(RuntimeError, match=r"the worker launcher exited \(exit code 1"):
        with BatchScorer(workers=1, timeout_s=5.0) as pool:
            pool.score(["\\boxed{2}"], [{"id": "a", "reward": "math", "answer": "2"}])
    assert "No module named 'lit_rlvr_no_such_module'" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("body", "code"),
    [("return", 0), ("raise SystemExit(3)", 3), ("raise SystemExit('why')", 1), ("raise ValueError('x')", 1)],
)
def test_run_and_exit_ends_a_fork_with_the_functions_exit_code(body, code):
    """What ``python -c BODY`` exits with: 0, SystemExit's code (a message: 1), 1 on an exception."""
    reference = subprocess.run([sys.executable, "-c", f"def f():\n    {body}\nf()"], capture_output=True)
    assert reference.returncode == code
    namespace = {}
    exec(f"def f():\n    {body}\n", namespace)
    pid = os.fork()
    if pid == 0:
        sys.stderr = open(os.devnull, "w")  # the traceback of the ValueError case
        run_and_exit(namespace["f"])
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == code
