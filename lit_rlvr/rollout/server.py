"""``engine: vllm_server``: rollouts from ``vllm serve`` processes, weights synced through vLLM's RL routes.

Generation runs in its own process (on its own GPUs, or nodes), as TRL's ``vllm_mode="server"``,
verl, OpenRLHF and NeMo-RL do; the trainer talks to it over HTTP:

- **generation**: ``/v1/completions`` with the prompt's token ids, ``n`` samples and the same
  per-prompt seeds as the colocated engine (``seed + i·n`` for prompt i, vLLM adding the sample
  index), the processed log-probs (the server runs with ``--logprobs-mode processed_logprobs``)
  and the completion's token ids (``return_token_ids``): the same :class:`Rollouts` as
  :class:`~lit_rlvr.rollout.vllm.VLLMEngine`. Several URLs are data-parallel servers: prompts
  are spread over them round-robin.
- **weight sync**: vLLM's own routes, pause → transfer → version → resume (``/pause?mode=wait``,
  ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``,
  ``/update_weight_version``, ``/resume``), driven by vLLM's trainer-side weight-transfer engine
  through a client of vLLM's sync protocol that sends the API key: NCCL on GPUs (``weight_transfer: nccl``), and on one
  machine without NCCL the ``lit_rlvr_file`` backend (:mod:`lit_rlvr.rollout.weight_transfer`)
  that lit_rlvr registers with vLLM's factory through vLLM's plug-in entry point; either moves
  the weights in buckets of ``sync_bucket_mb``. A LoRA policy with ``adapter``
  (:mod:`lit_rlvr.rollout.adapters`) sends its base weights that way once; after that each sync
  loads the adapter alone (``/v1/load_lora_adapter``, a started server runs with ``--enable-lora``
  and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``) under the version's name, unloads the previous
  one, and every request names the current adapter.
- **the server's life**: without ``urls``, :class:`~lit_rlvr.rollout.server_processes.VLLMServer`
  starts ``vllm serve`` under a guard that kills it with the trainer, with a fresh API key and a log
  of its own (:mod:`lit_rlvr.rollout.server_processes`, which also says how its weight routes are kept private).
- **faults mid-run**: every request is waited for under a watch (:meth:`VLLMServerEngine._await`)
  that ends the run with :class:`ServerError` naming the log as soon as a started server's guard,
  API server or engine core is gone (``kill -9``, the OOM killer: vLLM's API server then keeps
  the in-flight request open forever), one of its processes has been stopped (SIGSTOP) for
  ``_STOPPED_FOR_S``, or a server's ``/health`` has not answered for ``_UNHEALTHY_FOR_S``. Each
  HTTP request has a finite timeout: the user's ``generate_timeout_s`` / ``sync_timeout_s``, else
  one sized from its work (:func:`request_timeout`). Every answer is checked before it is used
  (:func:`checked_choices`, :func:`checked_probe`): a server answering garbage, NaN log-probs or
  out-of-vocabulary tokens is named, instead of training on them.
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from torch import nn

from lit_rlvr.rollout.adapters import (
    ADAPTER_PREFIX,
    AdapterServing,
    AdapterStore,
    StoredAdapter,
    adapter_serving,
    sync_kind,
)
from lit_rlvr.rollout.engine import ENGINES, SYNC_BUCKET_MB, EngineBase, announce, chat_turn_end_ids
from lit_rlvr.rollout.server_processes import (
    _LOCAL_HOSTS,
    KEY_MIDDLEWARE,
    ServerError,
    VLLMServer,
    check_server_options,
    servers_fault,
)
from lit_rlvr.rollout.types import Rollouts, SamplingParams
from lit_rlvr.rollout.weights import PolicyWeights, engine_model_path

_BACKENDS = {"file": "lit_rlvr_file", "nccl": "nccl"}  # rollout.engine_options.weight_transfer -> vLLM's backend


# the watch over a request in flight (VLLMServerEngine._await)
_POLL_S = 1.0  # how often the processes of a started server are looked at
_STARTUP_PROBE_S = 30.0  # /v1/models, /server_info at start-up

# default HTTP timeouts, sized from a request's work (request_timeout)
_BASE_S = 300.0  # queueing behind other requests, prefill, the first token, a loaded machine
_PER_TOKEN_S = 1.0  # a sequence decodes at least one token a second
_PER_GB_S = 10.0  # weights move at 100 MB/s or faster
_LOGPROB_ATOL = 1e-3  # a log-prob above this is not one
_TEXT_ROUTES = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")  # vLLM answers them with text, not JSON


def request_timeout(given: float | None, tokens: int = 0, weight_bytes: int = 0) -> float:
    """The HTTP timeout of one request: the user's limit when ``given``, else sized from its work.

    ``_BASE_S`` for queueing, prefill and the first token, ``_PER_TOKEN_S`` per token a sequence
    may decode (``max_new_tokens``), ``_PER_GB_S`` per GB of weights a sync moves: a slow but
    working server finishes well inside it; a dead or stopped one is caught sooner by the watch.

    Example:
        >>> request_timeout(None, tokens=1024), request_timeout(None, weight_bytes=2 * 10**9), request_timeout(60.0, tokens=1024)
        (1324.0, 320.0, 60.0)
    """
    return given if given is not None else _BASE_S + tokens * _PER_TOKEN_S + weight_bytes / 1e9 * _PER_GB_S


def _in_thread(fn) -> Future:
    """``fn()`` in a daemon thread of its own (a request to a stuck server never holds up the exit)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as err:  # noqa: BLE001 (handed to the waiting thread)
            future.set_exception(err)

    threading.Thread(target=run, daemon=True, name="lit_rlvr_vllm_server_request").start()
    return future


