"""``engine: vllm_server`` against a fake server (the standard library's HTTP server, no vLLM): a
server that stops answering ends the wait instead of hanging the run."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lit_rlvr.rollout import SamplingParams, ServerError, build_engine
from lit_rlvr.rollout import server as server_module

HANG = object()  # a route that never answers (a stopped server)


def completion(n: int, ids=(1, 2), logprobs=(-0.5, -0.25), **fields) -> dict:
    """What vLLM answers to /v1/completions for ``n`` samples (``fields`` change every choice)."""
    choice = {"text": "ab", "token_ids": list(ids), "finish_reason": "length", "logprobs": {"token_logprobs": list(logprobs)}}
    return {"choices": [dict(choice, index=i, **fields) for i in range(n)]}


class FakeVLLM:
    """A loopback HTTP server answering as vLLM does, or as a test makes it.

    ``routes`` maps a path (without its query) to a function of the request's JSON body returning
    ``(status, answer)``: a dict or list is sent as JSON (NaN included, as Python writes it),
    bytes as they are, :data:`HANG` never. Unknown paths answer 404. ``requests`` records
    ``(path, body, authorization header)``.
    """

    def __init__(self, routes: dict | None = None):
        self.routes = {
            "/v1/models": lambda body: (200, {"data": [{"id": "m", "max_model_len": 64}]}),
            "/server_info": lambda body: (200, {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"},
                                                                "weight_transfer_config": {"backend": "lit_rlvr_file"}}}),
            "/health": lambda body: (200, b""),
            "/is_paused": lambda body: (401, {"error": "Unauthorized"}),
            "/v1/completions": lambda body: (200, completion(body["n"])),
        }  # fmt: skip
        self.routes.update(routes or {})
        self.requests: list[tuple[str, dict | None, str | None]] = []
        self.release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self, body):
                path = self.path.split("?")[0]
                fake.requests.append((path, body, self.headers.get("Authorization")))
                status, out = fake.routes[path](body) if path in fake.routes else (404, {"detail": "Not Found"})
                if out is HANG:
                    fake.release.wait()
                    return
                data = out if isinstance(out, bytes) else json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.answer(None)

            def do_POST(self):
                self.answer(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null"))

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def engine(self, **options):
        return build_engine("vllm_server", model_path="unused", urls=[self.url], api_key="k", **options)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.httpd.shutdown()


PARAMS = SamplingParams(n=2, max_new_tokens=3, seed=0)


def test_a_well_formed_answer_gives_the_rollouts():
    with FakeVLLM() as server, server.engine() as engine:
        out = engine.generate([[5, 6]], PARAMS)
    assert out.completion_ids == [[1, 2], [1, 2]] and out.sampler_logprobs == [[-0.5, -0.25]] * 2


def test_requests_carry_the_key_and_a_finite_timeout_sized_from_the_work(monkeypatch):
    """The default timeout was an hour whatever the work."""
    import requests

    timeouts = []
    real = requests.request
    monkeypatch.setattr(requests, "request", lambda *a, **kw: timeouts.append(kw["timeout"]) or real(*a, **kw))
    with FakeVLLM() as server, server.engine() as engine:
        engine.generate([[5, 6]], PARAMS)
    assert timeouts[-1] == server_module._BASE_S + PARAMS.max_new_tokens * server_module._PER_TOKEN_S
    assert {auth for path, _, auth in server.requests if path != "/is_paused"} == {"Bearer k"}  # that one asks without


@pytest.mark.timeout(60)
def test_a_server_that_stops_answering_ends_the_wait_naming_it(monkeypatch):
    """A stopped server (SIGSTOP) accepts connections and never answers: its /health goes silent
    and the wait ends after _UNHEALTHY_FOR_S, not at the request's timeout."""
    monkeypatch.setattr(server_module, "_HEALTH_EVERY_S", 0.2)
    monkeypatch.setattr(server_module, "_HEALTH_TIMEOUT_S", 0.5)
    monkeypatch.setattr(server_module, "_UNHEALTHY_FOR_S", 2.0)
    with FakeVLLM() as server, server.engine() as engine:
        server.routes["/v1/completions"] = server.routes["/health"] = lambda body: (200, HANG)
        t0 = time.monotonic()
        with pytest.raises(ServerError, match=rf"generation of 1 prompts x 2: {server.url} has not answered /health for [2-9] s"):
            engine.generate([[5, 6]], PARAMS)
        assert time.monotonic() - t0 < 10
