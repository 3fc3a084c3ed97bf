"""Run ``vllm serve`` as a child that dies with the trainer (started by :class:`~lit_rlvr.rollout.server_processes.VLLMServer`).

``python server_guard.py -- <vllm serve arguments>``: this process asks the kernel for SIGTERM
when its parent (the trainer) dies, even by ``kill -9`` (``PR_SET_PDEATHSIG``), and on SIGTERM or
SIGINT kills its whole process group — the API server and vLLM's engine-core and worker
processes — so no server outlives the run. Run as a file, not ``-m``: it imports nothing of lit_rlvr.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1


def _kill_group(signum=None, frame=None) -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit("usage: server_guard.py -- <command>")
    command = argv[argv.index("--") + 1 :]
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: teardown and atexit still stop the group
        pass
    signal.signal(signal.SIGTERM, _kill_group)
    signal.signal(signal.SIGINT, _kill_group)
    if os.getppid() == 1:  # the trainer died before prctl took effect
        return 1
    code = subprocess.call(command)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the server is gone: stop what it left (engine core, workers)
    os.killpg(os.getpgid(0), signal.SIGTERM)
    return 128 - code if code < 0 else code  # killed by signal s: 128 + s, as a shell reports it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
