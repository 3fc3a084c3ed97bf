"""Rank-fault detection: one operation on every rank, and the same error on every rank if it failed on any.

Under multi-process training (DDP, FSDP2) each rank runs its own rollout engine. When one rank's
engine raises, or its process dies, or it hangs in a C call, the others would wait for it in the
next collective until the process group's timeout (30 min by default) and then report a timeout
that names nobody. :meth:`RankGroup.run_on_all` runs the operation on this rank, then the ranks
exchange their status on a gloo group of their own:

- a rank whose operation raised is named, with its error, on every rank;
- a rank whose process ended (a crash, the OOM killer, a kill) is named as dead: gloo reports its
  closed connection at once, and each rank's host and pid, gathered when the group is made, say
  which rank on this host is gone (:func:`dead_ranks`, from ``/proc/<pid>/stat``);
- a rank that does not report within the operation's timeout plus ``skew_s`` (ranks start an
  operation apart) is named as stuck, by a monitored barrier.

Each case raises :class:`RolloutRankError` on every rank that is still alive. With one process
:meth:`RankGroup.run_on_all` is just the call.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist

SKEW_S = 10.0  # a rank waits this long for the others beyond an operation's timeout (ranks start apart)

T = TypeVar("T")


class RolloutRankError(RuntimeError):
    """A rollout engine operation failed, or did not finish in time, on some rank (raised on every rank)."""


class RankGroup:
    """The training ranks, as the operations that must succeed or fail together see them.

    Make one with :meth:`join` (a collective: every rank calls it at the same point); the default
    is the group of one process, whose :meth:`run_on_all` is the call itself.

    Args:
        group: a gloo process group of the training ranks (None: one process).
        peers: ``(host, pid)`` of every rank of ``group``, in rank order (to tell dead from late).
        skew_s: seconds a rank waits for the others beyond an operation's timeout.

    Example:
        >>> RankGroup().run_on_all("a sum", lambda: 1 + 1, timeout_s=None)
        2
    """

    def __init__(
        self, group: dist.ProcessGroup | None = None, peers: Sequence[tuple[str, int]] = (), skew_s: float = SKEW_S
    ):
        self.group, self.peers, self.skew_s = group, list(peers), skew_s

    @classmethod
    def join(cls, world_size: int, skew_s: float = SKEW_S) -> RankGroup:
        """The group of the ``world_size`` training ranks: a new gloo group and every rank's host and pid.

        A collective when ``world_size > 1`` and ``torch.distributed`` is initialised (every rank
        calls it); otherwise the group of one process, and nothing is exchanged.
        """
        if world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return cls(skew_s=skew_s)
        group = dist.new_group(backend="gloo")
        peers: list[tuple[str, int] | None] = [None] * dist.get_world_size(group)
        dist.all_gather_object(peers, (socket.gethostname(), os.getpid()), group=group)
        return cls(group, peers, skew_s)

    def run_on_all(self, what: str, fn: Callable[[], T], timeout_s: float | None) -> T:
        """``fn()`` on this rank; raise :class:`RolloutRankError` on every rank if it failed on any.

        ``fn`` may contain collectives only if every rank completes them even when it fails
        (e.g. the FSDP2 weight stream, which an engine always exhausts).

        Args:
            what: the operation, for the message (``"hf weight sync"``).
            fn: the operation on this rank.
            timeout_s: the operation's own limit; the others wait ``timeout_s + skew_s`` for a
                rank (None: the process group's timeout).

        Returns:
            What ``fn`` returned on this rank.

        Raises:
            RolloutRankError: on every rank, naming each rank that failed and its error (this
                rank's own exception is its ``__cause__``), the ranks that died, or those that did
                not finish in time. With one process, ``fn``'s own exception.
        """
        if self.group is None:
            return fn()
        try:
            out, error, cause = fn(), None, None
        except Exception as err:  # reported to every rank, then re-raised here with the others' view
            out, error, cause = None, f"{type(err).__name__}: {err}", err
        try:
            self._exchange(what, error, timeout_s)
        except RolloutRankError as err:
            raise err from cause
        return out

    def _exchange(self, what: str, error: str | None, timeout_s: float | None) -> None:
        """Every rank learns whether ``what`` succeeded everywhere (``error``: this rank's, None = success).

        A monitored barrier waits ``timeout_s + skew_s`` for every rank and names those that did not
        arrive (or, when a connection closed, those that died); then the ranks' errors are all-gathered.
        """
        world = dist.get_world_size(self.group)
        timeout = None if timeout_s is None else timedelta(seconds=timeout_s + self.skew_s)
        try:
            dist.monitored_barrier(self.group, timeout=timeout, wait_all_ranks=True)
        except RuntimeError as err:
            dead = dead_ranks(self.peers, dist.get_rank(self.group))
            if dead or "closed by peer" in str(err) or "reset by peer" in str(err):
                who = f"rank {', '.join(map(str, dead))} of {world}" if dead else "a rank on another host"
                raise RolloutRankError(
                    f"{what}: {who} died (its process ended: a crash, the OOM killer or a kill; see its log), so "
                    f"this rank stops too. ({err})"
                ) from None
            limit = "the process-group timeout" if timeout is None else f"{timeout.total_seconds():g} s"
            raise RolloutRankError(
                f"{what}: not every rank of {world} finished within {limit} (the operation's timeout + "
                f"{self.skew_s:g} s); a rank is stuck or slower than its limit, see its log. "
                f"Raise generate_timeout_s / sync_timeout_s if the work is legitimately slow. ({err})"
            ) from None
        errors: list[str | None] = [None] * world
        dist.all_gather_object(errors, error, group=self.group)
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            where = ", ".join(str(r) for r, _ in failed)
            raise RolloutRankError(
                f"{what} failed on rank {where} of {world}: " + "; ".join(f"rank {r}: {e}" for r, e in failed)
            )


def dead_ranks(peers: Sequence[tuple[str, int]], me: int) -> list[int]:
    """Ranks of ``peers`` (``(host, pid)`` per rank) on this host whose process has ended (or is a zombie).

    Example:
        >>> import os, socket
        >>> dead_ranks([(socket.gethostname(), os.getpid()), (socket.gethostname(), 2**22 + 1), ("elsewhere", 1)], me=0)
        [1]
    """
    host, out = socket.gethostname(), []
    for rank, (peer_host, pid) in enumerate(peers):
        if rank == me or peer_host != host:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        except OSError:  # no /proc (macOS): ask the kernel
            try:
                os.kill(pid, 0)
                state = "alive"
            except ProcessLookupError:
                state = "gone"
            except PermissionError:
                state = "alive"
        if state in ("gone", "Z", "X"):
            out.append(rank)
    return out
