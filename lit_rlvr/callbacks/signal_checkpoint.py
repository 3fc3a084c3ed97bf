"""SignalCheckpoint: on SIGTERM or Ctrl-C, finish the step, save a resumable checkpoint, exit non-zero.

A scheduler stops a job with SIGTERM (SLURM before the time limit or on preemption, Kubernetes,
``kill``). Lightning's own handler ends the run at the next batch with ``SIGTERMException``, a
``SystemExit`` without a code: the process exited 0, looking like success, and kept only the
checkpoints written before the signal. Under DDP it also deadlocks: it runs a ``dist.broadcast``
inside the signal handler, on whichever ranks got the signal, and rank 0 sends the signal on to the
ranks it launched, so a rank handles it twice; the ranks then wait in collectives that never match.

This callback (added by the ``lit-rlvr`` CLI) replaces Lightning's SIGTERM handler, and Python's
SIGINT one, with one that only notes the signal, from the start of the sanity check or of training
(Lightning installs its own just before). A signal during ``fit``:

1. lets the training step in progress finish (its rollouts, rewards and optimizer step);
2. is agreed on at the end of that step by all ranks with one all-reduce (the largest signal
   number any rank received), so a signal to one rank, to rank 0 or to the whole process group
   stops every rank at the same step;
3. saves ``<default_root_dir>/checkpoints/last-interrupted.ckpt`` (a fixed path, whatever the
   logger's version folder) with ``trainer.save_checkpoint`` on every rank, as Lightning's
   checkpoint writers need under DDP and FSDP (rank 0 or each shard's owner writes, all wait),
   and logs that step's metrics (its row in ``metrics.csv``, whatever ``log_every_n_steps``) and
   flushes the loggers;
4. exits with ``128 + the signal's number`` (143 for SIGTERM, 130 for SIGINT), as a shell reports
   a process ended by that signal, so schedulers and scripts see a failure, and requeue.

A signal during a validation pass inside ``fit`` takes effect at the end of the next training step;
one during ``lit-rlvr validate`` stops at the end of the validation batch in progress (nothing to
save). Ctrl-C (SIGINT) goes the same way; a second Ctrl-C stops at once, without a checkpoint
(exit 1). Resume with the same command and ``--ckpt_path <the path it printed>``. A ``fit`` that
finishes removes the file, so a requeued job that passes ``--ckpt_path`` whenever the file exists
never goes back to an older state.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

FILENAME = "last-interrupted.ckpt"
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalCheckpoint(Callback):
    """Turn SIGTERM / SIGINT during ``fit`` into a checkpoint and a non-zero exit (module docstring).

    Args:
        dirpath: where to save ``last-interrupted.ckpt`` (None: ``<default_root_dir>/checkpoints``).
    """

    def __init__(self, dirpath: str | None = None):
        self.dirpath = dirpath
        self.signum: int | None = None  # the signal this process received
        self.saved: str | None = None  # the checkpoint written at the signal
        self._previous: dict[int, Any] = {}  # the handlers this callback replaced
        self._rank = 0

    def checkpoint_path(self, trainer: Trainer) -> Path:
        """Where the checkpoint at a signal goes."""
        folder = self.dirpath if self.dirpath is not None else os.path.join(trainer.default_root_dir, "checkpoints")
        return Path(folder) / FILENAME

    # ------------------------------------------------------------------------------- the handler
    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.signum, self.saved, self._previous = None, None, {}  # Lightning restored its handlers after a last run

    @override
    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)

    def _install(self, trainer: Trainer) -> None:
        """Replace Lightning's SIGTERM handler (installed just before the run's first hook that calls
        this) and Python's SIGINT one with :meth:`_on_signal`."""
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        if trainer.received_sigterm and self.signum is None:  # it came before this handler: Lightning's saw it
            self.signum = signal.SIGTERM
        self._rank = trainer.global_rank
        self._previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}

    def _on_signal(self, signum: int, frame: Any) -> None:
        """Note the signal, nothing else: the ranks agree on it at the end of the step."""
        if self.signum is not None:
            if signum == signal.SIGINT:  # the second Ctrl-C: stop now
                signal.signal(signal.SIGINT, signal.default_int_handler)
                raise KeyboardInterrupt
            return  # a repeated SIGTERM: the stop is under way
        self.signum = signum
        again = " (Ctrl-C again: stop at once)" if signum == signal.SIGINT else ""
        message = f"lit_rlvr: rank {self._rank} received {signal.Signals(signum).name}: stopping at the end of this step{again}\n"
        with contextlib.suppress(OSError):  # not print(): the handler may interrupt a write to the same buffered stream
            os.write(2, message.encode())

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Lightning restores the handlers it found before ours first; only undo what is still ours
        if threading.current_thread() is threading.main_thread():
            for s, handler in self._previous.items():
                if signal.getsignal(s) == self._on_signal:
                    signal.signal(s, handler)
        self._previous = {}

    # ------------------------------------------------------------------------------- the stop
    def agreed_signal(self, trainer: Trainer) -> int:
        """The largest signal number any rank received (0: none), with one all-reduce under DDP/FSDP."""
        received = self.signum or 0
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([received], dtype=torch.int64, device=trainer.strategy.root_device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            received = int(flag.item())
        return received

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        signum = self.agreed_signal(trainer)
        if not signum:
            return
        path, name = self.checkpoint_path(trainer), signal.Signals(signum).name
        trainer.save_checkpoint(path)  # every rank: a collective under DDP/FSDP
        self.saved = str(path)
        self._log_the_step(trainer)
        rank_zero_info(
            f"lit_rlvr: stopped by {name} after step {trainer.global_step}; saved {path}. "
            f"Resume with the same command and --ckpt_path {path}"
        )
        raise SIGTERMException(128 + signum)  # what a shell reports for a process ended by the signal

    @staticmethod
    def _log_the_step(trainer: Trainer) -> None:
        """Send the stopped step's metrics to the loggers and flush them, as Lightning does for a run's
        last step. Lightning logs a step's metrics only after ``on_train_batch_end``, where the stop is
        raised, so the step trained and checkpointed would have no row in ``metrics.csv``. Every rank
        calls it, as Lightning does (a ``sync_dist`` metric is a collective); the loggers write on rank 0.
        """
        trainer.should_stop = True  # the row is written whatever log_every_n_steps, as for a run's last step
        connector = trainer._logger_connector  # no public API logs a step's metrics before the step ends
        connector.on_batch_end()
        connector.update_train_step_metrics()
        for logger in trainer.loggers:
            logger.save()

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.state.fn != TrainerFn.VALIDATING:
            return  # inside fit: at the end of the next training step
        if signum := self.agreed_signal(trainer):
            rank_zero_info(f"lit_rlvr: validation stopped by {signal.Signals(signum).name}")
            raise SIGTERMException(128 + signum)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # the run got past the signal (it resumed and finished): an older state must not be resumed by mistake
        path = self.checkpoint_path(trainer)
        if trainer.is_global_zero and path.is_file():
            trainer.strategy.remove_checkpoint(path)
            rank_zero_info(f"lit_rlvr: removed {path}, the checkpoint of an earlier interruption (this run finished)")

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # Lightning's own stop, for a SIGTERM that came before this callback's handler (one rank: it
        # cannot be agreed on any more); a crash leaves the state mid-step: nothing is saved
        if isinstance(exception, SIGTERMException) and exception.code is None:
            exception.code = 128 + int(signal.SIGTERM)
