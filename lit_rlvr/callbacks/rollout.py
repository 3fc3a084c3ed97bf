"""The rollout Callback: generate before each batch, sync weights after each optimizer step.

What to sample is the module's (:class:`~lit_rlvr.contracts.RolloutHost`: ``sampling``,
``val_sampling``, ``environment``), so the loss's normaliser and temperature always match the
rollouts; this Callback decides how (docs/generation.md). Before each training batch
(:class:`~lit_rlvr.contracts.TrainBatch`) it sets ``batch.rollouts``, G prompt-major completions
per prompt (:class:`~lit_rlvr.rollout.types.Rollouts`), which ``training_step`` then reads;
validation and test batches (:class:`~lit_rlvr.contracts.ValBatch`) get ``batch.n_samples`` per
prompt. Multi-turn rollouts run each row's environment turn by turn
(:class:`~lit_rlvr.rollout.turns.RolloutSampler`).

Weight sync follows the optimizer, not the batch: every ``sync_every_n_steps`` optimizer steps,
at fit start and before validation if steps went unsynced, each verified with the probe
fingerprint (:func:`~lit_rlvr.rollout.engine.check_fingerprint`). Under DDP or FSDP2 every rank
owns an engine and every engine operation runs on all ranks together
(:meth:`~lit_rlvr.ranks.RankGroup.run_on_all`: a failure on one rank raises on every rank).
Asynchronous rollouts (``max_staleness: k``) are generated ahead, at most k weight versions behind
(:mod:`lit_rlvr.callbacks.rollout_producer`). Logged: :func:`~lit_rlvr.rollout.metrics.rollout_metrics`,
``rollout/drift`` (:func:`~lit_rlvr.rollout.engine.logprob_drift`), and on syncs
``rollout/sync_seconds`` and ``rollout/fingerprint_err``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lit_rlvr.callbacks.rollout_producer import AsyncRollouts
from lit_rlvr.contracts import PromptData, RolloutHost, TrainBatch, ValBatch, checked_batch, require
from lit_rlvr.policy import gathered_parameters
from lit_rlvr.ranks import RankGroup
from lit_rlvr.rollout.engine import (
    SYNC_BUCKET_MB,
    RolloutEngine,
    build_engine,
    context_length,
    fingerprint_error,
    policy_drift,
    probe_sequence,
)
from lit_rlvr.rollout.metrics import rollout_metrics
from lit_rlvr.rollout.options import RolloutOptions
from lit_rlvr.rollout.seeds import step_sampling, validation_sampling
from lit_rlvr.rollout.turns import RolloutSampler
from lit_rlvr.rollout.types import Rollouts, SamplingParams


class RolloutCallback(Callback):
    """Own a rollout engine and attach rollouts to every train/validation batch.

    What to sample comes from the module (``pl_module.sampling``, ``pl_module.val_sampling``);
    this Callback decides only how: the engine, its weight sync and its checks. The arguments
    are checked together as a :class:`~lit_rlvr.rollout.options.RolloutOptions` (``self.options``).

    Args:
        engine: a name in :data:`~lit_rlvr.rollout.engine.ENGINES` — ``"auto"`` (vLLM if
            importable, else transformers), ``"vllm"``, ``"hf"`` — or a ready
            :class:`~lit_rlvr.rollout.engine.RolloutEngine` (then not closed by the Callback).
        engine_options: the engine's options (e.g. vLLM's ``dtype``, ``max_model_len``,
            ``kv_cache_memory_bytes``, ``gpu_memory_utilization``, ``enable_sleep_mode``; the HF
            engine's ``max_batch_rows``, ``decode``, ``prefix_cache_mb``), checked against the engine at start-up.
        model_path: what vLLM loads (default: the policy's ``name_or_path``).
        sync_every_n_steps: optimizer steps between weight syncs (1 = on-policy).
        fingerprint: verify every sync (one forward of a 24-token probe on each side; an engine
            that samples from the policy module itself is identical to it and reports 0).
        fingerprint_atol: tolerance of the check (default by policy dtype).
        drift_every_n_steps: compute drift every n steps (one no-grad forward over the
            rollouts, in the module's micro-batches; ~15% of a small model's step, hence
            sampled); 0 = never.
        generate_timeout_s / sync_timeout_s: fail instead of hanging (None: no limit of the
            callback's own; ``vllm_server`` then sizes each request's timeout from its work and
            watches the server's processes; with several processes the ranks wait for each
            other up to torch's default process-group timeout, 30 min).
        max_staleness: None = the synchronous loop; k ≥ 0 = asynchronous rollouts, generated up to
            k weight versions (training batches) ahead of training (needs an engine that
            generates apart, ``vllm_server``, and ``sync_every_n_steps: 1``; 0 = the synchronous
            run bit for bit, generated while the loop loads the next batch).
        on_stale: ``wait`` (the generator waits so no batch is older than k) or ``drop`` (it
            runs one batch further; a batch older than k is dropped, counted and generated again).
        adapter_sync: how a LoRA policy reaches a vLLM engine (``vllm``, ``vllm_server``): ``auto``
            (the adapter alone after the base weights once, when vLLM can serve it; else merged
            weights, saying why), ``true`` (the adapter alone, or an error at start-up), ``false``
            (merged weights); docs/generation.md, "Which sync runs when".
        sync_bucket_mb: the most weights a full sync moves at once, in MB (a ``file`` chunk, an
            NCCL buffer, a multi-process engine's file): the sender's extra memory during a sync.
    """

    def __init__(
        self,
        engine: str | RolloutEngine = "auto",
        engine_options: dict[str, Any] | None = None,
        model_path: str | None = None,
        sync_every_n_steps: int = 1,
        fingerprint: bool = True,
        fingerprint_atol: float | None = None,
        drift_every_n_steps: int = 10,
        generate_timeout_s: float | None = None,
        sync_timeout_s: float | None = None,
        max_staleness: int | None = None,
        on_stale: str = "wait",
        adapter_sync: bool | Literal["auto"] = "auto",
        sync_bucket_mb: int = SYNC_BUCKET_MB,
    ):
        super().__init__()
        self.options = RolloutOptions.from_keys(locals())  # every argument checked, together
        self.engine: RolloutEngine | None = None if isinstance(engine, str) else engine
        self._owns_engine = isinstance(engine, str)
        self.ranks = RankGroup()  # the training ranks, joined at setup: an engine operation fails on all or none
        self.train_sampling: SamplingParams | None = None  # the module's, read at setup
        self.val_sampling: SamplingParams | None = None
        self.steps_since_sync = 0
        self.total_rollout_tokens = 0
        self.last_fingerprint_err: float | None = None
        self.last_metrics: dict[str, float] = {}  # of the latest training batch, for other Callbacks
        self._force_sync = True  # a new engine or restored weights
        self._step_at_batch_start = 0
        self._probe: tuple[list[int], list[int]] | None = None
        self._rank = 0
        self.sampler: RolloutSampler | None = None  # single- or multi-turn, the module's environment: made at setup
        self.asynchronous: AsyncRollouts | None = None
        if max_staleness is not None:  # they generate with the engine built at setup
            sample = lambda prompt_ids, rows, params: self.sampler(self.engine, prompt_ids, rows, params)  # noqa: E731
            params_at = lambda global_step, lane: self.train_params(global_step, self._rank, lane)  # noqa: E731
            self.asynchronous = AsyncRollouts(self.options.asynchronous, sample, params_at)

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(engine=self.options.engine_kind)

    # ------------------------------------------------------------------ engine lifecycle

    def build_engine(self, pl_module: LightningModule) -> RolloutEngine:
        """Create the engine for ``pl_module.policy`` (override to customise construction)."""
        o = self.options
        return build_engine(
            o.engine_kind,
            model=pl_module.policy,
            tokenizer=pl_module.tokenizer,
            model_path=o.model_path,
            **o.engine_kwargs(),
        )

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        require(pl_module, RolloutHost, "RolloutCallback")
        self.train_sampling, self.val_sampling = pl_module.sampling, pl_module.val_sampling
        self._rank = trainer.global_rank
        if self.engine is None:
            self.engine = self.build_engine(pl_module)
            self._force_sync = True
        if self.ranks.group is None:
            self.ranks = RankGroup.join(trainer.world_size)  # a collective: every rank calls setup
        self._probe = probe_sequence(len(pl_module.tokenizer))
        found = context_length(self.engine, pl_module.policy)
        self.sampler = RolloutSampler(pl_module.tokenizer, pl_module.environment, found[0] if found else None)
        self.fit_context(trainer, pl_module)

    def fit_context(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Have the DataModule skip (as bad rows, file:line) the prompts that cannot be generated
        from: prompt tokens + ``max_new_tokens`` (multi-turn: one turn's cap) beyond the engine's context
        (:func:`~lit_rlvr.rollout.engine.context_length`), which vLLM refuses mid-run and a model
        past its positions samples from without a word."""
        datamodule = trainer.datamodule  # None: plain dataloaders, nothing to fit
        if datamodule is None:
            return
        require(datamodule, PromptData, "RolloutCallback", "DataModule")
        found = context_length(self.engine, pl_module.policy)
        if found is not None:
            first = self.sampler.turn_tokens  # a multi-turn trajectory's later turns are bounded by the context itself
            datamodule.fit_context(found[0], first(self.train_sampling), first(self.val_sampling), found[1])

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.asynchronous is not None:
            self.asynchronous.stop()
        if self._owns_engine and self.engine is not None:
            self.engine.close()
            self.engine = None
        self.ranks = RankGroup()  # the next stage may run in another process group

    # ------------------------------------------------------------------ hooks

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._force_sync:  # after setup and checkpoint restore, before sanity validation
            self.sync(pl_module)

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step
        metrics = self._sync_between_batches(pl_module) if self._must_sync() else {}
        params = self.train_params(trainer.global_step, self._rank)
        batch = checked_batch(batch, TrainBatch, "RolloutCallback")
        with gathered_parameters(trainer):  # FSDP1 only: the live HF engine samples the full policy
            if self.asynchronous is None:
                batch.rollouts, generated = self._generate(batch.prompt_ids, batch.rows, params, "rollout")
            else:
                batch.rollouts, generated = self._take(trainer, batch)
            metrics.update(generated)
            if self.options.drift_every_n_steps and trainer.global_step % self.options.drift_every_n_steps == 0:
                metrics["rollout/drift"] = self.drift(pl_module, batch.rollouts, params.temperature)
        self.last_metrics = metrics
        self._log(
            pl_module,
            metrics,
            len(batch.prompt_ids),
            prog_bar=("rollout/seconds", "rollout/tokens_per_s", "rollout/mean_len"),
        )

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stepped = trainer.global_step - self._step_at_batch_start
        if stepped > 0:  # else gradient accumulation: no optimizer step yet
            self.steps_since_sync += stepped
            if self.steps_since_sync >= self.options.sync_every_n_steps:
                self._log(pl_module, self._sync_between_batches(pl_module), len(batch.prompt_ids))
        if self.asynchronous is not None:
            self.asynchronous.synced()

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.asynchronous is not None:  # the generator waits: the engine evaluates alone
            self.asynchronous.hold()
        if self._must_sync() or self.steps_since_sync > 0:  # evaluate the current policy
            self.sync(pl_module)

    @override
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        batch = checked_batch(batch, ValBatch, "RolloutCallback")
        params = validation_sampling(self.val_sampling, int(batch.n_samples), batch_idx, dataloader_idx, self._rank)
        with gathered_parameters(trainer):
            batch.rollouts, metrics = self._generate(batch.prompt_ids, batch.rows, params, "val_rollout")
        self._log(pl_module, metrics, len(batch.prompt_ids), sync_dist=True)  # epoch means across ranks

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.asynchronous is not None:
            self.asynchronous.release()

    @override
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.on_validation_start(trainer, pl_module)

    @override
    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.on_validation_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self.asynchronous is not None:
            self.asynchronous.stop()

    @override
    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._force_sync = True  # the policy's weights were just replaced

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "steps_since_sync": self.steps_since_sync,
            "total_rollout_tokens": self.total_rollout_tokens,
            "staleness_counts": dict(self.asynchronous.staleness_counts) if self.asynchronous is not None else {},
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps_since_sync = state_dict["steps_since_sync"]
        self.total_rollout_tokens = state_dict["total_rollout_tokens"]
        if self.asynchronous is not None:  # a producer starts afresh: what was in flight is generated again
            self.asynchronous.staleness_counts = {int(s): c for s, c in state_dict.get("staleness_counts", {}).items()}
        self._force_sync = True

    # ------------------------------------------------------------------ weight sync

    def sync(self, pl_module: LightningModule) -> dict[str, float]:
        """Push the policy's weights to the engine and verify them; returns sync metrics."""
        with gathered_parameters(pl_module._trainer):
            return self._sync(pl_module)

    def _sync(self, pl_module: LightningModule) -> dict[str, float]:
        o = self.options
        # an engine sampling from the policy module itself is identical to it by construction:
        # comparing the module with itself would cost two forwards per step for a certain 0
        check = o.fingerprint and getattr(self.engine, "model", None) is not pl_module.policy
        metrics = {}

        def push() -> list[float] | None:
            t0 = time.perf_counter()
            self.engine.update_weights(pl_module.policy)
            metrics["rollout/sync_seconds"] = time.perf_counter() - t0
            return self.engine.probe_logprobs(*self._probe) if check else None

        engine_lp = self.ranks.run_on_all(f"{self.engine.name} weight sync", push, o.sync_limit_s(check))
        if o.fingerprint:
            self.last_fingerprint_err = (
                self.ranks.run_on_all(  # every rank together: the trainer's forward may be a collective
                    f"{self.engine.name} weight-sync fingerprint",
                    lambda: (
                        fingerprint_error(
                            engine_lp, pl_module.policy, self._probe, o.fingerprint_atol, self.engine.name
                        )
                        if check
                        else 0.0
                    ),
                    o.sync_timeout_s,
                )
            )
            metrics["rollout/fingerprint_err"] = self.last_fingerprint_err
        self.steps_since_sync = 0
        self._force_sync = False
        return metrics

    def _sync_between_batches(self, pl_module: LightningModule) -> dict[str, float]:
        if self.asynchronous is None:
            return self.sync(pl_module)
        with self.asynchronous.paused():  # the batch in generation finishes under the old weights
            return self.sync(pl_module)

    def _must_sync(self) -> bool:
        """A new engine, restored weights, or an engine whose sleep dropped its weights."""
        return self._force_sync or getattr(self.engine, "requires_sync", False)

    # ------------------------------------------------------------------ rollouts

    def _generate(
        self, prompt_ids: list[list[int]], rows: list[dict], params: SamplingParams, prefix: str
    ) -> tuple[Rollouts, dict[str, float]]:
        t0 = time.perf_counter()
        what = f"{self.engine.name} generate of {len(prompt_ids)} prompts x {params.n} samples"
        sample = lambda: self.sampler(self.engine, prompt_ids, rows, params)  # noqa: E731
        rollouts = self.ranks.run_on_all(what, sample, self.options.generate_timeout_s)
        seconds = time.perf_counter() - t0
        self.total_rollout_tokens += rollouts.num_tokens()
        return rollouts, rollout_metrics(rollouts, seconds, seconds, prefix)

    def _take(self, trainer: Trainer, batch: TrainBatch) -> tuple[Rollouts, dict[str, float]]:
        """Asynchronous rollouts: this batch's, generated ahead (:class:`~lit_rlvr.callbacks.rollout_producer.AsyncRollouts`)."""
        timeout = self.options.generate_timeout_s
        produced, seconds, ahead = self.asynchronous.take(
            trainer, batch, lambda what, fn: self.ranks.run_on_all(f"{self.engine.name} {what}", fn, timeout)
        )
        self.total_rollout_tokens += produced.rollouts.num_tokens()
        return produced.rollouts, {**rollout_metrics(produced.rollouts, seconds, produced.seconds), **ahead}

    def drift(self, pl_module: LightningModule, rollouts: Rollouts, temperature: float) -> float:
        """Mean |sampler − trainer log-prob| over the rollouts' completion tokens (:func:`~lit_rlvr.rollout.engine.policy_drift`),
        the trainer's in the module's micro-batches (``pl_module.micro_batching``), as many forwards on every rank (FSDP)."""
        pad_id = pl_module.tokenizer.pad_token_id or 0  # a tokenizer without a pad token: 0
        return policy_drift(
            pl_module.policy, rollouts, pad_id, temperature, pl_module.micro_batching, pl_module.lockstep.most
        )

    def train_params(self, global_step: int, rank: int = 0, lane: int = 0) -> SamplingParams:
        """The sampling parameters of the training rollout at ``global_step`` on ``rank`` (:func:`step_sampling`)."""
        if self.train_sampling is None:
            raise RuntimeError("RolloutCallback.train_params before setup: the sampling settings are the module's")
        return step_sampling(self.train_sampling, global_step, rank, lane)

    @staticmethod
    def _log(
        pl_module: LightningModule,
        metrics: dict[str, float],
        batch_size: int,
        prog_bar: tuple[str, ...] = (),
        sync_dist: bool = False,
    ) -> None:
        for key, value in metrics.items():
            pl_module.log(key, float(value), prog_bar=key in prog_bar, batch_size=batch_size, sync_dist=sync_dist)
