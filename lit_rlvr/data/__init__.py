"""Prompts: dataset adapters, prompt formatting, resumable samplers and the PromptDataModule."""

from lit_rlvr.data.adapters import ADAPTERS, BadRowError, LoadedRows, load_rows, normalize_answer
from lit_rlvr.data.datamodule import CacheOptions, DatasetSpec, GoldCheck, PromptDataModule, ValSet
from lit_rlvr.data.prompts import PromptFormat, encode_prompt
from lit_rlvr.data.readers import BadRow, HFSource, read_records
from lit_rlvr.data.samplers import BatchKey, EvalShardSampler, PromptBatchSampler, anchor_batch_indices, epoch_order

__all__ = [
    "ADAPTERS",
    "BadRow",
    "BadRowError",
    "BatchKey",
    "CacheOptions",
    "DatasetSpec",
    "EvalShardSampler",
    "GoldCheck",
    "HFSource",
    "LoadedRows",
    "PromptBatchSampler",
    "PromptDataModule",
    "PromptFormat",
    "ValSet",
    "anchor_batch_indices",
    "encode_prompt",
    "epoch_order",
    "load_rows",
    "normalize_answer",
    "read_records",
]
