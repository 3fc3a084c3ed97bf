"""Start reward workers by forking them from one small launcher process per training process.

A reward worker must be a process of its own (the parent kills it at the hard deadline) and
must not be a fork of the training process (whose torch/vLLM threads and memory a fork would
copy). Starting each one as a fresh interpreter is safe but costs its imports (sympy,
math-verify, sqlglot: ~0.6 s of CPU) every time: at start-up, for the data module's gold check
and the module's scorer, and again for every worker killed at a deadline. So each process that
scores starts one *launcher*: a fresh interpreter (``python -c …``, no torch, no threads) that
imports the reward modules once and then, on request, ``fork()``\\ s a worker from itself. A
fork of that single-threaded process is safe, and a new worker is ready in milliseconds.

What a worker gets from the process that asked for it, at the time it asked (not from the
launcher's start): the environment, the working directory, ``sys.path``, and its stdout and
stderr (passed as file descriptors), and it leads a session of its own (a Ctrl-C in the
terminal goes to the trainer only). It runs ``target(fd)`` on the socket it was handed.

The launcher talks over a Unix stream socketpair (``SOCK_STREAM``: Linux and macOS alike): one
frame per request and per reply (:mod:`lit_rlvr.rewards.frames`), a request's file descriptors
attached to it with ``SCM_RIGHTS``. Replies are read only when needed (a
worker's pid when it must be killed or polled), so asking for workers does not wait for the
launcher's own start. Workers stay the launcher's children until the parent asks for their exit
status (``wait``), so a worker's pid is never reused while the parent may still signal it. The
launcher exits when its parent's end of the socket closes (the parent exited); workers exit at
EOF on their own sockets, as before.
"""

from __future__ import annotations

import gc
import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import NoReturn

from lit_rlvr.rewards import frames

_BOOT = (
    "import sys; from lit_rlvr.rewards.launcher import _launcher_main; _launcher_main(int(sys.argv[1]), sys.argv[2])"
)
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class LauncherGone(RuntimeError):
    """The launcher process exited; the workers it started can no longer be polled through it."""


