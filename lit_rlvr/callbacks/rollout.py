"""The rollout Callback: generate before each batch, sync weights after each optimizer step.

The LightningModule reads as the research recipe (score, advantages, loss); the sampling
engine is engineering, so it lives here. What to sample is the module's: its ``sampling`` (the
group size G = ``sampling.n``, temperature, length cap, seed) and ``val_sampling``
(:class:`~lit_rlvr.contracts.RolloutHost`), so the loss's normaliser and temperature always match
the rollouts. Per training batch (:class:`~lit_rlvr.contracts.TrainBatch`) the Callback generates
G completions per prompt with the engine and sets ``batch.rollouts`` (a prompt-major
:class:`~lit_rlvr.rollout.types.Rollouts`; the module calls ``.to_padded(pad_id)`` for
``input_ids``, masks, ``old_logprobs`` and ``group_ids``). Lightning hands the same object to
``training_step``, so the module (and any later Callback) sees the rollouts. Validation (and test)
batches (:class:`~lit_rlvr.contracts.ValBatch`) get ``batch.n_samples`` samples per prompt.

Weight sync follows the optimizer, not the batch: after a batch in which ``trainer.global_step``
advanced (gradient accumulation steps do not count) and every ``sync_every_n_steps`` steps.
Each sync is verified with the probe fingerprint (:func:`~lit_rlvr.rollout.engine.check_fingerprint`). The engine is
also re-synced at fit start (a vLLM engine starts from the checkpoint on disk, which after a
resume or a LoRA wrap is not the policy) and before validation if steps went unsynced.

Under multi-process training (DDP, FSDP2) every rank owns an engine and generates for its own
prompts, with its own seed (:mod:`lit_rlvr.rollout.seeds`). Every
engine operation (sync, fingerprint, generation) runs on all ranks together
(:meth:`~lit_rlvr.ranks.RankGroup.run_on_all`): when it raised, died or hung on one rank (beyond
``sync_timeout_s`` / ``generate_timeout_s`` plus 10 s), every rank raises
:class:`~lit_rlvr.ranks.RolloutRankError` naming that rank. The fingerprint's trainer-side forward
is a collective under FSDP2, so every rank takes the probe's log-probs from its engine first, and
all check together.

At set-up the callback has the DataModule skip, as bad rows with file:line, the prompts whose
tokens plus ``max_new_tokens`` exceed the engine's context (:meth:`RolloutCallback.fit_context`).

Asynchronous rollouts (``max_staleness: k``, an engine that generates apart from the trainer,
``engine: vllm_server``): a :class:`~lit_rlvr.callbacks.rollout_producer.RolloutProducer` thread
generates the batches the loop has not reached yet, at most k weight versions behind; the loop
takes each batch's rollouts, checks they are for its prompts, and syncs after every step (the
producer's batch in generation finishes first: groups and batches stay whole under one version).
k = 0 is the synchronous loop, bit for bit. π_old for the loss is the behaviour policy's (the
sampler's) log-probs; ``model.rollout_correction`` reweights them against the trainer's.

Logged: ``rollout/seconds`` and ``rollout/tokens_per_s`` (progress bar), ``rollout/mean_len``,
``rollout/truncated`` (share of completions cut at ``max_new_tokens``), ``rollout/drift`` (mean
|sampler − trainer log-prob|, :func:`~lit_rlvr.rollout.engine.logprob_drift`), and on syncs
``rollout/sync_seconds`` and ``rollout/fingerprint_err``; asynchronous: ``rollout/staleness``
(of the batch trained), ``rollout/staleness_<s>`` (batches trained at staleness s so far: the
histogram), ``rollout/queue_depth``, ``rollout/generator_idle_s`` and ``rollout/trainer_idle_s``
(cumulative seconds each waited for the other), ``rollout/generated``, ``rollout/trained``,
``rollout/dropped``, ``rollout/in_flight`` (generated = trained + dropped + in flight).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lit_rlvr.callbacks.rollout_producer import RolloutProducer
from lit_rlvr.contracts import PromptSource, RolloutHost, TrainBatch, ValBatch, require
from lit_rlvr.policy import batched_completion_logprobs, gathered_parameters
from lit_rlvr.ranks import RankGroup
from lit_rlvr.rollout.engine import RolloutEngine, build_engine, context_length, fingerprint_error, logprob_drift, probe_sequence
from lit_rlvr.rollout.options import AsyncOptions, RolloutOptions
from lit_rlvr.rollout.seeds import step_sampling, validation_sampling
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
            engine's ``max_batch_rows``, ``decode``), checked against the engine at start-up.
        model_path: what vLLM loads (default: the policy's ``name_or_path``).
        sync_every_n_steps: optimizer steps between weight syncs (1 = on-policy).
        fingerprint: verify every sync (one forward of a 24-token probe on each side; an engine
            that samples from the policy module itself is identical to it and reports 0).
        fingerprint_atol: tolerance of the check (default by policy dtype).
        drift_every_n_steps: compute drift every n steps (one no-grad forward over the
            rollouts, in the module's micro-batches; ~15% of a small model's step, hence
            sampled); 0 = never.
        generate_timeout_s / sync_timeout_s: fail instead of hanging (None = no limit; with
            several processes the ranks then wait for each other up to torch's default
            process-group timeout, 30 min).
        max_staleness: None = the synchronous loop; k ≥ 0 = asynchronous rollouts, generated up to
            k weight versions (training batches) ahead of training (needs an engine that
            generates apart, ``vllm_server``, and ``sync_every_n_steps: 1``; 0 = the synchronous
            run bit for bit, generated while the loop loads the next batch).
        on_stale: ``wait`` (the generator waits so no batch is older than k) or ``drop`` (it
            runs one batch further; a batch older than k is dropped, counted and generated again).
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
    ):
        super().__init__()
        self.options = RolloutOptions(
            engine, dict(engine_options or {}), model_path, sync_every_n_steps, fingerprint, fingerprint_atol,
            drift_every_n_steps, generate_timeout_s, sync_timeout_s,
            None if max_staleness is None else AsyncOptions(max_staleness, on_stale),
        )  # fmt: skip
        self.engine: RolloutEngine | None = None if isinstance(engine, str) else engine
        self._owns_engine = isinstance(engine, str)
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
        self.ranks = RankGroup()  # the training ranks, joined at setup: an engine operation fails on all or none
        self.producer: RolloutProducer | None = None
        self.staleness_counts: dict[int, int] = {}
        self.trainer_idle_s = 0.0
        self._number = 0  # the batch in training (asynchronous rollouts)
        self._val_hold = None  # the producer's lock, held through validation

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(engine=self.options.engine_kind)

    # ------------------------------------------------------------------ engine lifecycle

    def build_engine(self, pl_module: LightningModule) -> RolloutEngine:
        """Create the engine for ``pl_module.policy`` (override to customise construction)."""
        o = self.options
        kwargs = {"generate_timeout_s": o.generate_timeout_s, "sync_timeout_s": o.sync_timeout_s, **o.engine_options}
        return build_engine(o.engine_kind, model=pl_module.policy, tokenizer=pl_module.tokenizer, model_path=o.model_path, **kwargs)

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
        self.fit_context(trainer, pl_module)

    def fit_context(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Have the DataModule skip (as bad rows, file:line) the prompts that cannot be generated
        from: prompt tokens + ``max_new_tokens`` beyond the engine's context
        (:func:`~lit_rlvr.rollout.engine.context_length`), which vLLM refuses mid-run and a model
        past its positions samples from without a word."""
        fit = getattr(getattr(trainer, "datamodule", None), "fit_context", None)
        found = context_length(self.engine, getattr(pl_module, "policy", None))
        if fit is not None and found is not None:
            fit(found[0], self.train_sampling.max_new_tokens, self.val_sampling.max_new_tokens, found[1])

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop_producer()
        if self._owns_engine and self.engine is not None:
            self.engine.close()
            self.engine = None
        self.ranks = RankGroup()  # the next stage may run in another process group

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

        limit = _sum_or_none(o.sync_timeout_s, o.generate_timeout_s if check else 0.0)  # sync + the probe's log-probs
        engine_lp = self.ranks.run_on_all(f"{self.engine.name} weight sync", push, limit)
        if o.fingerprint:
            err = self.ranks.run_on_all(  # every rank together: the trainer's forward may be a collective
                f"{self.engine.name} weight-sync fingerprint",
                lambda: fingerprint_error(engine_lp, pl_module.policy, self._probe, o.fingerprint_atol, self.engine.name)
                if check else 0.0,
                o.sync_timeout_s,
            )
            self.last_fingerprint_err = err
            metrics["rollout/fingerprint_err"] = self.last_fingerprint_err
        self.steps_since_sync = 0
        self._force_sync = False
        return metrics

    # ------------------------------------------------------------------ hooks

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._force_sync:  # after setup and checkpoint restore, before sanity validation
            self.sync(pl_module)

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.producer is not None and self._val_hold is None:  # the generator waits: the engine evaluates alone
            self._val_hold = self.producer.paused()
            self._val_hold.acquire()
        if self._must_sync() or self.steps_since_sync > 0:  # evaluate the current policy
            self.sync(pl_module)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._release_val_hold()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._stop_producer()

    @override
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.on_validation_start(trainer, pl_module)

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step
        metrics = {}
        if self._must_sync():
            metrics.update(self._sync_between_batches(pl_module))
        params = self.train_params(trainer.global_step, self._rank)
        with gathered_parameters(trainer):  # FSDP1 only: the live HF engine samples the full policy
            if self.options.asynchronous is None:
                rollouts, gen_metrics = self._generate(_checked(batch, TrainBatch).prompt_ids, params, "rollout")
            else:
                rollouts, gen_metrics = self._take(trainer, pl_module, _checked(batch, TrainBatch))
            batch.rollouts = rollouts
            metrics.update(gen_metrics)
            if self.options.drift_every_n_steps and trainer.global_step % self.options.drift_every_n_steps == 0:
                metrics["rollout/drift"] = self.drift(pl_module, rollouts, params.temperature)
        self.last_metrics = metrics
        self._log(pl_module, metrics, len(batch.prompt_ids), prog_bar=("rollout/seconds", "rollout/tokens_per_s", "rollout/mean_len"))

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stepped = trainer.global_step - self._step_at_batch_start
        if stepped > 0:  # else gradient accumulation: no optimizer step yet
            self.steps_since_sync += stepped
            if self.steps_since_sync >= self.options.sync_every_n_steps:
                self._log(pl_module, self._sync_between_batches(pl_module), len(batch.prompt_ids))
        if self.producer is not None:  # the weights now hold every update of the batches up to this one
            self.producer.synced(self._number + 1)

    @override
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        batch = _checked(batch, ValBatch)
        params = validation_sampling(self.val_sampling, int(batch.n_samples), batch_idx, dataloader_idx, self._rank)
        with gathered_parameters(trainer):
            rollouts, metrics = self._generate(batch.prompt_ids, params, "val_rollout")
        batch.rollouts = rollouts
        self._log(pl_module, metrics, len(batch.prompt_ids), sync_dist=True)  # epoch means across ranks

    @override
    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.on_validation_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)

    @override
    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._force_sync = True  # the policy's weights were just replaced

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "steps_since_sync": self.steps_since_sync,
            "total_rollout_tokens": self.total_rollout_tokens,
            "staleness_counts": dict(self.staleness_counts),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps_since_sync = state_dict["steps_since_sync"]
        self.total_rollout_tokens = state_dict["total_rollout_tokens"]
        self.staleness_counts = {int(s): c for s, c in state_dict.get("staleness_counts", {}).items()}
        self._force_sync = True  # and a producer starts afresh: what was in flight is generated again

    # ------------------------------------------------------------------ helpers

    def _take(self, trainer: Trainer, pl_module: LightningModule, batch: TrainBatch) -> tuple[Rollouts, dict[str, float]]:
        """Asynchronous rollouts: this batch's from the producer (started at the first batch)."""
        if batch.position is None:
            raise TypeError("asynchronous rollouts need train batches that carry their position (PromptDataModule's do)")
        per_epoch = trainer.num_training_batches
        epoch, step = batch.position
        self._number = epoch * per_epoch + step
        if self.producer is None:
            datamodule = getattr(trainer, "datamodule", None)
            require(datamodule, PromptSource, "RolloutCallback(max_staleness=...)")
            if not isinstance(per_epoch, int):
                raise ValueError("asynchronous rollouts need a train loader of known length (got num_training_batches=inf)")
            self.producer = RolloutProducer(
                generate=self.engine.generate,
                params_at=lambda global_step, lane: self.train_params(global_step, self._rank, lane),
                global_step=lambda: trainer.global_step,
                source=datamodule,
                batches_per_epoch=per_epoch,
                options=self.options.asynchronous,
                steps_left=lambda: trainer.max_steps - trainer.global_step if trainer.max_steps >= 0 else None,
                max_batches=per_epoch * trainer.max_epochs if trainer.max_epochs not in (None, -1) else None,
            )
            self.producer.start(self._number)
        t0 = time.perf_counter()
        produced, waited, staleness = self.ranks.run_on_all(
            f"{self.engine.name} asynchronous rollouts of batch {self._number}",
            lambda: self.producer.take(self._number),
            self.options.generate_timeout_s,
        )
        if produced.prompt_ids != batch.prompt_ids:
            raise RuntimeError(
                f"asynchronous rollouts: the rollouts generated ahead for batch {batch.position} are for other prompts "
                "than the loader's batch (the DataModule's train_prompt_ids_at and its loader disagree)"
            )
        seconds = time.perf_counter() - t0
        self.trainer_idle_s += waited
        self.staleness_counts[staleness] = self.staleness_counts.get(staleness, 0) + 1
        rollouts = produced.rollouts
        tokens = rollouts.num_tokens()
        self.total_rollout_tokens += tokens
        B = len(rollouts.completion_ids)
        p = self.producer
        metrics = {
            "rollout/seconds": seconds,
            "rollout/tokens_per_s": tokens / max(produced.seconds, 1e-9),
            "rollout/mean_len": tokens / B,
            "rollout/truncated": sum(r == "length" for r in rollouts.finish_reasons) / B,
            "rollout/staleness": staleness,
            "rollout/queue_depth": p.queue_depth,
            "rollout/generator_idle_s": p.generator_idle_s,
            "rollout/trainer_idle_s": self.trainer_idle_s,
            "rollout/generated": p.generated,
            "rollout/trained": p.trained,
            "rollout/dropped": p.dropped,
            "rollout/in_flight": p.in_flight,
        }
        metrics.update({f"rollout/staleness_{s}": c for s, c in sorted(self.staleness_counts.items())})
        return rollouts, metrics

    def _sync_between_batches(self, pl_module: LightningModule) -> dict[str, float]:
        if self.producer is None:
            return self.sync(pl_module)
        t0 = time.perf_counter()
        with self.producer.paused():  # the batch in generation finishes under the old weights
            self.trainer_idle_s += time.perf_counter() - t0
            return self.sync(pl_module)

    def _release_val_hold(self) -> None:
        if self._val_hold is not None:
            self._val_hold.release()
            self._val_hold = None

    def _stop_producer(self) -> None:
        self._release_val_hold()
        if self.producer is not None:
            self.producer.stop()
            self.producer = None

    def _must_sync(self) -> bool:
        """A new engine, restored weights, or an engine whose sleep dropped its weights."""
        return self._force_sync or getattr(self.engine, "requires_sync", False)

    def _generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, prefix: str
    ) -> tuple[Rollouts, dict[str, float]]:
        t0 = time.perf_counter()
        what = f"{self.engine.name} generate of {len(prompt_ids)} prompts x {params.n} samples"
        rollouts = self.ranks.run_on_all(what, lambda: self.engine.generate(prompt_ids, params), self.options.generate_timeout_s)
        seconds = time.perf_counter() - t0
        tokens = rollouts.num_tokens()
        self.total_rollout_tokens += tokens
        B = len(rollouts.completion_ids)
        return rollouts, {
            f"{prefix}/seconds": seconds,
            f"{prefix}/tokens_per_s": tokens / max(seconds, 1e-9),
            f"{prefix}/mean_len": tokens / B,
            f"{prefix}/truncated": sum(r == "length" for r in rollouts.finish_reasons) / B,
        }

    @torch.no_grad()
    def drift(self, pl_module: LightningModule, rollouts: Rollouts, temperature: float) -> float:
        """Mean |sampler − trainer log-prob| over the rollouts' completion tokens.

        The trainer's log-probs come from the module's micro-batches (``pl_module.micro_batching``:
        length-sorted, under its row cap and token budget, each cropped to its longest row), as
        its own no-grad passes over a rollout batch.
        """
        policy = pl_module.policy
        pad_id = pl_module.tokenizer.pad_token_id
        padded = rollouts.to_padded(pad_id if pad_id is not None else 0)
        T = padded["response_mask"].shape[1]
        device = next(policy.parameters()).device
        was_training = policy.training
        policy.eval()
        try:
            lp, _ = batched_completion_logprobs(
                policy,
                padded["input_ids"].to(device),
                padded["attention_mask"].to(device),
                T,
                temperature=temperature if temperature > 0 else 1.0,  # greedy: temperature-1 log-probs
                batching=pl_module.micro_batching,
                lockstep=pl_module.lockstep.most,  # FSDP: as many forwards on every rank
            )
        finally:
            policy.train(was_training)
        return logprob_drift(padded["old_logprobs"], lp.float().cpu(), padded["response_mask"]).item()

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


def _checked(batch: Any, kind: type) -> Any:
    """``batch`` if it is a ``kind`` (the DataModule's contract), else a ``TypeError`` naming both."""
    if not isinstance(batch, kind):
        raise TypeError(
            f"RolloutCallback takes lit_rlvr.contracts.{kind.__name__} batches (PromptDataModule makes them), got "
            f"{type(batch).__name__}"
        )
    return batch


def _sum_or_none(*seconds: float | None) -> float | None:
    return None if any(s is None for s in seconds) else sum(seconds)
