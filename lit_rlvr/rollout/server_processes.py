"""The ``vllm serve`` processes of ``engine: vllm_server``: started, watched, stopped, logged.

The engine client that generates and syncs weights over HTTP is :mod:`lit_rlvr.rollout.server`.

**The server's life**: without ``urls``, :class:`VLLMServer` starts ``vllm serve`` on
127.0.0.1, a free port, a fresh API key (passed by environment, never on the command line) and a
log file of its own, under a guard that kills it with the trainer (teardown, Ctrl-C, a crash,
even ``kill -9``). A server that does not come up ends the run within ``startup_timeout_s``
with an error that names its log.

Security: vLLM exposes the weight routes only in its dev mode (``VLLM_SERVER_DEV_MODE=1``) and its
API key guards ``/v1`` only, not them; any local user (and anyone who reaches the port) could
replace the weights, write files (``/collective_rpc``) or stall the run (a dangling
``/start_weight_update``). A server started here runs lit_rlvr's
:class:`~lit_rlvr.vllm_plugin.KeyOnEveryRoute` middleware (the key on every route), gets its key
in ``VLLM_API_KEY`` (the process list shows command lines to every user), keeps its log and
vLLM's internal sockets in a folder only the trainer's user can open, and binds 127.0.0.1;
binding another interface needs ``allow_remote_weight_routes: true`` (plain HTTP shows the key to
the network). A server given by URL should run the same middleware (a warning says when its
weight routes answer without the key) and be reachable only from the trainer's network.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lit_rlvr.rollout.engine import announce
from lit_rlvr.vllm_plugin import KeyOnEveryRoute

_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
KEY_MIDDLEWARE = (
    f"{KeyOnEveryRoute.__module__}.{KeyOnEveryRoute.__qualname__}"  # `vllm serve --middleware`: the key on every route
)
# the engine's watch over a request in flight (servers_fault)
_HEALTH_EVERY_S = 10.0  # how often each server's /health is asked
_UNHEALTHY_FOR_S = 60.0  # a server whose /health has not answered 200 for this long ends the run
_HEALTH_TIMEOUT_S = 10.0
_STOPPED_FOR_S = 30.0  # a server process stopped (SIGSTOP) this long ends the run (the engine's watch)


class ServerError(RuntimeError):
    """A rollout server did not start, cannot be reached, failed, or answered what vLLM does not (names its log or URL)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """Whether nothing listens on ``host:port`` now (a server started there would fail to bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def private_folder() -> Path:
    """A new folder in the temp folder that only this user can open (mode 0700, a fresh name)."""
    return Path(tempfile.mkdtemp(prefix="lit_rlvr_vllm_"))


def new_log(folder: Path, port: int) -> tuple[Path, Any]:
    """A new log file in ``folder`` and its handle: a fresh name created exclusively (``O_EXCL``,
    mode 0600), so a file or symlink planted in a shared folder is never written through."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"lit_rlvr_vllm_server_{port}_", suffix=".log", dir=folder)
    return Path(path), os.fdopen(fd, "ab")


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time)`` of process ``pid`` from ``/proc/<pid>/stat``; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the name: state is field 3, start time field 22
    return fields[0], int(fields[19])


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (every thread's)."""
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            kids += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    except OSError:
        pass
    return kids


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it, each before its children."""
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += _children(tree[-1])
    return tree


def _label(pid: int) -> str:
    """A process's title (vLLM names its processes ``VLLM::EngineCore``, ``VLLM::Worker_TP0``, …)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        argv0 = ""
    return f"{os.path.basename(argv0) or 'process'} (pid {pid})"


def exit_text(code: int) -> str:
    """``exited with code c``, with the signal when a shell-style code (128 + s) or a negative
    ``Popen.returncode`` (-s) says it was killed.

    Example:
        >>> exit_text(137), exit_text(-15), exit_text(1)
        ('exited with code 137 (killed by signal 9, SIGKILL)', 'exited with code -15 (killed by signal 15, SIGTERM)', 'exited with code 1')
    """
    number = code - 128 if code > 128 else -code if code < 0 else None
    if number is None:
        return f"exited with code {code}"
    try:
        return f"exited with code {code} (killed by signal {number}, {signal.Signals(number).name})"
    except ValueError:
        return f"exited with code {code} (killed by signal {number})"


class ServerProcesses:
    """The processes of a started server, watched from the trainer.

    The guard (a child of the trainer), the API server (the guard's child) and the API server's
    children when it came up (vLLM's engine cores, its coordinator): one of them gone means the
    server is broken, even while the API server still holds requests open. Any process of the
    server stopped (SIGSTOP) for ``stopped_for`` seconds is reported too.
    """

    def __init__(self, guard: subprocess.Popen):
        self.guard = guard
        self.watched: list[tuple[int, int, str]] = []  # (pid, start time, label)
        self._stopped_since: dict[int, float] = {}

    def record(self) -> None:
        """Remember the API server and its children as they are now (call once the server is up)."""
        api = _children(self.guard.pid)
        self.watched = [
            (pid, stat[1], "the API server" if pid in api else _label(pid))
            for pid in api + [c for p in api for c in _children(p)]
            if (stat := _stat(pid)) is not None
        ]

    def fault(self, stopped_for: float | None = None) -> str | None:
        """What is wrong with the server's processes (``"is broken: … is gone"``, ``"is stopped: …"``,
        ``"exited with code c"``); None when nothing is seen. ``stopped_for``: default ``_STOPPED_FOR_S``."""
        stopped_for = _STOPPED_FOR_S if stopped_for is None else stopped_for
        code = self.guard.poll()
        if code is not None:
            return exit_text(code)
        for pid, start, label in self.watched:
            stat = _stat(pid)
            if stat is None or stat[1] != start or stat[0] in "ZX":
                return f"is broken: {label} is gone (killed, e.g. by the OOM killer, which picks the engine core)"
        now = time.monotonic()
        stopped = {}
        for pid in _tree(self.guard.pid):
            if (stat := _stat(pid)) is not None and stat[0] in "Tt":
                stopped[pid] = self._stopped_since.get(pid, now)
        self._stopped_since = stopped
        for pid, since in stopped.items():
            if now - since >= stopped_for:
                return f"is stopped: {_label(pid)} has been stopped (SIGSTOP or a debugger) for {now - since:.0f} s"
        return None


class VLLMServer:
    """One ``vllm serve`` process started by the trainer and stopped with it.

    Args:
        model_path: what the server loads.
        args: further ``vllm serve`` arguments (``--dtype``, ``--max-model-len``, …).
        host: interface to bind (127.0.0.1 unless ``allow_remote_weight_routes``).
        port: TCP port (None: a free one).
        api_key: the server's key (None: a fresh random one), given to it in ``VLLM_API_KEY`` and
            asked for on every route (:class:`~lit_rlvr.vllm_plugin.KeyOnEveryRoute`).
        log_dir: where its log file goes (None: a private folder in the temp folder).
        startup_timeout_s: how long it may take to answer ``/health``.
        allow_remote_weight_routes: allow binding a non-local interface (the key travels in
            plain HTTP: only on a trusted network).
        env: environment variables of the server on top of the trainer's (e.g.
            ``{CUDA_VISIBLE_DEVICES: "4,5,6,7"}``: generation on GPUs the trainer does not use).
    """

    def __init__(
        self,
        model_path: str,
        args: list[str] = (),
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        api_key: str | None = None,
        log_dir: str | None = None,
        startup_timeout_s: float = 600.0,
        allow_remote_weight_routes: bool = False,
        env: dict[str, str] | None = None,
    ):
        if host not in _LOCAL_HOSTS and not allow_remote_weight_routes:
            raise ValueError(
                f"rollout.engine_options.host={host!r}: the server's weight routes (/update_weights, …) are guarded by its "
                "API key only, which plain HTTP shows to anyone on the network, so a server started by lit_rlvr binds "
                f"127.0.0.1; set allow_remote_weight_routes: true to bind {host!r} on a network only the trainer reaches"
            )
        bind = host if host != "localhost" else "127.0.0.1"
        if port is not None and not port_is_free(bind, port):
            raise ServerError(
                f"rollout.engine_options.port={port}: something already listens on {bind}:{port}; "
                "choose another port, or leave port unset for a free one"
            )
        self.host, self.port = host, port or free_port(bind)
        self.api_key = api_key or secrets.token_hex(16)
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', 'localhost') else host}:{self.port}"
        self.folder = private_folder()  # vLLM's internal sockets, and the log unless log_dir is given
        self.log_path, self._log = new_log(Path(log_dir) if log_dir else self.folder, self.port)
        self._own_log_dir = log_dir is not None
        command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_path),
            "--host",
            host,
            "--port",
            str(self.port),
            "--logprobs-mode",
            "processed_logprobs",
            "--middleware",
            KEY_MIDDLEWARE,
            *args,
        ]
        guard = Path(__file__).with_name("server_guard.py")
        # unbuffered: vLLM logs to stdout, block-buffered into a file, so a line could reach the log long
        # after the request it is about (the log's tail is what a failure quotes)
        env = dict(
            os.environ,
            **{k: str(v) for k, v in (env or {}).items()},
            VLLM_SERVER_DEV_MODE="1",
            VLLM_API_KEY=self.api_key,
            VLLM_RPC_BASE_PATH=str(self.folder),
            PYTHONUNBUFFERED="1",
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(guard), "--", *command],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.processes = ServerProcesses(self.proc)
        atexit.register(self.stop)
        announce(
            f"lit_rlvr rollout engine: starting `vllm serve` for {model_path} on {self.url} (log: {self.log_path})"
        )
        self.wait_until_up(startup_timeout_s)
        self.processes.record()

    def wait_until_up(self, timeout_s: float) -> None:
        """Block until ``/health`` answers; :class:`ServerError` naming the log if it exits or times out."""
        import requests

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"the vLLM server {exit_text(self.proc.returncode)} while starting; {self.log_tail()}"
                )
            try:
                if requests.get(f"{self.url}/health", headers=self.headers, timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise ServerError(
            f"the vLLM server did not answer /health within {timeout_s:g} s "
            f"(rollout.engine_options.startup_timeout_s); {self.log_tail()}"
        )

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def state(self) -> str:
        """``is running``, or what is wrong (exited with code c, a process gone or stopped)."""
        return self.processes.fault(stopped_for=0.0) or "is running"

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's log, for errors."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = []
        return f"its log is {self.log_path}; last lines:\n  " + "\n  ".join(text)

    def stop(self) -> None:
        """Stop the server and its engine processes (idempotent)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the guard kills its whole group
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:  # whatever is left of the group (the guard is gone: the group keeps its id while it has members)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if not self._log.closed:
            self._log.close()
        if self._own_log_dir:  # the private folder holds only vLLM's sockets; else it holds the log, which errors name
            shutil.rmtree(self.folder, ignore_errors=True)


def servers_fault(
    servers: list[VLLMServer],
    urls: list[str],
    api_key: str | None,
    describe,
    answered: dict[str, float],
    asked: dict[str, float],
) -> str | None:
    """What is wrong with a server now (the watch of :meth:`~lit_rlvr.rollout.server.VLLMServerEngine._await`), or None:
    a started server's processes (``servers``), every server's ``/health`` (``urls``, asked with ``api_key`` every
    ``_HEALTH_EVERY_S``; ``asked`` and ``answered`` are the watch's times); ``describe()`` says what to tell the user."""
    import requests

    for server in servers:
        if (fault := server.processes.fault()) is not None:
            return f"the server lit_rlvr started {fault}; {server.log_tail()}"
    now = time.monotonic()
    for url in urls:
        if now - asked[url] < _HEALTH_EVERY_S:
            continue
        asked[url] = now
        try:
            healthy = (
                requests.get(
                    f"{url}/health",
                    headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
                    timeout=_HEALTH_TIMEOUT_S,
                ).status_code
                == 200
            )
        except requests.RequestException:
            healthy = False
        if healthy:
            answered[url] = time.monotonic()
        elif now - answered[url] >= _UNHEALTHY_FOR_S:
            return f"{url} has not answered /health for {now - answered[url]:.0f} s (dead, stopped or overloaded); {describe()}"
    return None


# ``vllm serve`` settings a started server gets from lit_rlvr (vLLM's argument destinations): in
# ``server_args`` they would override what the engine relies on (``processed_logprobs`` is π_old;
# the transfer backend is its own; the key guards every route; the trainer talks HTTP to host:port)
_OWNED = {
    "model": "model_path (the policy's path)",
    "model_tag": "model_path (the policy's path)",
    "host": "host",
    "port": "port",
    "uds": "host and port (lit_rlvr talks HTTP to host:port)",
    "grpc": "none: lit_rlvr talks HTTP",
    "api_key": "api_key (given to the server in VLLM_API_KEY)",
    "dtype": "dtype",
    "seed": "seed",
    "logprobs_mode": "none: lit_rlvr needs processed_logprobs",
    "weight_transfer_config": "weight_transfer",
    "enable_lora": "rollout.adapter_sync",
    "max_lora_rank": "rollout.adapter_sync (sized from the policy's LoRA rank)",
}


class _Unset(list):
    """A placeholder only a setting that ``server_args`` leaves alone keeps (compared by identity; a
    list, so that an ``append`` action copies it into a new one)."""


@functools.lru_cache(maxsize=1)
def _serve_parser():
    """vLLM's own ``vllm serve`` argument parser (built once: it takes seconds), raising instead of exiting."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def refuse(message: str):
        raise argparse.ArgumentError(None, message)

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    parser.error = refuse
    return parser


def owned_server_args(server_args: list[str]) -> list[str]:
    """The lit_rlvr-owned settings ``server_args`` would set, as ``"--flag is set by lit_rlvr (option: …)"``, read by
    vLLM's own parser: a prefix (``--hos``), ``_`` for ``-`` (``--logprobs_mode``), ``--flag=value``,
    dotted JSON keys (``--weight-transfer-config.backend``) and ``--config`` files are what vLLM
    would apply; ``ValueError`` when vLLM's parser refuses ``server_args``."""
    parser = _serve_parser()
    flags = {a.dest: max(a.option_strings, key=len, default="") for a in parser._actions}
    unset = {dest: _Unset() for dest in _OWNED if flags[dest]}  # argparse sets an absent positional to its default
    namespace = argparse.Namespace(**unset)
    try:
        parser.parse_args(list(server_args), namespace=namespace)
    except (argparse.ArgumentError, SystemExit) as err:
        raise ValueError(
            f"rollout.init_args.engine_options.server_args={list(server_args)}: vLLM's parser refuses them "
            f"({err if isinstance(err, argparse.ArgumentError) else 'it would exit'})"
        ) from None
    given = [dest for dest in _OWNED if getattr(namespace, dest) is not unset.get(dest)]  # an absent positional is None
    return [
        f"{flags[dest] or 'a positional argument (a model)'} is set by lit_rlvr (option: {_OWNED[dest]})"
        for dest in given
    ]


def check_server_options(
    *,
    weight_transfer: str = "file",
    nccl_master_address: str | None = None,
    max_concurrent_requests: int = 64,
    server_args: list[str] | None = None,
    **_,
) -> None:
    """Refuse an unknown transfer, NCCL without a rendezvous, no concurrency, or ``server_args``
    that vLLM refuses or that set what lit_rlvr sets itself on a started server (at start-up)."""
    if weight_transfer not in ("file", "nccl"):
        raise ValueError(f"weight_transfer must be 'file' or 'nccl', got {weight_transfer!r}")
    if weight_transfer == "nccl" and not nccl_master_address:
        raise ValueError("weight_transfer=nccl needs nccl_master_address (the trainer's address)")
    if max_concurrent_requests < 1:
        raise ValueError(f"max_concurrent_requests must be >= 1, got {max_concurrent_requests}")
    if owned := owned_server_args(server_args) if server_args else []:
        raise ValueError("rollout.init_args.engine_options.server_args: " + "; ".join(owned))
