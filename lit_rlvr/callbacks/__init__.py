"""Lightning Callbacks: the engineering around the RL recipe (one class per file)."""

from lit_rlvr.callbacks.advantage_schedule import AdvantageSchedule, Phase
from lit_rlvr.callbacks.metrics_writer import MetricsWriter
from lit_rlvr.callbacks.rollout import RolloutCallback

__all__ = ["AdvantageSchedule", "MetricsWriter", "Phase", "RolloutCallback"]
