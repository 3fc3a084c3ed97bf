"""Run a command in its own process group as a child subreaper, and record how every process of it ended.

    python subreaper.py OUT_JSON COMMAND...

A process that Lightning's launcher starts (rank 1 of ``--trainer.devices=2``) is a child of rank 0,
not of the test; when rank 0 exits first, it becomes this process's child (``PR_SET_CHILD_SUBREAPER``),
so its exit status is known too. Writes ``{"exits": {pid: exit code}}`` (a negative code: killed by
that signal) once no process is left, and exits with the command's own code.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(out: str, command: list[str]) -> int:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    if "tests.processes" in sys.modules:  # forked by the tests: its idle sibling is not one of the command's
        sys.modules["tests.processes"].end_sibling()
    main_pid = start(command)
    exits: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        exits[pid] = os.waitstatus_to_exitcode(status)
    with open(out, "w") as f:
        json.dump({"main": main_pid, "exits": exits}, f)
    return exits.get(main_pid, 1) & 0xFF


def start(command: list[str]) -> int:
    """The command's first process, leading a process group of its own (``os.killpg(pid, …)``): forked
    from this one when it is ``python -m lit_rlvr.cli …`` and this script runs where the tests fork their
    runs (tests/processes.py: torch, transformers and Lightning already imported), else started afresh."""
    if command[:3] == [sys.executable, "-m", "lit_rlvr.cli"] and "lit_rlvr.cli.lightning_cli" in sys.modules:
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            from tests import processes

            processes.run_forked(None, command[3:])
        with contextlib.suppress(OSError):  # the child's own setpgid may come first
            os.setpgid(pid, pid)
        return pid
    return os.posix_spawnp(command[0], command, os.environ, setpgroup=0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
