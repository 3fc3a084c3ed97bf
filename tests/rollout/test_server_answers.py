"""``engine: vllm_server`` against a fake server (the standard library's HTTP server, no vLLM): every
answer is checked before it is used, every error names the server, and a server that stops
answering ends the wait instead of hanging the run."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_rlvr.rollout import SamplingParams, ServerError, build_engine, server_processes
from lit_rlvr.rollout import server as server_module

HANG = object()  # a route that never answers (a stopped server)


def completion(n: int, ids=(1, 2), logprobs=(-0.5, -0.25), **fields) -> dict:
    """What vLLM answers to /v1/completions for ``n`` samples (``fields`` change every choice)."""
    choice = {
        "text": "ab",
        "token_ids": list(ids),
        "finish_reason": "length",
        "logprobs": {"token_logprobs": list(logprobs)},
    }
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
            "/server_info": lambda body: (
                200,
                {
                    "vllm_config": {
                        "model_config": {"logprobs_mode": "processed_logprobs"},
                        "weight_transfer_config": {"backend": "lit_rlvr_file"},
                    }
                },
            ),
            "/health": lambda body: (200, b""),
            "/is_paused": lambda body: (401, {"error": "Unauthorized"}),
            "/v1/completions": lambda body: (200, completion(body["n"])),
        }
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


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (
            lambda n: completion(n, logprobs=(-0.5, math.nan)),
            r"completion 0: log-prob 1 is nan, not a finite number <= 0",
        ),
        (lambda n: completion(n, logprobs=(-0.5, math.inf)), r"log-prob 1 is inf"),
        (lambda n: completion(n, logprobs=(-0.5, 3.0)), r"log-prob 1 is 3.0"),
        (lambda n: completion(n, ids=(1, 10)), r"token id 10 is outside the vocabulary \[0, 10\)"),
        (lambda n: completion(n, ids=(1, -1)), r"token id -1 is outside"),
        (
            lambda n: completion(n, ids=(1, 2, 3, 4), logprobs=(-1.0,) * 4),
            r"not a list of at most max_new_tokens=3 ids",
        ),
        (lambda n: completion(n, logprobs=(-0.5,)), r"2 tokens but log-probs \[-0.5\]"),
        (lambda n: completion(n, finish_reason="abort"), r"ended with finish_reason='abort'"),
        (lambda n: completion(n - 1), r"1 choices for n=2"),
        (lambda n: {"choices": []}, r"0 choices for n=2"),
        (lambda n: {"object": "error"}, r"no 'choices' list"),
        (lambda n: b"<html>bad gateway</html>", r"answered 200 with no JSON \('<html>bad gateway</html>'\)"),
    ],
)
def test_an_answer_that_is_not_a_vllm_completion_names_the_server(answer, match):
    """NaN log-probs used to train silently (ratio 4.9e8 with the fingerprint off); garbage gave a
    bare JSONDecodeError or IndexError naming no server."""
    with FakeVLLM({"/v1/completions": lambda body: (200, answer(body["n"]))}) as server, server.engine() as engine:
        engine.vocab_size = 10  # as the builder sets it from the policy
        with pytest.raises(
            ServerError, match=rf"/v1/completions on {server.url} .*{match}.*check that {server.url} runs vLLM"
        ):
            engine.generate([[5, 6]], PARAMS)


def test_the_builder_checks_token_ids_against_the_policys_output_size():
    policy = torch.nn.Linear(2, 2)
    policy.config = SimpleNamespace(vocab_size=2)
    with (
        FakeVLLM() as server,
        build_engine("vllm_server", model=policy, model_path="unused", urls=[server.url], api_key="k") as engine,
    ):
        with pytest.raises(ServerError, match=r"token id 2 is outside the vocabulary \[0, 2\)"):
            engine.generate([[0, 1]], PARAMS)


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([None, {"7": {"logprob": math.nan}}], r"probe log-prob 0 is nan"),
        ([None, {"8": {"logprob": -1.0}}], r"no prompt_logprobs for the 2 probe tokens"),
        ([None], r"no prompt_logprobs for the 2 probe tokens"),
    ],
)
def test_the_fingerprint_probe_answer_is_checked(rows, match):
    with (
        FakeVLLM({"/v1/completions": lambda body: (200, {"choices": [{"prompt_logprobs": rows}]})}) as server,
        server.engine() as engine,
    ):
        with pytest.raises(ServerError, match=rf"/v1/completions on {server.url} answered what vLLM does not: {match}"):
            engine.probe_logprobs([3], [7])


def test_a_garbage_model_list_names_the_server_at_start_up():
    with FakeVLLM({"/v1/models": lambda body: (200, {"models": "m"})}) as server:
        with pytest.raises(ServerError, match=rf"/v1/models on {server.url} answered .*not vLLM's model list"):
            server.engine()


def test_a_wrong_api_key_is_named_as_such_not_blamed_on_dev_mode():
    with FakeVLLM({"/v1/models": lambda body: (401, {"error": "Unauthorized"})}) as server:
        with pytest.raises(
            ServerError, match=rf"{server.url} refused the API key on /v1/models .*engine_options.api_key"
        ) as err:
            server.engine()
    assert "DEV_MODE" not in str(err.value)


def test_a_server_without_the_dev_routes_is_told_to_set_dev_mode():
    with FakeVLLM({"/server_info": lambda body: (404, {"detail": "Not Found"})}) as server:
        with pytest.raises(ServerError, match=rf"{server.url} has no /server_info \(404\): .*VLLM_SERVER_DEV_MODE=1"):
            server.engine()


def test_requests_carry_the_key_neutral_penalties_and_a_finite_timeout_sized_from_the_work(monkeypatch):
    """vLLM's server fills unset penalties from the model's generation_config.json (Qwen2.5-Instruct:
    repetition_penalty 1.05), which the colocated engine and the trainer do not apply; the default
    timeout was an hour whatever the work."""
    import requests

    timeouts = []
    real = requests.request
    monkeypatch.setattr(requests, "request", lambda *a, **kw: timeouts.append(kw["timeout"]) or real(*a, **kw))
    with FakeVLLM() as server, server.engine() as engine:
        engine.generate([[5, 6]], PARAMS)
    (body,) = [body for path, body, _ in server.requests if path == "/v1/completions"]
    assert {k: body[k] for k in ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p")} == {
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "min_p": 0.0,
    }
    assert timeouts[-1] == server_module._BASE_S + PARAMS.max_new_tokens * server_module._PER_TOKEN_S
    assert {auth for path, _, auth in server.requests if path != "/is_paused"} == {"Bearer k"}  # that one asks without


def test_a_given_server_whose_weight_routes_answer_without_the_key_is_warned_about():
    with FakeVLLM({"/is_paused": lambda body: (200, {"is_paused": False})}) as server:
        with pytest.warns(
            UserWarning,
            match=rf"{server.url} answers its weight routes without the API key.*--middleware "
            r"lit_rlvr.vllm_plugin.KeyOnEveryRoute",
        ):
            server.engine().close()


@pytest.mark.timeout(60)
def test_a_server_that_stops_answering_ends_the_wait_naming_it(monkeypatch):
    """A stopped server (SIGSTOP) accepts connections and never answers: its /health goes silent
    and the wait ends after _UNHEALTHY_FOR_S, not at the request's timeout."""
    monkeypatch.setattr(server_processes, "_HEALTH_EVERY_S", 0.2)
    monkeypatch.setattr(server_processes, "_HEALTH_TIMEOUT_S", 0.5)
    monkeypatch.setattr(server_processes, "_UNHEALTHY_FOR_S", 2.0)
    with FakeVLLM() as server, server.engine() as engine:
        server.routes["/v1/completions"] = server.routes["/health"] = lambda body: (200, HANG)
        t0 = time.monotonic()
        with pytest.raises(
            ServerError, match=rf"generation of 1 prompts x 2: {server.url} has not answered /health for [2-9] s"
        ):
            engine.generate([[5, 6]], PARAMS)
        assert time.monotonic() - t0 < 10


