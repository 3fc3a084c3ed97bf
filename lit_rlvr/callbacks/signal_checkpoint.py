"""SignalCheckpoint: on SIGTERM or Ctrl-C, finish the step, save a resumable checkpoint, exit non-zero.

A scheduler stops a job with SIGTERM (SLURM before the time limit or on preemption, Kubernetes,
``kill``). Lightning notices it (and passes it to the ranks it launched) and stops at the next
batch boundary with ``SIGTERMException``, which is a ``SystemExit`` without a code: the process
exited 0, looking like success, and kept only the checkpoints written before the signal. With this
callback (added by the ``lit-rlvr`` CLI) a signal during ``fit``:

1. lets the training step in progress finish (its rollouts, rewards and optimizer step);
2. saves ``<default_root_dir>/checkpoints/last-interrupted.ckpt`` (a fixed path, whatever the
   logger's version folder) on every rank together, as ``trainer.save_checkpoint`` does for any
   checkpoint: Lightning stops every rank at the same batch (rank 0 broadcasts the
   signal before each one), so the checkpoint is the same step's everywhere;
3. exits with ``128 + the signal's number`` (143 for SIGTERM, 130 for SIGINT), as a shell reports
   a process ended by that signal, so schedulers and scripts see a failure, and requeue.

Ctrl-C (SIGINT) goes the same way; a second Ctrl-C stops at once, without a checkpoint (exit 1).
Resume with the same command and ``--ckpt_path <the path it printed>``. A ``fit`` that finishes
removes the file, so a requeued job that passes ``--ckpt_path`` whenever the file exists never
goes back to an older state.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

FILENAME = "last-interrupted.ckpt"


class SignalCheckpoint(Callback):
    """Turn SIGTERM / SIGINT during ``fit`` into a checkpoint and a non-zero exit (module docstring).

    Args:
        dirpath: where to save ``last-interrupted.ckpt`` (None: ``<default_root_dir>/checkpoints``).
    """

    def __init__(self, dirpath: str | None = None):
        self.dirpath = dirpath
        self.signum: int | None = None  # the signal that stopped the run (SIGINT seen by this callback)
        self.saved: str | None = None  # the checkpoint written at the signal
        self._previous_sigint: Any = None

    def checkpoint_path(self, trainer: Trainer) -> Path:
        """Where the checkpoint at a signal goes."""
        folder = self.dirpath if self.dirpath is not None else os.path.join(trainer.default_root_dir, "checkpoints")
        return Path(folder) / FILENAME

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning's own SIGTERM handler is in place by now; Ctrl-C is routed to it
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.signum is not None:  # the second Ctrl-C: stop now
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.signum = signum
        rank_zero_info("lit_rlvr: Ctrl-C: stopping after this training step with a checkpoint (Ctrl-C again: stop at once)")
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler):  # Lightning's: passes the signal to the ranks it launched, stops at the next batch
            handler(signum, frame)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # the run got past the signal (it resumed and finished): an older state must not be resumed by mistake
        path = self.checkpoint_path(trainer)
        if trainer.is_global_zero and path.is_file():
            trainer.strategy.remove_checkpoint(path)
            rank_zero_info(f"lit_rlvr: removed {path}, the checkpoint of an earlier interruption (this run finished)")

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return  # a crash: the state may be mid-step, nothing is saved
        signum = self.signum or signal.SIGTERM
        name = signal.Signals(signum).name
        if trainer.state.fn == TrainerFn.FITTING:
            path = self.checkpoint_path(trainer)
            trainer.save_checkpoint(path)  # every rank: a collective under DDP/FSDP
            self.saved = str(path)
            rank_zero_info(
                f"lit_rlvr: stopped by {name} after step {trainer.global_step}; saved {path}. "
                f"Resume with the same command and --ckpt_path {path}"
            )
        exception.code = 128 + int(signum)  # what a shell reports for a process ended by the signal
