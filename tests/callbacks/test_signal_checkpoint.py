"""SignalCheckpoint in one process: its handler replaces Lightning's, the stop comes at the step's end.

The multi-process behaviour (DDP, a signal to the group or to one rank) is tested through
``lit-rlvr fit`` in tests/integration/test_faults.py.
"""

from __future__ import annotations

import csv
import os
import signal

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from lit_rlvr.callbacks import SignalCheckpoint


class Signals(L.LightningModule):
    """A linear model that sends itself ``signum`` during training step / validation batch ``at``."""

    def __init__(self, signum: int, at: int):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.signum, self.at = signum, at
        self.trained, self.validated = 0, 0

    def training_step(self, batch, batch_idx):
        if batch_idx == self.at:
            os.kill(os.getpid(), self.signum)
        self.trained += 1
        loss = self.layer(batch).sum()
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        if batch_idx == self.at:
            os.kill(os.getpid(), self.signum)
        self.validated += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(tmp_path, callback: SignalCheckpoint, **kwargs) -> L.Trainer:
    options = dict(
        max_steps=10,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    return L.Trainer(**{**options, **kwargs}, callbacks=[callback])


def data() -> DataLoader:
    return DataLoader(torch.ones(10, 2), batch_size=1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_fit_stops_after_the_step_with_a_checkpoint_and_the_signals_exit_code(tmp_path, signum):
    callback, model = SignalCheckpoint(), Signals(signum, at=3)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    run = trainer(tmp_path, callback, logger=CSVLogger(tmp_path / "logs"), log_every_n_steps=3)
    with pytest.raises(SystemExit) as stop:
        run.fit(model, data())
    assert stop.value.code == 128 + signum and model.trained == 4  # the step in progress finished, no other began
    assert not run.received_sigterm  # Lightning's handler never saw it: its broadcast would deadlock DDP
    saved = torch.load(callback.saved, weights_only=False)
    assert callback.saved == str(tmp_path / "checkpoints" / "last-interrupted.ckpt") and saved["global_step"] == 4
    # the checkpointed step (index 3: global_step - 1) has its row in metrics.csv, off the logging interval
    # too, as a run's last step has
    (metrics,) = (tmp_path / "logs").rglob("metrics.csv")
    assert [row["step"] for row in csv.DictReader(metrics.open()) if row["train/loss"]] == ["2", "3"]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # the process's own, again


def test_validate_stops_after_the_batch(tmp_path):
    callback, model = SignalCheckpoint(), Signals(signal.SIGTERM, at=1)
    with pytest.raises(SystemExit) as stop:
        trainer(tmp_path, callback, limit_val_batches=None).validate(model, data())
    assert stop.value.code == 143 and model.validated == 2 and callback.saved is None


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    class TwiceCtrlC(Signals):
        def training_step(self, batch, batch_idx):
            if batch_idx == 1:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
            return super().training_step(batch, batch_idx)

    callback, model = SignalCheckpoint(), TwiceCtrlC(signal.SIGINT, at=-1)
    with pytest.raises(SystemExit) as stop:  # Lightning's KeyboardInterrupt path: exit 1
        trainer(tmp_path, callback).fit(model, data())
    assert stop.value.code == 1 and model.trained == 1 and callback.saved is None
