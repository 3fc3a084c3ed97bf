"""StepProgressBar: Lightning's rich progress bar, without ``Epoch 0/-2`` on a run bounded by steps.

An RL run is bounded by ``trainer.max_steps``; Lightning then sets ``max_epochs = -1`` (no bound)
and its rich bar prints ``Epoch {epoch}/{max_epochs - 1}``, i.e. ``Epoch 0/-2``. This bar prints
``Epoch 0`` there, as Lightning's does when no epoch bound was ever set, and is Lightning's
otherwise. The ``lit-rlvr`` CLI uses it where Lightning would use its own rich bar.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override


class StepProgressBar(RichProgressBar):
    """Lightning's :class:`~lightning.pytorch.callbacks.RichProgressBar`; ``Epoch 3``, not ``Epoch 3/-2``, without an epoch bound.

    Example:
        >>> from types import SimpleNamespace
        >>> bar = StepProgressBar()
        >>> bar._trainer = SimpleNamespace(max_epochs=-1)  # max_steps alone
        >>> bar._get_train_description(0).strip()
        'Epoch 0'
        >>> bar._trainer = SimpleNamespace(max_epochs=3)
        >>> bar._get_train_description(0).strip()
        'Epoch 0/2'
    """

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs == -1:  # no epoch bound: Lightning would print "/-2"
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"  # padded as Lightning pads it
        return super()._get_train_description(current_epoch)
