"""`lit-rlvr` processes (and the tests' scripts) for the tests, forked from a warm interpreter instead of started cold.

A cold ``python -m lit_rlvr.cli …`` spends ~5 s of CPU importing torch, transformers and Lightning
before it reads its first option, and the fault, resume and multi-rank tests start dozens of them
on the suite's two cores. :func:`run_cli` and :func:`start_cli` (:func:`run_script` and
:func:`start_script` for ``python SCRIPT ARGS``, such as tests/integration/scripts/) fork each one instead from one
launcher process per pytest worker that imported those once: lit_rlvr's own reward-worker
launcher (:class:`lit_rlvr.rewards.launcher.Launcher`, preloading :func:`preload`). The child is a
process of its own as ``python -m lit_rlvr.cli ARGS`` makes one, as far as the run can tell: its
own session (it leads its process group), the environment, working directory and ``sys.path``
(``PYTHONPATH`` first) it was given, stdout and stderr into the caller's files, ``sys.argv`` as
the ``-m`` entry point has it (a script: its path, its folder first on ``sys.path``), Python's
default signal handlers, torch's thread count from ``OMP_NUM_THREADS``, and at its end the exit
handlers, then its exit code (or the signal that ended it). The second rank of a multi-process run
(Lightning's launcher, ``lit-rlvr cache --devices 2``) is forked warm too: from an idle copy of the
run taken before its command started (its *sibling*, below).

What a fork cannot check, a cold process does: what importing lit_rlvr prints, warns or reads from
the environment at import. The tests of those (tests/repo/test_quiet_output.py, the package and
demo tests) start ``python -m lit_rlvr.cli`` as users do.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import pickle
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from lit_rlvr.rewards import frames
from lit_rlvr.rewards.launcher import LaunchedProcess, Launcher, run_and_exit

CLI_MAIN = Path(__file__).resolve().parents[1] / "lit_rlvr" / "cli" / "__main__.py"
_LAUNCHER: Launcher | None = None


def preload() -> None:
    """What every `lit-rlvr` run imports, imported once in the launcher; where vLLM is installed, also
    what starting an in-process vLLM engine imports beyond ``import vllm`` (its ``LLM`` entry point, the
    CPU worker, the tests' Llama architecture): ~3 s of CPU once per launcher instead of in every rank
    and script of the vLLM tests."""
    import lightning.pytorch  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401

    import lit_rlvr.cli.lightning_cli  # noqa: F401

    try:
        import vllm.entrypoints.llm  # noqa: F401
        import vllm.model_executor.models.llama  # noqa: F401
        import vllm.v1.worker.cpu_worker  # noqa: F401
    except Exception:  # no (or a broken) vLLM: the tests that need it skip or report it themselves
        pass


def _launcher() -> Launcher:
    global _LAUNCHER
    if _LAUNCHER is None or _LAUNCHER.owner != os.getpid() or _LAUNCHER.gone or _LAUNCHER.proc.poll() is not None:
        _LAUNCHER = Launcher(f"{__name__}:preload")
    return _LAUNCHER


class CLIProcess:
    """A forked `lit-rlvr` run: the part of ``subprocess.Popen`` the tests use (``pid``, ``poll``,
    ``wait``, ``send_signal``, ``kill``, ``returncode``) and its output once it ended (``stdout``,
    ``stderr``: text; ``stderr`` is empty when it went to stdout)."""

    def __init__(
        self, script: str | None, args: list[str], env: dict[str, str], cwd: str | Path, merge_stderr: bool
    ) -> None:
        self._files = [tempfile.TemporaryFile() for _ in range(1 if merge_stderr else 2)]
        fds = [f.fileno() for f in self._files]
        mine, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc: LaunchedProcess = _launcher().spawn(
                f"{__name__}:_child", child, env=env, cwd=str(cwd), stdio=(fds[0], fds[-1])
            )
        finally:
            child.close()
        with mine:
            frames.send(mine, (script, list(args)))
        self.stdout: str | None = None
        self.stderr: str | None = None

    @property
    def pid(self) -> int:
        pid = self._proc.pid
        if pid is None:
            raise RuntimeError(f"the test launcher did not start the process: {self._proc.lost}")
        return pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code once it ended (negative: the signal), reading its output; ``subprocess.TimeoutExpired``."""
        code = self._proc.wait(timeout)
        if code is None:
            raise RuntimeError(f"the test launcher exited before the process ended: {self._proc.lost}")
        if self.stdout is None:
            out = []
            for f in self._files:
                f.seek(0)
                out.append(f.read().decode(errors="replace"))
                f.close()
            self.stdout, self.stderr = out[0], (out[1] if len(out) > 1 else "")
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self._proc.kill()


def start_cli(
    args: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None, merge_stderr: bool = False
) -> CLIProcess:
    """``lit-rlvr ARGS`` (as ``python -m lit_rlvr.cli ARGS``) forked in the background; ``env``: the
    whole environment (default: this process's); ``merge_stderr``: stderr into stdout."""
    return CLIProcess(None, args, dict(os.environ) if env is None else env, cwd or os.getcwd(), merge_stderr)


def start_script(
    script: str | Path,
    args: list[str],
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    merge_stderr: bool = False,
) -> CLIProcess:
    """``python SCRIPT ARGS`` forked in the background (as :func:`start_cli`)."""
    env = dict(os.environ) if env is None else env
    return CLIProcess(str(Path(script).resolve()), args, env, cwd or os.getcwd(), merge_stderr)


def run_cli(
    args: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", "lit_rlvr.cli", *args], capture_output=True, text=True, …)``,
    forked: the same result, ``subprocess.TimeoutExpired`` (the process killed) after ``timeout`` seconds."""
    return _finish(start_cli(args, env, cwd), ["lit-rlvr", *args], timeout)


def run_script(
    script: str | Path,
    args: list[str],
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, …)``, forked (as :func:`run_cli`)."""
    return _finish(start_script(script, args, env, cwd), [str(script), *args], timeout)


def _finish(proc: CLIProcess, command: list[str], timeout: float | None) -> subprocess.CompletedProcess:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        raise subprocess.TimeoutExpired(command, timeout, proc.stdout, proc.stderr) from None
    return subprocess.CompletedProcess(command, code, proc.stdout, proc.stderr)


def _child(fd: int) -> None:
    """In the forked process: read the command, become ``python -m lit_rlvr.cli ARGS`` (or ``python SCRIPT ARGS``), run it."""
    with socket.socket(fileno=fd) as sock:
        (script, args), _ = frames.recv(sock)
    run_command(script, args)  # the launcher's worker then exits with its code


def run_forked(script: str | None, args: list[str]) -> NoReturn:
    """For a test script that forks a run itself (subreaper.py): :func:`run_command` in this forked
    process, then its exit code (as the launcher's children end: no C-level exit handlers)."""
    run_and_exit(run_command, script, args)


def run_command(script: str | None, args: list[str]) -> None:
    """Become ``python -m lit_rlvr.cli ARGS`` (script None) or ``python SCRIPT ARGS`` and run it; its end as
    the interpreter's (``SystemExit``)."""
    rank = _fork_sibling()
    if rank is not None:  # this is the sibling, asked to run another rank of the command
        script, args = rank
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the launcher ignores Ctrl-C; a user's run does not
    sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(line_buffering=True)
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    try:
        if script is None:
            sys.argv = [str(CLI_MAIN), *args]
            from lit_rlvr.cli import main

            main()
        else:
            sys.argv = [script, *args]
            sys.path.insert(0, os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit:
        atexit._run_exitfuncs()
        raise
    except BaseException as e:  # as the interpreter ends on it: sys.excepthook (torch.distributed's names the rank)
        sys.excepthook(type(e), e, e.__traceback__)
        atexit._run_exitfuncs()
        if isinstance(e, KeyboardInterrupt):  # Python then ends by the signal itself
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1) from None
    atexit._run_exitfuncs()


def remove_unmapped_shared_memory(pattern: str, keep: set[str] = frozenset()) -> None:
    """Remove the ``/dev/shm`` entries matching ``pattern`` that no process maps, except ``keep``: what a
    run killed on purpose, or a forked one (no C-level exit handlers), left behind."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(line.split(maxsplit=5)[-1] for line in maps.read_text().splitlines() if "/dev/shm/" in line)
        except OSError:  # it ended between the listing and the read
            continue
    for path in {str(p) for p in Path("/dev/shm").glob(pattern)} - set(keep) - mapped:
        Path(path).unlink(missing_ok=True)


# ---------------------------------------------------------------- a multi-process run's second rank, warm
# Lightning's launcher starts rank 1 of a `--trainer.devices=2` run (and `lit-rlvr cache --devices 2` its
# rank 1) with `subprocess.Popen([python, script or -m module, *argv], env=…)`: a cold interpreter that
# imports torch, transformers and Lightning again. A forked run instead forks, before its command starts,
# one idle copy of itself (its *sibling*: warm, no threads, nothing run yet) and hands that Popen to it:
# the sibling takes the environment and working directory Popen was given and runs the same command. It
# is a child of the run, in its process group, with its output, as Popen's child is; it ends with the run
# when no Popen asked for it. A second Popen of the same run (3 ranks and more) starts cold as before.
_SIBLING: dict[str, int] = {}  # in a forked run: the sibling's pid and the write end of its request pipe
_PR_SET_PDEATHSIG = 1


def _die_with_parent(signum: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)


def _fork_sibling() -> tuple[str | None, list[str]] | None:
    """In the run: fork the sibling and return None. In the sibling: wait for a command; return it
    (``(script, args)``, the environment and directory applied), or exit when the run ends without one."""
    parent = os.getpid()
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(r)
        _SIBLING.update(pid=pid, fd=w)
        atexit.register(end_sibling)
        _route_rank_launches()
        return None
    os.close(w)
    _die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the run ended before the line above
        os._exit(0)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    if not chunks:
        os._exit(0)
    script, args, env, cwd = pickle.loads(b"".join(chunks))
    _die_with_parent(0)  # from here on a rank, which Popen would not tie to its parent's life
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    return script, args


def end_sibling() -> None:
    """At the run's end, a sibling no Popen asked for is killed and reaped (not left to init); a run
    that waits for every child it has (subreaper.py) calls it first."""
    if "fd" in _SIBLING:
        os.close(_SIBLING.pop("fd"))
        os.kill(_SIBLING["pid"], signal.SIGKILL)
        os.waitpid(_SIBLING["pid"], 0)


def _as_command(command) -> tuple[str | None, list[str]] | None:
    """``(script, args)`` (script None: lit-rlvr) for ``[python, -m lit_rlvr.cli | SCRIPT, *args]``; else None."""
    if isinstance(command, (str, bytes, os.PathLike)) or len(command) < 2 or command[0] != sys.executable:
        return None
    command = [str(c) for c in command]
    if command[1] == "-m":
        return (None, command[3:]) if command[2:3] == ["lit_rlvr.cli"] else None
    if command[1].startswith("-"):
        return None
    return (None if Path(command[1]) == CLI_MAIN else command[1]), command[2:]


class _SiblingProcess:
    """The sibling once it runs a rank: the part of ``subprocess.Popen`` Lightning's launcher and
    ``lit-rlvr cache`` use (``pid``, ``poll``, ``returncode``, ``wait``, ``send_signal``, ``terminate``, ``kill``)."""

    def __init__(self, pid: int, args) -> None:
        self.pid, self.args, self.returncode = pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            got, status = os.waitpid(self.pid, os.WNOHANG)
            if got:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _popen(args, *rest, **kwargs):
    """``subprocess.Popen`` for the rank launchers: the first rank command goes to the sibling."""
    command = _as_command(args)
    if rest or set(kwargs) - {"env", "cwd"} or command is None or "fd" not in _SIBLING:
        return subprocess.Popen(args, *rest, **kwargs)
    fd = _SIBLING.pop("fd")
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    data = memoryview(pickle.dumps((*command, env, os.fspath(kwargs.get("cwd") or os.getcwd()))))
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    return _SiblingProcess(_SIBLING["pid"], args)


def _route_rank_launches() -> None:
    """Lightning's rank launchers (the Trainer's and Fabric's: each module calls its own ``subprocess.Popen``)
    and ``lit-rlvr cache``'s start their ranks through :func:`_popen`."""
    import types

    import lightning.fabric.strategies.launchers.subprocess_script as fabric_launcher
    import lightning.pytorch.strategies.launchers.subprocess_script as trainer_launcher

    import lit_rlvr.tools.cache as cache_tool

    routed = types.ModuleType("subprocess")
    routed.__dict__.update(vars(subprocess))
    routed.Popen = _popen
    fabric_launcher.subprocess = routed
    trainer_launcher.subprocess = routed
    cache_tool.subprocess = routed
