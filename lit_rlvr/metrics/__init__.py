"""torchmetrics ``Metric``s for evaluation: thin shells over :mod:`lit_rlvr.functional.metrics`.

Every state is a sum (``dist_reduce_fx="sum"``), so a multi-process result equals the
single-process one over the union of the data.
"""

from lit_rlvr.metrics.behaviour import DistinctToolSequences, TurnBehaviour
from lit_rlvr.metrics.diversity import (
    DistinctAnswers,
    DistinctCompletions,
    DistinctCorrectAnswers,
    MeanTokenEntropy,
    ZeroVarianceShare,
)
from lit_rlvr.metrics.majority import MajorityAtK
from lit_rlvr.metrics.panel import ValidationPanel, ValidationPanels
from lit_rlvr.metrics.passk import PassAtK, PassHatK

__all__ = [
    "DistinctAnswers",
    "DistinctCompletions",
    "DistinctCorrectAnswers",
    "DistinctToolSequences",
    "MajorityAtK",
    "MeanTokenEntropy",
    "PassAtK",
    "PassHatK",
    "TurnBehaviour",
    "ValidationPanel",
    "ValidationPanels",
    "ZeroVarianceShare",
]
