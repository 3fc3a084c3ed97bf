"""Start-up checks of ``engine: vllm_server`` and ``rollout.max_staleness`` (no server started)."""

from __future__ import annotations

import pytest

from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.rollout import VLLMServer


def test_a_started_server_binds_loopback_unless_remote_weight_routes_are_allowed(tmp_path):
    with pytest.raises(ValueError, match="not guarded by its API key.*allow_remote_weight_routes"):
        VLLMServer("some/model", host="0.0.0.0", log_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())  # refused before anything started


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"engine": "hf", "max_staleness": 1}, "needs an engine that generates apart.*'hf'"),
        ({"engine": "vllm", "max_staleness": 0}, "needs an engine that generates apart.*'vllm'"),
        ({"engine": "vllm_server", "max_staleness": 1, "sync_every_n_steps": 2}, "sync_every_n_steps: 1"),
        ({"engine": "vllm_server", "max_staleness": 9}, r"integer in \[0, 6\]"),
        ({"engine": "vllm_server", "max_staleness": 1, "on_stale": "skip"}, "'wait' or 'drop'"),
        ({"engine": "vllm_server", "engine_options": {"weight_transfer": "rdma"}}, "'file' or 'nccl'"),
        ({"engine": "vllm_server", "engine_options": {"weight_transfer": "nccl"}}, "nccl_master_address"),
    ],
)
def test_asynchronous_and_server_settings_are_checked_at_start_up(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RolloutCallback(**kwargs)


def test_a_valid_asynchronous_setting_constructs():
    callback = RolloutCallback(engine="vllm_server", engine_options={"urls": ["http://127.0.0.1:8000"]}, max_staleness=2)
    assert callback.options.asynchronous.max_staleness == 2
    assert callback.asynchronous.producer is None  # the producer starts with the first batch
