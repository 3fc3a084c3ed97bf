"""Run a command in its own process group as a child subreaper, and record how every process of it ended.

    python subreaper.py OUT_JSON COMMAND...

A process that Lightning's launcher starts (rank 1 of ``--trainer.devices=2``) is a child of rank 0,
not of the test; when rank 0 exits first, it becomes this process's child (``PR_SET_CHILD_SUBREAPER``),
so its exit status is known too. Writes ``{"exits": {pid: exit code}}`` (a negative code: killed by
that signal) once no process is left, and exits with the command's own code.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(out: str, command: list[str]) -> int:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    main_pid = os.posix_spawnp(
        command[0], command, os.environ, setpgroup=0
    )  # a group of its own: os.killpg(main_pid, …)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