def _lora_policy():
    from peft import LoraConfig, get_peft_model

    from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama

    base = build_tiny_llama(
        build_char_tokenizer(), num_layers=1, hidden_size=64, num_heads=2, intermediate_size=128, seed=0
    )
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))


def _lora_info(rank: int | None, runtime: bool = True) -> dict:
    info = {
        "model_config": {"logprobs_mode": "processed_logprobs"},
        "weight_transfer_config": {"backend": "lit_rlvr_file"},
    }
    return {
        "vllm_config": {**info, "lora_config": None if rank is None else {"max_lora_rank": rank}},
        "vllm_env": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": runtime},
    }


@pytest.mark.parametrize(
    ("rank", "runtime", "has"),
    [
        (None, True, "up to rank 0"),
        (1, True, "up to rank 1"),
        (16, False, "up to rank 16 and cannot load one at runtime"),
    ],
)
def test_a_given_server_that_cannot_take_the_adapter_is_refused_or_synced_merged(rank, runtime, has):
    pytest.importorskip("vllm")
    lora = _lora_policy()
    with FakeVLLM({"/server_info": lambda body: (200, _lora_info(rank, runtime))}) as server:
        with pytest.raises(
            ValueError,
            match=rf"adapter_sync=true: the vLLM server at {server.url} serves LoRA adapters {has} "
            r"\(start it with --enable-lora --max-lora-rank 8 --max-loras 1 and "
            r"VLLM_ALLOW_RUNTIME_LORA_UPDATING=1",
        ):
            build_engine(
                "vllm_server", model=lora, model_path="unused", urls=[server.url], api_key="k", adapter_sync=True
            )
        with build_engine(
            "vllm_server", model=lora, model_path="unused", urls=[server.url], api_key="k", adapter_sync="auto"
        ) as engine:
            assert engine.adapter is None