def worker_environment() -> dict[str, str]:
    """The environment a worker gets: this process's, its ``sys.path`` as ``PYTHONPATH``, one thread each."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.update({name: "1" for name in _THREAD_ENV})
    return env


class Launcher:
    """This process's launcher of worker processes (one per process: :meth:`get`).

    Args:
        preload: ``"module:function"`` the launcher imports and calls once before it forks any
            worker (what every worker needs, imported once).
    """

    _instance: Launcher | None = None
    _instance_lock = threading.Lock()
    answer_timeout_s = 120.0
    """How long the launcher may take to answer beyond the request's own time (its own start
    included); one that does not is killed, and the next worker comes from a new one."""

    def __init__(self, preload: str):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(child.fileno()), preload],
            pass_fds=(child.fileno(),),
            env=worker_environment(),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        child.close()
        self.sock, self.preload, self.owner = parent, preload, os.getpid()
        self.lock = threading.Lock()
        self.replies: dict[int, object] = {}
        self.next_id = 0
        self.gone: str | None = None  # why the launcher can no longer answer

    @classmethod
    def get(cls, preload: str) -> Launcher:
        """The launcher of this process for ``preload``, started now if there is none or it exited
        (a forked child of this process gets its own)."""
        with cls._instance_lock:
            inst = cls._instance
            if (
                inst is None
                or inst.owner != os.getpid()
                or inst.preload != preload
                or inst.gone
                or inst.proc.poll() is not None
            ):
                cls._instance = inst = cls(preload)
            return inst

    def spawn(
        self,
        target: str,
        sock: socket.socket,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdio: tuple[int, int] | None = None,
    ) -> LaunchedProcess:
        """Fork a worker that runs ``target`` (``"module:function"``, called with the socket's fd).

        ``sock`` is handed to the worker (close this process's copy afterwards). ``env``, ``cwd``
        and ``stdio`` (the file descriptors of its stdout and stderr) are this process's unless
        given (the environment as :func:`worker_environment` has it). Does not wait for the
        launcher: the worker's pid is read when it is first needed.
        """
        request = (
            target,
            worker_environment() if env is None else dict(env),
            os.getcwd() if cwd is None else str(cwd),
            list(sys.path),
        )
        mine = [] if stdio is not None else [fd for fd in (1, 2) if not _is_open(fd)]
        devnull = {fd: os.open(os.devnull, os.O_WRONLY) for fd in mine}
        fds = list(stdio) if stdio is not None else [devnull.get(fd, fd) for fd in (1, 2)]
        try:
            rid = self._send("spawn", request, fds=[sock.fileno(), *fds])
        finally:
            for fd in devnull.values():
                os.close(fd)
        return LaunchedProcess(self, rid)

    def _send(self, op: str, args, fds=()) -> int:
        with self.lock:
            if self.gone:
                raise LauncherGone(self.gone)
            rid, self.next_id = self.next_id, self.next_id + 1
            try:
                frames.send(self.sock, (rid, op, args), fds)
            except OSError as e:
                self._lost(f"the worker launcher exited ({self._exit_status()}; {e})")
                raise LauncherGone(self.gone) from None
            return rid

    def reply(self, rid: int, timeout: float | None = None):
        """The reply to request ``rid``; ``TimeoutError`` if none came within ``timeout`` seconds,
        ``LauncherGone`` if the launcher exited (the reply is an exception it raised: raised here)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while rid not in self.replies:
                if self.gone:
                    raise LauncherGone(self.gone)
                left = None if end is None else max(0.0, end - time.monotonic())
                if not select.select([self.sock], [], [], left)[0]:
                    raise TimeoutError(f"the worker launcher did not answer within {timeout:g} s")
                try:
                    (got, value), _ = frames.recv(self.sock)
                except (EOFError, OSError) as e:
                    self._lost(f"the worker launcher exited ({self._exit_status()}; {e})")
                    continue
                self.replies[got] = value
            value = self.replies.pop(rid)
        if isinstance(value, BaseException):
            raise value
        return value

    def call(self, op: str, *args, timeout: float | None = None):
        """Send one request and wait for its reply."""
        return self.reply(self._send(op, args), timeout)

    def abandon(self, why: str) -> None:
        """Kill a launcher that stopped answering; the next :meth:`get` starts a new one."""
        with self.lock:
            if not self.gone:
                self.proc.kill()
                self._lost(why)

    def _lost(self, why: str) -> None:
        self.gone = why
        self.sock.close()

    def _exit_status(self) -> str:
        try:
            return describe_exit(self.proc.wait(timeout=5))
        except subprocess.TimeoutExpired:
            return "still running"


class LaunchedProcess:
    """A worker forked by the :class:`Launcher`: the subset of ``subprocess.Popen`` the scorer uses
    (``pid``, ``poll``, ``wait``, ``kill``, ``returncode``)."""

    def __init__(self, launcher: Launcher, rid: int):
        self.launcher, self._rid, self._pid = launcher, rid, None
        self.returncode: int | None = None
        self.lost: str | None = None  # the launcher exited before it could say how this worker ended

    def _resolve(self, timeout: float) -> None:
        """Read the launcher's reply to the spawn request, if it comes within ``timeout``."""
        if self._pid is None and self.lost is None:
            try:
                self._pid = self.launcher.reply(self._rid, timeout)
            except TimeoutError:
                pass
            except LauncherGone as e:
                self.lost = str(e)
            except Exception as e:  # the fork failed in the launcher
                self.lost = f"the worker launcher could not start it ({type(e).__name__}: {e})"

    def _unanswered(self, why: str) -> None:
        self.launcher.abandon(why)
        self.lost = self.launcher.gone

    @property
    def pid(self) -> int | None:
        """The worker's pid (waits for the launcher to fork it); None if the launcher exited first
        or did not answer within :attr:`Launcher.answer_timeout_s` (then it is killed)."""
        self._resolve(self.launcher.answer_timeout_s)
        if self._pid is None and self.lost is None:
            self._unanswered(f"the worker launcher did not start a worker within {self.launcher.answer_timeout_s:g} s")
        return self._pid

    def _status(self, timeout: float) -> int | None:
        if self.returncode is None and self.lost is None and self.pid is not None:
            try:
                self.returncode = self.launcher.call(
                    "wait", self._pid, timeout, timeout=timeout + self.launcher.answer_timeout_s
                )
            except TimeoutError:
                self._unanswered(
                    f"the worker launcher did not answer within {timeout + self.launcher.answer_timeout_s:g} s"
                )
            except LauncherGone as e:
                self.lost = str(e)
        return self.returncode

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs (or its launcher
        has not yet said it started)."""
        self._resolve(0.0)
        if self._pid is None and self.lost is None:
            return None
        return self._status(0.0)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for it to exit; ``subprocess.TimeoutExpired`` after ``timeout`` seconds. Returns
        None when the launcher exited first (then its fate is unknown)."""
        code = self._status(3600.0 if timeout is None else timeout)
        if code is None and self.lost is None:
            raise subprocess.TimeoutExpired(f"reward worker {self._pid}", timeout)
        return code

    def kill(self) -> None:
        """SIGKILL it (unless it has exited, or its launcher is gone: then its pid may be another's)."""
        if self.pid is not None and self._status(0.0) is None and self.lost is None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def exit_reason(self) -> str:
        """How it ended, in words (waits up to 5 s for it to end)."""
        try:
            code = self.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "still running after 5 s"
        return (self.lost or "unknown") if code is None else describe_exit(code)


def describe_exit(code: int) -> str:
    """An exit code as ``Popen.returncode`` has it (negative: the signal that ended it), in words.

    Example:
        >>> describe_exit(-9), describe_exit(3), describe_exit(0)
        ('killed by SIGKILL', 'exit code 3', 'exit code 0')
    """
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# ----------------------------------------------------------------------------- the launcher side


def _resolve(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _launcher_main(fd: int, preload: str) -> None:
    """The launcher: preload, then fork a worker per ``spawn`` and report exit codes per ``wait``."""
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    _resolve(preload)()
    gc.freeze()  # what preload made stays out of the workers' collections: no pass over it, no page copied by one
    codes: dict[int, int] = {}
    while True:
        try:
            (rid, op, args), fds = frames.recv(sock, max_fds=3)
        except (EOFError, OSError):
            return  # the parent exited
        try:
            if op == "spawn":
                value = _fork_worker(sock, fds, *args)
            elif op == "wait":
                value = _wait(codes, *args)
            else:
                raise ValueError(f"unknown launcher request {op!r}")
        except Exception as e:
            value = e
        finally:
            for f in fds:
                os.close(f)
        try:
            frames.send(sock, (rid, value))
        except OSError:
            return


def _wait(codes: dict[int, int], pid: int, timeout: float) -> int | None:
    """Reap ``pid`` within ``timeout`` seconds; its exit code as ``Popen.returncode`` has it, or None."""
    end = time.monotonic() + timeout
    while pid not in codes:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            raise ValueError(f"process {pid} is not a worker of this launcher") from None
        if got:
            codes[pid] = os.waitstatus_to_exitcode(status)
        elif time.monotonic() >= end:
            return None
        else:
            time.sleep(0.005)
    return codes[pid]


def _fork_worker(control: socket.socket, fds: list[int], target: str, env: dict, cwd: str, path: list[str]) -> int:
    if len(fds) != 3:
        raise ValueError(f"a spawn request carries 3 file descriptors (socket, stdout, stderr); got {len(fds)}")
    pid = os.fork()
    if pid:
        return pid
    run_and_exit(_worker, control, fds, target, env, cwd, path)


def _worker(control: socket.socket, fds: list[int], target: str, env: dict, cwd: str, path: list[str]) -> None:
    """In the forked worker: its session, output, environment, directory and path, then ``target(socket)``."""
    control.close()
    os.setsid()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fds[1], 1)
    os.dup2(fds[2], 2)
    os.close(fds[1])
    os.close(fds[2])
    os.environ.clear()
    os.environ.update(env)
    try:
        os.chdir(cwd)
    except OSError:
        pass
    sys.path[:] = [""] + [p for p in path if p]
    importlib.invalidate_caches()  # modules written since the launcher started
    _resolve(target)(fds[0])


def run_and_exit(function, *args) -> NoReturn:
    """In a forked process: ``function(*args)``, then ``os._exit`` with its exit code (``SystemExit``'s; 1 on
    any other exception, its traceback printed), Python's output flushed first. A fork must not return
    into, or run the exit handlers of, the process it was forked from."""
    code = 1
    try:
        function(*args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
