"""Lightning Callbacks: the engineering around the RL recipe (one class per file)."""

from lit_rlvr.callbacks.advantage_schedule import AdvantageSchedule, Phase
from lit_rlvr.callbacks.export import HFExport
from lit_rlvr.callbacks.metrics_writer import MetricsWriter
from lit_rlvr.callbacks.pass_counts import PassCountsWriter
from lit_rlvr.callbacks.progress import StepProgressBar
from lit_rlvr.callbacks.rollout import RolloutCallback
from lit_rlvr.callbacks.signal_checkpoint import SignalCheckpoint

__all__ = [
    "AdvantageSchedule",
    "HFExport",
    "MetricsWriter",
    "PassCountsWriter",
    "Phase",
    "RolloutCallback",
    "SignalCheckpoint",
    "StepProgressBar",
]