def _finite_logprob(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x <= _LOGPROB_ATOL


def _token_id(x: Any, vocab_size: int | None) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < (vocab_size or 2**63)


def checked_choices(answer: Any, n: int, max_new_tokens: int, vocab_size: int | None = None) -> list[dict]:
    """The ``n`` choices of a ``/v1/completions`` answer, by index, each checked; ``ValueError`` saying what is wrong.

    Each choice needs token ids in ``[0, vocab_size)``, at most ``max_new_tokens`` of them, one
    finite log-prob ≤ 0 per token, a text and a finish reason ``stop`` or ``length``: a server
    answering anything else would otherwise train the policy on it (a NaN log-prob makes the
    importance ratio NaN or huge without any error when the fingerprint check is off).

    Example:
        >>> ok = {"index": 0, "token_ids": [5, 6], "text": "ab", "finish_reason": "length", "logprobs": {"token_logprobs": [-0.1, -2.0]}}
        >>> checked_choices({"choices": [ok]}, n=1, max_new_tokens=2, vocab_size=10)[0]["token_ids"]
        [5, 6]
        >>> bad = dict(ok, logprobs={"token_logprobs": [-0.1, float("nan")]})
        >>> checked_choices({"choices": [bad]}, n=1, max_new_tokens=2, vocab_size=10)
        Traceback (most recent call last):
        ...
        ValueError: completion 0: log-prob 1 is nan, not a finite number <= 0
    """
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or len(choices) != n:
        got = f"{len(choices)} choices" if isinstance(choices, list) else f"no 'choices' list ({str(answer)[:200]!r})"
        raise ValueError(f"{got} for n={n}")
    if not all(isinstance(c, dict) for c in choices) or {c.get("index") for c in choices} != set(range(n)):
        raise ValueError(
            f"choice indices {[c.get('index') if isinstance(c, dict) else c for c in choices][:8]}, not 0..{n - 1}"
        )
    choices = sorted(choices, key=lambda c: c["index"])
    for c in choices:
        where = f"completion {c['index']}"
        ids, logprobs = c.get("token_ids"), c.get("logprobs")
        logprobs = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        if not isinstance(ids, list) or len(ids) > max_new_tokens:
            raise ValueError(
                f"{where}: token_ids {str(ids)[:100]}, not a list of at most max_new_tokens={max_new_tokens} ids"
            )
        if bad := [t for t in ids if not _token_id(t, vocab_size)]:
            raise ValueError(f"{where}: token id {bad[0]!r} is outside the vocabulary [0, {vocab_size or '∞'})")
        if not isinstance(logprobs, list) or len(logprobs) != len(ids):
            raise ValueError(f"{where}: {len(ids)} tokens but log-probs {str(logprobs)[:100]}")
        if (i := next((i for i, x in enumerate(logprobs) if not _finite_logprob(x)), None)) is not None:
            raise ValueError(f"{where}: log-prob {i} is {logprobs[i]!r}, not a finite number <= 0")
        if not isinstance(c.get("text"), str):
            raise ValueError(f"{where}: text {c.get('text')!r}, not a string")
        if c.get("finish_reason") not in ("stop", "length"):
            raise ValueError(f"{where} ended with finish_reason={c.get('finish_reason')!r}, not 'stop' or 'length'")
    return choices


def checked_probe(answer: Any, seq: list[int], start: int) -> list[float]:
    """The log-probs of ``seq[start:]`` in a ``prompt_logprobs`` answer for ``seq``; ``ValueError`` saying what is wrong.

    Example:
        >>> answer = {"choices": [{"prompt_logprobs": [None, {"7": {"logprob": -1.5}}]}]}
        >>> checked_probe(answer, [3, 7], start=1)
        [-1.5]
    """
    try:
        rows = answer["choices"][0]["prompt_logprobs"]
        assert isinstance(rows, list) and len(rows) == len(seq)
        out = [rows[i][str(seq[i])]["logprob"] for i in range(start, len(seq))]
    except (KeyError, IndexError, TypeError, AssertionError):
        raise ValueError(f"no prompt_logprobs for the {len(seq)} probe tokens ({str(answer)[:200]!r})") from None
    if (i := next((i for i, x in enumerate(out) if not _finite_logprob(x)), None)) is not None:
        raise ValueError(f"probe log-prob {i} is {out[i]!r}, not a finite number <= 0")
    return [float(x) for x in out]


class _SyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over HTTP, as its ``HTTPVLLMWeightSyncClient``, but
    with the API key (every route needs it), the server watch and lit_rlvr's errors.

    The payloads of lit_rlvr's two backends (``file``, ``nccl``) are plain JSON, so they go as they are.
    """

    def __init__(self, engine: VLLMServerEngine, url: str):
        self.engine, self.url = engine, url
        self.timeout_s = request_timeout(engine.sync_timeout_s)  # set per sync by the engine, sized from it

    def post(self, route: str, body: dict | None = None) -> Any:
        return self.engine._request(self.url, route, body, timeout=self.timeout_s)

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.post("/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.post("/start_weight_update")

    def update_weights(self, update_info: dict) -> None:
        self.post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.post("/finish_weight_update", None if weight_version is None else {"weight_version": weight_version})


class VLLMServerEngine(EngineBase):
    """Rollouts from ``vllm serve`` (started here, or given by URL), weights synced through its RL routes.

    Args:
        model_path: what a started server loads (default: the policy's path).
        urls: servers already running (``http://host:port``; several = data parallel, prompts
            spread round-robin), shared by all trainer ranks (rank 0 syncs them). None: start
            one here (one per rank).
        api_key: their key (default ``$VLLM_API_KEY``; a started server gets a fresh one).
        host / port: where a started server listens (127.0.0.1, a free port).
        allow_remote_weight_routes: let a started server bind a non-local interface.
        dtype: a started server's dtype (``auto``: the trainer's).
        max_model_len / kv_cache_memory_bytes / gpu_memory_utilization / enforce_eager: passed to
            a started server (vLLM's options of the same names).
        seed: a started server's seed (requests carry their own seeds anyway).
        weight_transfer: ``file`` (lit_rlvr's backend: the server reads the trainer's files, one
            machine, CPU or GPU) or ``nccl`` (vLLM's, GPUs; needs ``nccl_master_address``).
        nccl_master_address / nccl_master_port: the trainer's rendezvous for ``nccl``.
        server_args: further ``vllm serve`` arguments (not the settings lit_rlvr makes: the model,
            ``--host``, ``--port``, ``--uds``, ``--grpc``, ``--api-key``, ``--dtype``, ``--seed``,
            ``--logprobs-mode``, ``--weight-transfer-config``, in any spelling vLLM's parser takes;
            refused at start-up).
        server_env: a started server's extra environment (``{CUDA_VISIBLE_DEVICES: "1"}``: its GPUs).
        startup_timeout_s: how long a started server may take to come up.
        log_dir: where a started server's log goes (default: a private folder in the temp folder).
        max_concurrent_requests: HTTP requests in flight at once.
        vocab_size: a completion's token ids must lie in ``[0, vocab_size)`` (default: the
            policy's output size, when the builder has the policy; None: not checked).
        generate_timeout_s / sync_timeout_s: per generation call / per sync, and per request
            (None: each request's timeout sized from its work, :func:`request_timeout`).
        adapter: serve the policy's LoRA adapter and sync the adapter alone
            (:func:`~lit_rlvr.rollout.adapters.adapter_serving`; servers on this machine, with
            LoRA enabled; None: merged full syncs).
        sync_bucket_mb: the most weights a full sync moves at once (a ``file`` chunk, an NCCL
            packed buffer).
    """

    name = "vllm_server"
    generates_apart = True

    def __init__(
        self,
        model_path: str | Path,
        *,
        tokenizer=None,
        urls: list[str] | None = None,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        allow_remote_weight_routes: bool = False,
        dtype: str = "auto",
        max_model_len: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool = False,
        seed: int = 0,
        weight_transfer: str = "file",
        nccl_master_address: str | None = None,
        nccl_master_port: int | None = None,
        server_args: list[str] | None = None,
        server_env: dict[str, str] | None = None,
        startup_timeout_s: float = 600.0,
        log_dir: str | None = None,
        max_concurrent_requests: int = 64,
        vocab_size: int | None = None,
        generate_timeout_s: float | None = None,
        sync_timeout_s: float | None = None,
        adapter: AdapterServing | None = None,
        sync_bucket_mb: int = SYNC_BUCKET_MB,
    ):
        super().__init__(generate_timeout_s, sync_timeout_s)
        check_server_options(
            weight_transfer=weight_transfer,
            nccl_master_address=nccl_master_address,
            max_concurrent_requests=max_concurrent_requests,
            server_args=server_args,
        )
        self.model_path, self.tokenizer, self.vocab_size = str(model_path), tokenizer, vocab_size
        self.weight_transfer = weight_transfer
        self.nccl = (nccl_master_address, nccl_master_port)
        self.servers: list[VLLMServer] = []
        self.rank, self.world = _trainer_rank()
        self.shared = bool(urls) and self.world > 1  # every rank generates on them; rank 0 syncs them
        self._longest = 0  # the longest max_new_tokens asked so far: what a /pause?mode=wait may wait for
        self.adapter, self.sync_bucket_mb = adapter, sync_bucket_mb
        if urls:
            self.urls = [u.rstrip("/") for u in urls]
            self.api_key = api_key or os.environ.get("VLLM_API_KEY")
            remote = [u for u in self.urls if (urlparse(u).hostname or "") not in _LOCAL_HOSTS]
            if self.adapter is not None and remote:
                self.adapter.refuse(
                    f"the servers {remote} are not on this machine: they cannot read the adapter's folder, "
                    "which vLLM loads adapters from"
                )
                self.adapter = None
        else:
            args = [
                "--dtype",
                dtype,
                "--seed",
                str(seed),
                "--weight-transfer-config",
                json.dumps({"backend": _BACKENDS[weight_transfer]}),
            ]
            for flag, value in (
                ("--max-model-len", max_model_len),
                ("--kv-cache-memory-bytes", kv_cache_memory_bytes),
                ("--gpu-memory-utilization", gpu_memory_utilization),
            ):
                if value is not None:
                    args += [flag, str(value)]
            args += ["--enforce-eager"] if enforce_eager else []
            start = functools.partial(
                VLLMServer,
                self.model_path,
                host=host,
                port=port,
                api_key=api_key,
                log_dir=log_dir,
                startup_timeout_s=startup_timeout_s,
                allow_remote_weight_routes=allow_remote_weight_routes,
            )
            server = self._start(start, [*args, *(server_args or [])], dict(server_env or {}))
            self.servers, self.urls, self.api_key = [server], [server.url], server.api_key
        self.served_model = self._served_model()
        for url in (
            self.urls if urls else []
        ):  # a started server has lit_rlvr's flags (server_args cannot override them)
            self._check_settings(url)
            self._warn_if_open(url)
        self.turn_end_ids = chat_turn_end_ids(tokenizer) if tokenizer is not None else []
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent_requests, thread_name_prefix="lit_rlvr_vllm_server")
        self._senders: dict[str, Any] = {}  # url -> vLLM trainer weight-transfer engine (after the first sync)
        self._clients: dict[str, _SyncClient] = {}
        self.version = 0
        self._base_synced = False  # adapter sync: the base weights went in (once)
        self._adapters = AdapterStore(_adapter_directory()) if self.adapter is not None else None
        self._lora: StoredAdapter | None = None  # the adapter this rank synced last (the syncing rank)
        announce(
            f"lit_rlvr rollout engine: vLLM server{'s' * (len(self.urls) > 1)} {', '.join(self.urls)} "
            f"(VLLMServerEngine, model {self.served_model}, weight transfer {weight_transfer}, "
            f"weight sync {sync_kind(self.adapter)})"
        )

    def _start(self, start, args: list[str], env: dict[str, str]) -> VLLMServer:
        """Start a server (``start(args, env=...)``), with LoRA enabled for ``self.adapter``; a model
        vLLM serves no LoRA for is refused (``adapter_sync: true``) or started again without it (``auto``)."""
        if self.adapter is None:
            return start(args, env=env)
        try:
            return start([*args, *self.adapter.server_args()], env={**env, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
        except ServerError as err:  # vLLM: "<Model> does not support LoRA yet." in the log
            if "support LoRA" not in str(err):
                raise
            self.adapter.refuse(f"vLLM serves no LoRA adapters for {self.model_path} (the server said so: {err})")
            self.adapter = None
            return start(args, env=env)

    # ------------------------------------------------------------------ HTTP

    def describe(self) -> str:
        """What to tell the user about the servers when a request fails: a started server's state and log."""
        if not self.servers:
            return f"check that {', '.join(self.urls)} run{'s' * (len(self.urls) == 1)} vLLM"
        server = self.servers[0]
        return f"the server lit_rlvr started {server.state()}; {server.log_tail()}"

    def _http(self, url: str, route: str, body: dict | None, method: str, timeout: float) -> Any:
        """One HTTP request and its JSON answer; :class:`ServerError` naming the server and what it answered."""
        import requests

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = requests.request(method, f"{url}{route}", json=body, headers=headers, timeout=timeout)
        except requests.RequestException as err:
            raise ServerError(f"{route} on {url} failed ({type(err).__name__}: {err}); {self.describe()}") from err
        if response.status_code == 401:
            raise ServerError(
                f"{url} refused the API key on {route} (401 {response.text[:200]}): set "
                "rollout.init_args.engine_options.api_key (or VLLM_API_KEY) to the server's key"
            )
        if response.status_code == 404 and not route.startswith("/v1/"):
            raise ServerError(
                f"{url} has no {route.split('?')[0]} (404): vLLM serves its weight routes only in its dev "
                f"mode, VLLM_SERVER_DEV_MODE=1; {self.describe()}"
            )
        if response.status_code == 404 and route == "/v1/load_lora_adapter" and "Not Found" in response.text:
            raise ServerError(
                f"{url} has no /v1/load_lora_adapter (404): vLLM serves it only with "
                f"VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 in its environment; {self.describe()}"
            )
        if response.status_code != 200:
            raise ServerError(
                f"{route} on {url} answered {response.status_code}: {response.text[:500]}; {self.describe()}"
            )
        if route in _TEXT_ROUTES:
            return response.text
        try:
            return response.json()
        except ValueError:
            raise ServerError(
                f"{route} on {url} answered 200 with no JSON ({response.text[:200]!r}); {self.describe()}"
            ) from None

    def _request(
        self, url: str, route: str, body: dict | None = None, method: str = "post", timeout: float = _BASE_S
    ) -> Any:
        """:meth:`_http` in a thread of its own, waited for under the server watch (:meth:`_await`)."""
        return self._await([_in_thread(lambda: self._http(url, route, body, method, timeout))], f"{route} on {url}")[0]

    def _await(self, futures: list[Future], what: str) -> list:
        """The futures' results, in order; the first error as soon as one fails.

        Meanwhile the servers are watched: a started server's processes every ``_POLL_S``
        (:class:`~lit_rlvr.rollout.server_processes.ServerProcesses`) and every server's ``/health`` every ``_HEALTH_EVERY_S``; a
        broken or stopped server, or one whose ``/health`` has not answered for
        ``_UNHEALTHY_FOR_S``, ends the wait with :class:`ServerError` naming its log (vLLM's API
        server keeps a request open forever when its engine core is killed).
        """
        pending = set(futures)
        answered = {url: time.monotonic() for url in self.urls}  # the last /health answer (or the wait's start)
        asked = dict(answered)
        while pending:
            done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_EXCEPTION)
            if failed := next((f for f in done if f.exception() is not None), None):
                raise failed.exception()
            if pending and (
                fault := servers_fault(self.servers, self.urls, self.api_key, self.describe, answered, asked)
            ):
                raise ServerError(f"{what}: {fault}")
        return [f.result() for f in futures]

    def _served_model(self) -> str:
        contexts = []
        for url in self.urls:
            answer = self._request(url, "/v1/models", method="get", timeout=_STARTUP_PROBE_S)
            models = answer.get("data") if isinstance(answer, dict) else None
            if not isinstance(models, list) or not models or not isinstance(models[0], dict) or "id" not in models[0]:
                raise ServerError(
                    f"/v1/models on {url} answered {str(answer)[:200]!r}, not vLLM's model list; {self.describe()}"
                )
            contexts.append(models[0].get("max_model_len"))
        self._context = min((c for c in contexts if isinstance(c, int)), default=None)
        return models[0]["id"]

    @property
    def context_length(self) -> tuple[int, str] | None:
        """The longest prompt + completion the servers take (their ``max_model_len``, the smallest of
        several), and where it is set; None when a server does not say."""
        if self._context is None:
            return None
        where = (
            "rollout.init_args.engine_options.max_model_len" if self.servers else "the vLLM server's --max-model-len"
        )
        return self._context, f"vLLM's max_model_len: {where}"

    def _check_settings(self, url: str) -> None:
        """Refuse a given server whose log-probs are not the processed ones (π_old would be silently
        wrong) or whose weight-transfer backend is not this engine's (``/server_info``, vLLM's dev
        mode; the route runs vLLM's environment report, seconds of CPU, so a server lit_rlvr started
        with its own flags is not asked)."""
        answer = self._request(url, "/server_info?config_format=json", method="get", timeout=_STARTUP_PROBE_S)
        info = answer.get("vllm_config") if isinstance(answer, dict) else None
        if not isinstance(info, dict):
            raise ServerError(
                f"/server_info on {url} answered {str(answer)[:200]!r}, not vLLM's server info; {self.describe()}"
            )
        wanted = {
            "logprobs_mode": ("processed_logprobs", "--logprobs-mode processed_logprobs"),
            "backend": (
                _BACKENDS[self.weight_transfer],
                f'--weight-transfer-config \'{{"backend": "{_BACKENDS[self.weight_transfer]}"}}\'',
            ),
        }
        got = {
            "logprobs_mode": (info.get("model_config") or {}).get("logprobs_mode"),
            "backend": (info.get("weight_transfer_config") or {}).get("backend"),
        }
        wrong = [
            f"{key} is {got[key]!r}, needs {value!r} (start it with {flag})"
            for key, (value, flag) in wanted.items()
            if got[key] != value
        ]
        if wrong:
            raise ServerError(f"the vLLM server at {url} cannot serve lit_rlvr's rollouts: " + "; ".join(wrong))
        if self.adapter is None:
            return
        rank = (info.get("lora_config") or {}).get("max_lora_rank", 0)
        loads = (answer.get("vllm_env") or {}).get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") in (True, "True", "1", 1)
        if rank < self.adapter.max_lora_rank or not loads:
            has = f"serves LoRA adapters up to rank {rank}" + ("" if loads else " and cannot load one at runtime")
            self.adapter.refuse(
                f"the vLLM server at {url} {has} (start it with {' '.join(self.adapter.server_args())} and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 to serve the policy's adapter)"
            )
            self.adapter = None

    def _warn_if_open(self, url: str) -> None:
        """Warn when a given server answers a weight route without the API key: anyone who reaches
        it can replace the weights it serves."""
        import requests
        from lightning.pytorch.utilities import rank_zero_warn

        try:
            status = requests.get(f"{url}/is_paused", timeout=_STARTUP_PROBE_S).status_code
        except requests.RequestException:
            return
        if status == 200:
            rank_zero_warn(
                f"the vLLM server at {url} answers its weight routes without the API key: anyone who reaches it can "
                f"replace the weights it serves. Start it with --middleware {KEY_MIDDLEWARE} and its key in VLLM_API_KEY "
                "(docs/generation.md, Security)."
            )

    # ------------------------------------------------------------------ generation

    def _completion(self, url: str, prompt: list[int], params: SamplingParams, seed: int | None, n: int) -> list[dict]:
        """One ``/v1/completions`` request: ``n`` samples of ``prompt``, checked (:func:`checked_choices`).

        The penalties and ``min_p`` are sent as the colocated engine samples (neutral): vLLM's
        server otherwise takes them from the model's ``generation_config.json`` (Qwen2.5-Instruct:
        ``repetition_penalty: 1.05``) and π_old would not be the policy's distribution.
        """
        body = {
            "model": self.model_name,
            "prompt": list(prompt),
            "n": n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "max_tokens": params.max_new_tokens,
            "stop": list(params.stop) or None,
            "include_stop_str_in_output": True,
            "logprobs": 0,
            "return_token_ids": True,
            "stop_token_ids": self.turn_end_ids or None,
            "seed": seed,
        }
        answer = self._http(
            url, "/v1/completions", body, "post", request_timeout(self.generate_timeout_s, params.max_new_tokens)
        )
        try:
            return checked_choices(answer, n, params.max_new_tokens, self.vocab_size)
        except ValueError as err:
            raise ServerError(
                f"/v1/completions on {url} answered what vLLM does not: {err}; {self.describe()}"
            ) from None

    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        n = params.n
        per_request = 1 if params.temperature == 0 else n  # vLLM refuses n > 1 greedy, as the colocated engine
        copies = n // per_request
        requests = [(p, c) for p in range(len(prompt_ids)) for c in range(copies)]
        self._longest = max(self._longest, params.max_new_tokens)
        futures = [
            self._pool.submit(
                self._completion,
                self.urls[i % len(self.urls)],
                prompt_ids[p],
                params,
                None if params.seed is None else params.seed + i * n,
                per_request,
            )
            for i, (p, _) in enumerate(requests)
        ]
        completions, logprobs, reasons, texts = [], [], [], []
        for choices in self._await(
            futures, f"generation of {len(prompt_ids)} prompts x {n}"
        ):  # in request order: prompt-major
            for choice in choices:
                completions.append(list(choice["token_ids"]))
                logprobs.append([float(x) for x in choice["logprobs"]["token_logprobs"]])
                reasons.append(choice["finish_reason"])
                texts.append(choice["text"])
        return Rollouts([list(p) for p in prompt_ids], completions, logprobs, reasons, n, texts)

    def probe_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Per-token log-probs at temperature 1 of ``completion_ids`` after ``prompt_ids``, from the first server."""
        seq = list(prompt_ids) + list(completion_ids)
        body = {"model": self.model_name, "prompt": seq, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        answer = self._request(
            self.urls[0], "/v1/completions", body, timeout=request_timeout(self.generate_timeout_s, 1)
        )
        try:
            return checked_probe(answer, seq, len(prompt_ids))
        except ValueError as err:
            raise ServerError(
                f"/v1/completions on {self.urls[0]} answered what vLLM does not: {err}; {self.describe()}"
            ) from None

    # ------------------------------------------------------------------ weight sync

    @property
    def model_name(self) -> str:
        """What requests name: the current adapter's name after an adapter sync, else the served model."""
        return (
            f"{ADAPTER_PREFIX}{self.version}" if self.adapter is not None and self._base_synced else self.served_model
        )

    def _client(self, url: str) -> _SyncClient:
        if url not in self._clients:
            self._clients[url] = _SyncClient(self, url)
        return self._clients[url]

    def _sender(self, url: str, source: PolicyWeights):
        """vLLM's trainer-side weight-transfer engine for ``url`` (made at its first full sync), set to send ``source``."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        import lit_rlvr.vllm_plugin

        lit_rlvr.vllm_plugin.register()
        bucket = self.sync_bucket_mb * 2**20
        if url not in self._senders:
            if self.weight_transfer == "file":
                from lit_rlvr.rollout.weight_transfer import FileTrainerInitInfo

                init = FileTrainerInitInfo(rank=0, chunk_bytes=bucket)
            else:
                from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

                world = self._request(url, "/get_world_size", method="get", timeout=_STARTUP_PROBE_S)["world_size"]
                init = NCCLTrainerInitInfo(
                    self.nccl[0], self.nccl[1] or 29501, world_size=world + 1, rank=0, packed_buffer_size_bytes=bucket
                )
            self._senders[url] = WeightTransferTrainerFactory.trainer_init(
                init, client=self._client(url), source=source
            )
        self._senders[url].source = source
        return self._senders[url]

    def _update_weights(self, model: nn.Module) -> None:
        """Pause → transfer → version → resume, on every server.

        A full sync (merged weights, or an adapter sync's base weights the first time) goes through
        the weight-transfer routes; an adapter sync then writes the adapter once and loads it on
        every server. Servers given by URL to several trainer ranks are shared: every rank generates
        on them and rank 0 alone syncs them, between two barriers (no rank generates or scores while
        the weights change; the other ranks walk the same weight streams, whose FSDP2 gathers are
        collectives, and drop them).
        """
        import torch.distributed as dist

        self.version += 1
        full = self.adapter is None or not self._base_synced
        sends = not self.shared or self.rank == 0
        if self.shared:
            dist.barrier()
        try:
            stored = self._adapters.write(model, self.version, write=sends) if self.adapter is not None else None
            if sends:
                self._send_all(model, full, stored)
            else:
                for _ in self.urls if full else ():
                    for _ in PolicyWeights(model, merged=self.adapter is None):
                        pass
        finally:
            if self.shared:
                dist.barrier()
        self._base_synced = True

    def _send_all(self, model: nn.Module, full: bool, stored: StoredAdapter | None) -> None:
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) if full else 0
        for url in self.urls:
            client = self._client(url)
            # /pause?mode=wait waits for the generation in flight; a chunk or a broadcast moves weights
            client.timeout_s = request_timeout(
                self.sync_timeout_s, self._longest, weight_bytes + (stored.nbytes if stored else 0)
            )
            client.post("/pause?mode=wait")
            try:
                if full:
                    source = PolicyWeights(model, merged=self.adapter is None)
                    self._sender(url, source).send_weights()
                    self._stats.sync_bytes += source.nbytes
                if stored is not None:
                    self._load_adapter(client, stored)
                client.post("/update_weight_version", {"new_version": str(self.version)})
            finally:
                client.post("/resume")
        if stored is not None:
            self._adapters.drop(self._lora)
            self._lora = stored

    def _load_adapter(self, client: _SyncClient, stored: StoredAdapter) -> None:
        """Load ``stored`` on ``client``'s server, then unload the adapter it replaces."""
        try:
            client.post("/v1/load_lora_adapter", {"lora_name": stored.name, "lora_path": str(stored.path)})
        except ServerError as err:
            raise ServerError(
                f"{client.url} did not load the policy's LoRA adapter ({err}); rollout.adapter_sync: false "
                "syncs merged weights instead"
            ) from None
        self._stats.sync_bytes += stored.nbytes
        if self._lora is not None:
            client.post("/v1/unload_lora_adapter", {"lora_name": self._lora.name})

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        """:meth:`EngineBase.generate`, its timeout naming the server's log."""
        try:
            return super().generate(prompt_ids, params)
        except TimeoutError as err:
            raise ServerError(f"{err} {self.describe()}") from None

    def update_weights(self, model: nn.Module) -> None:
        """:meth:`EngineBase.update_weights`, its timeout naming the server's log."""
        try:
            super().update_weights(model)
        except TimeoutError as err:
            raise ServerError(f"{err} {self.describe()}") from None

    def close(self) -> None:
        """Stop the servers started here (a server given by URL is the user's) and the request pool."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for server in self.servers:
            server.stop()
        self.servers = []
        if self._adapters is not None:
            self._adapters.close()


def _trainer_rank() -> tuple[int, int]:
    """``(rank, world size)`` of the trainer's default process group ((0, 1) without one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@ENGINES.register("vllm_server", signature=VLLMServerEngine, check=check_server_options)
def build_vllm_server_engine(
    *,
    model: nn.Module | None = None,
    tokenizer=None,
    model_path: str | None = None,
    adapter_sync: bool | str = False,
    **kwargs,
) -> VLLMServerEngine:
    """``engine: vllm_server``: a :class:`VLLMServerEngine`; a started server loads ``model_path``
    (default: the policy's own path) in the trainer's dtype unless ``dtype`` is given; completions
    are checked against the policy's output size (``config.vocab_size``); ``adapter_sync``
    (``rollout.adapter_sync``; default here False, merged) as for ``engine: vllm``."""
    if model_path is None:
        if model is None:
            raise ValueError("build_engine('vllm_server') needs model_path or the policy model to find one")
        model_path = engine_model_path(model, tokenizer)
    if model is not None and kwargs.get("dtype", "auto") == "auto":
        kwargs["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    if model is not None and isinstance(getattr(getattr(model, "config", None), "vocab_size", None), int):
        kwargs.setdefault("vocab_size", model.config.vocab_size)
    kwargs.setdefault("adapter", adapter_serving(model, adapter_sync))
    return VLLMServerEngine(model_path, tokenizer=tokenizer, **kwargs)


def _adapter_directory() -> str:
    """Where the adapters go: the directory the ``lit_rlvr_file`` chunks go to (``/dev/shm`` when it exists)."""
    from lit_rlvr.rollout.weight_transfer import default_directory

    return default_directory()
