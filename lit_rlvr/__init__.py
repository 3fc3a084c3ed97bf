"""lit_rlvr: RL with verifiable rewards that preserves diversity, the Lightning way.

The public API, importable from the package itself::

    from lit_rlvr import RLVRModule, RolloutCallback, PromptDataModule, DatasetSpec, LossOptions, PassAtK

The names load on first use (PEP 562), so ``import lit_rlvr.rewards`` in a reward worker or the
vLLM plug-in in vLLM's processes does not import torch, Lightning and transformers with them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.2.0"

# public name -> the module that defines it
_EXPORTS = {
    # the recipe and its option groups
    "RLVRModule": "lit_rlvr.module",
    "PolicyOptions": "lit_rlvr.options",
    "LoraOptions": "lit_rlvr.options",
    "SamplingParams": "lit_rlvr.options",
    "LossOptions": "lit_rlvr.options",
    "EntropyOptions": "lit_rlvr.options",
    "AnchorOptions": "lit_rlvr.options",
    "KLOptions": "lit_rlvr.options",
    "BatchingOptions": "lit_rlvr.options",
    "ScoringOptions": "lit_rlvr.options",
    "EvalOptions": "lit_rlvr.options",
    "RolloutCorrection": "lit_rlvr.options",
    "DynamicSampling": "lit_rlvr.options",
    # the data
    "PromptDataModule": "lit_rlvr.data",
    "DatasetSpec": "lit_rlvr.data",
    "ValSet": "lit_rlvr.data",
    "CacheOptions": "lit_rlvr.data",
    "GoldCheck": "lit_rlvr.data",
    "PromptFormat": "lit_rlvr.data",
    # the callbacks
    "RolloutCallback": "lit_rlvr.callbacks",
    "HFExport": "lit_rlvr.callbacks",
    "PassCountsWriter": "lit_rlvr.callbacks",
    "MetricsWriter": "lit_rlvr.callbacks",
    "AdvantageSchedule": "lit_rlvr.callbacks",
    "SignalCheckpoint": "lit_rlvr.callbacks",
    # the metrics
    "PassAtK": "lit_rlvr.metrics",
    "MajorityAtK": "lit_rlvr.metrics",
    "ValidationPanel": "lit_rlvr.metrics",
    # the typed contracts
    "TrainBatch": "lit_rlvr.contracts",
    "ValBatch": "lit_rlvr.contracts",
    "StepData": "lit_rlvr.contracts",
    "AnchorBatch": "lit_rlvr.contracts",
    # plug-ins: rewards and the registries of the functional core
    "register_reward": "lit_rlvr.rewards",
    "ADVANTAGES": "lit_rlvr.functional",
    "DIVERGENCES": "lit_rlvr.functional",
    "POLICY_LOSSES": "lit_rlvr.functional",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lit_rlvr' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from lit_rlvr.callbacks import (
        AdvantageSchedule,
        HFExport,
        MetricsWriter,
        PassCountsWriter,
        RolloutCallback,
        SignalCheckpoint,
    )
    from lit_rlvr.contracts import AnchorBatch, StepData, TrainBatch, ValBatch
    from lit_rlvr.data import CacheOptions, DatasetSpec, GoldCheck, PromptDataModule, PromptFormat, ValSet
    from lit_rlvr.functional import ADVANTAGES, DIVERGENCES, POLICY_LOSSES
    from lit_rlvr.metrics import MajorityAtK, PassAtK, ValidationPanel
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import (
        AnchorOptions,
        BatchingOptions,
        DynamicSampling,
        EntropyOptions,
        EvalOptions,
        KLOptions,
        LoraOptions,
        LossOptions,
        PolicyOptions,
        RolloutCorrection,
        SamplingParams,
        ScoringOptions,
    )
    from lit_rlvr.rewards import register_reward