def test_a_server_on_another_machine_cannot_take_the_adapter():
    pytest.importorskip("vllm")
    with pytest.raises(
        ValueError, match=r"adapter_sync=true: the servers \['http://10.0.0.2:8000'\] are not on this machine"
    ):
        build_engine(
            "vllm_server",
            model=_lora_policy(),
            model_path="unused",
            urls=["http://10.0.0.2:8000"],
            api_key="k",
            adapter_sync=True,
        )


def test_adapter_sync_loads_each_version_unloads_the_previous_and_requests_name_it():
    """The base through the weight routes once, then the adapter alone: /v1/load_lora_adapter (which
    vLLM answers with text) under the version's name, the previous name unloaded, all inside the pause."""
    pytest.importorskip("vllm")
    ok = lambda body: (200, {})  # noqa: E731
    weight_routes = {
        route: ok
        for route in (
            "/pause",
            "/resume",
            "/init_weight_transfer_engine",
            "/start_weight_update",
            "/update_weights",
            "/finish_weight_update",
            "/update_weight_version",
        )
    }
    loaded = lambda body: (200, f"Success: LoRA adapter '{body['lora_name']}' added successfully.".encode())  # noqa: E731
    routes = {
        "/server_info": lambda body: (200, _lora_info(16)),
        "/v1/load_lora_adapter": loaded,
        "/v1/unload_lora_adapter": lambda body: (200, b"Success"),
        **weight_routes,
    }
    lora = _lora_policy()
    with FakeVLLM(routes) as server:
        with build_engine(
            "vllm_server", model=lora, model_path="unused", urls=[server.url], api_key="k", adapter_sync=True
        ) as engine:
            folders = []
            for _ in range(2):
                engine.update_weights(lora)
                folders.append(
                    next(
                        body["lora_path"]
                        for path, body, _ in reversed(server.requests)
                        if path == "/v1/load_lora_adapter"
                    )
                )
            engine.generate([[5, 6]], PARAMS)
    sync = [
        path if path != "/v1/load_lora_adapter" else (path, body["lora_name"])
        for path, body, _ in server.requests
        if path not in ("/v1/models", "/server_info", "/is_paused", "/health", "/v1/completions", "/update_weights")
    ]
    assert sync == [
        "/pause",
        "/init_weight_transfer_engine",
        "/start_weight_update",
        "/finish_weight_update",
        ("/v1/load_lora_adapter", "lit_rlvr_policy_v1"),
        "/update_weight_version",
        "/resume",
        "/pause",
        ("/v1/load_lora_adapter", "lit_rlvr_policy_v2"),
        "/v1/unload_lora_adapter",
        "/update_weight_version",
        "/resume",
    ]
    unloaded = [body["lora_name"] for path, body, _ in server.requests if path == "/v1/unload_lora_adapter"]
    completions = [body["model"] for path, body, _ in server.requests if path == "/v1/completions"]
    assert unloaded == ["lit_rlvr_policy_v1"] and completions == ["lit_rlvr_policy_v2"]
    assert folders[0] != folders[1] and not any(Path(f).exists() for f in folders)  # removed with the engine


def test_a_server_without_runtime_lora_loading_is_told_the_variable():
    """Its /server_info said it could (a route that 404s anyway: a proxy, another vLLM build): the first sync names the variable."""
    pytest.importorskip("vllm")
    ok = lambda body: (200, {})  # noqa: E731
    routes = {
        "/server_info": lambda body: (200, _lora_info(8)),
        **{
            r: ok
            for r in (
                "/pause",
                "/resume",
                "/init_weight_transfer_engine",
                "/start_weight_update",
                "/update_weights",
                "/finish_weight_update",
            )
        },
    }
    lora = _lora_policy()
    with (
        FakeVLLM(routes) as server,
        build_engine(
            "vllm_server", model=lora, model_path="unused", urls=[server.url], api_key="k", adapter_sync=True
        ) as engine,
    ):
        with pytest.raises(
            ServerError,
            match=r"did not load the policy's LoRA adapter .*has no /v1/load_lora_adapter \(404\): .*"
            r"VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 .*adapter_sync: false",
        ):
            engine.update_weights(lora)
