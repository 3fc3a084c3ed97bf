"""VLLMEngine's weight sync without vLLM: the weight stream is always exhausted.

Under FSDP2 every streamed tensor is an all-gather that every rank must join; a rank whose
engine fails midway must still finish the stream, or the other ranks wait in the next one.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from torch import nn

import lit_rlvr.rollout.weights as weights_module
from lit_rlvr.rollout.engine import EngineStats
from lit_rlvr.rollout.vllm import VLLMEngine


class _EngineDiesAfterTwoTensors:
    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        weights = kwargs["weights_iterator"]
        next(weights), next(weights)
        raise RuntimeError("engine died while loading")

    def reset_prefix_cache(self):
        raise AssertionError("not reached")


def test_weight_stream_is_finished_when_the_engine_fails_midway(monkeypatch):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 1))
    produced = []

    @contextmanager
    def counting_weights(m, merged=True):
        def stream():
            for name, tensor in m.state_dict().items():
                produced.append(name)  # stands for one all-gather
                yield name, tensor

        yield stream()

    monkeypatch.setattr(weights_module, "sync_weights", counting_weights)
    engine = object.__new__(VLLMEngine)  # no vllm.LLM: only the sync logic runs
    engine.llm, engine._asleep, engine._weights_awake = _EngineDiesAfterTwoTensors(), False, True
    engine.adapter, engine._base_synced, engine._stats = None, False, EngineStats()
    monkeypatch.setattr(VLLMEngine, "_in_process", lambda self: True)
    with pytest.raises(RuntimeError, match="engine died while loading"):
        engine._update_weights(model)
    assert produced == list(model.state_dict())  # all six, not the two the engine took
