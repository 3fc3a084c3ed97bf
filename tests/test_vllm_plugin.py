"""lit_rlvr's vLLM plug-in: the API key on every route (:class:`KeyOnEveryRoute`), as vLLM builds it."""

from __future__ import annotations

import asyncio

import pytest

from lit_rlvr.vllm_plugin import KeyOnEveryRoute


def _served(scope: dict) -> tuple[list[dict], bool]:
    """What the middleware sends for ``scope``, and whether it let the request through to the app."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"] if "path" in scope else scope["type"])

    async def send(message):
        sent.append(message)

    asyncio.run(KeyOnEveryRoute(app)(scope, None, send))
    return sent, bool(reached)


@pytest.mark.parametrize(
    "path", ["/update_weights", "/collective_rpc", "/start_weight_update", "/health", "/v1/models"]
)
@pytest.mark.parametrize(
    ("headers", "through"),
    [
        ([], False),
        ([(b"authorization", b"Bearer wrong")], False),
        ([(b"authorization", b"Basic s3cret")], False),
        ([(b"authorization", b"Bearer s3cret")], True),
        ([(b"authorization", b"bearer s3cret")], True),
    ],
)
def test_every_route_needs_the_key_from_the_environment(monkeypatch, path, headers, through):
    """vLLM's own --api-key guards /v1 (and /v2, /inference, /cohere) only: /update_weights and
    /collective_rpc answered anyone who reached the port."""
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    sent, reached = _served({"type": "http", "method": "POST", "path": path, "headers": headers})
    assert reached == through
    assert through or (sent[0]["status"] == 401 and b"needs its API key" in sent[1]["body"])


def test_websockets_need_the_key_and_lifespan_events_pass(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    sent, reached = _served({"type": "websocket", "path": "/v1/realtime", "headers": []})
    assert not reached and sent == [{"type": "websocket.close", "code": 1008}]
    assert _served({"type": "lifespan"}) == ([], True)


def test_without_a_key_in_the_environment_the_server_does_not_start(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="needs the server's API key in the environment variable VLLM_API_KEY"):
        KeyOnEveryRoute(lambda *a: None)
