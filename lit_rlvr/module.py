"""RLVRModule: the RLVR recipe as a LightningModule.

One training step (METHODS.md):

    rollouts (RolloutCallback) → rewards (BatchScorer) → advantages (ADVANTAGES[name])
    → clipped policy loss (§1) + η · f-divergence on cached π_ref anchors (DPH-RL, §2)
    + β · online KL to π_ref (RKL baseline, §1)

Every method of both papers is this module with different registry names and coefficients:
GRPO/DAPO/Dr.GRPO/RLOO pick an advantage and an aggregation; DPH-RL sets ``divergence`` and
``divergence_coef`` (η) and gets anchor batches from the reference cache through the DataModule;
Pass@k Training picks a ``passk*`` advantage; RKL sets ``kl_coef`` (β).

Engineering choices: optimisation is manual, because one rollout batch feeds ``ppo_epochs`` ×
mini-batches optimizer steps, each accumulated over micro-batches whose losses are scaled by
:func:`lit_rlvr.functional.batching.aggregation_weight` so that accumulation does not change the
update, also across data-parallel ranks (each micro-batch over the ranks' mean normaliser; every
rank runs as many steps and passes, see :meth:`RLVRModule.optimizer_step_on`). Micro-batches group rows of similar length under a row cap and a token budget, each
cropped to its own longest row (:class:`~lit_rlvr.policy.MicroBatching`), and every log-prob
pass (training, old log-probs, reference, anchors) goes through them; with ``padding_free`` the
rows of a micro-batch are packed end to end instead of padded. The sampler's log-probs are the
old log-probs (as in the papers' verl setups), unless ``recompute_old_logprobs``. What is not
the recipe lives elsewhere: rollouts and weight sync in
:class:`~lit_rlvr.callbacks.RolloutCallback`, the validation metrics in
:class:`~lit_rlvr.metrics.ValidationPanel`, export and per-prompt pass counts in
:class:`~lit_rlvr.callbacks.HFExport` and :class:`~lit_rlvr.callbacks.PassCountsWriter`.
"""

from __future__ import annotations

import copy
import inspect
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import torch
from lightning import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lit_rlvr.functional.advantages import ADVANTAGES
from lit_rlvr.functional.batching import aggregation_normaliser, aggregation_weight, crop_padding, split_indices
from lit_rlvr.functional.divergences import DIVERGENCE_LEVELS, DIVERGENCES, divergence_units, f_divergence
from lit_rlvr.functional.losses import (
    KL_ESTIMATORS,
    aggregate,
    checked_aggregation,
    kl_estimate,
    masked_row_mean,
    nonfinite_count,
    policy_loss,
)
from lit_rlvr.functional.metrics import mixed_reward_rows
from lit_rlvr.metrics.panel import ValidationPanel
from lit_rlvr.policy import (
    LoraOptions,
    MicroBatching,
    batched_completion_logprobs,
    check_padding_free,
    load_policy,
    packs_sequences,
    shard_fsdp2,
)
from lit_rlvr.rewards.base import STATUSES
from lit_rlvr.rewards.scorer import BatchScorer, check_reward_options, reward_table


_FUSED_ADAMW_DEVICES = ("cpu", "cuda", "xpu", "mps")  # where torch has a fused AdamW kernel


def default_optimizer(params) -> torch.optim.Optimizer:
    """AdamW at the papers' learning rate (1e-6; METHODS.md §2–3), fused where torch has the kernel.

    The fused kernel is the same update (as Hugging Face ``Trainer``'s default
    ``adamw_torch_fused``) in one call over all parameters, where the default CPU implementation
    loops over them in Python (one CPU thread, measured: 0.67 vs 2.55 ms a step for 1.1M parameters,
    6.2 vs 33.5 ms for 9.9M).
    """
    params = list(params)
    devices = {p.device.type for p in params}
    fused = bool(params) and devices <= set(_FUSED_ADAMW_DEVICES) and all(p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0, fused=fused or None)


class RLVRModule(LightningModule):
    """A policy trained with verifiable rewards; the method is chosen by registry names.

    Args:
        model: local path or hub name of a transformers causal LM.
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        attn_implementation: passed to ``from_pretrained`` (e.g. ``sdpa``, ``flash_attention_2``).
        gradient_checkpointing: trade compute for activation memory.
        lora: train a peft LoRA adapter instead of all weights.
        samples_per_prompt: G, rollouts per prompt (linked from the rollout callback by the CLI).
        max_new_tokens: the rollout length cap (Dr. GRPO's normaliser; linked by the CLI).
        temperature: the rollout sampling temperature (linked by the CLI); the trainer's
            log-probs use it too, so the ratio compares like with like. The DPH-RL anchor term
            always uses 1.0, the temperature of the stored π_ref log-probs.
        advantage: name in :data:`ADVANTAGES` (``grpo``, ``rloo``, ``passk``, …).
        advantage_options: keyword options of that estimator (e.g. ``{"k": 4}``).
        loss_agg: ``token_mean`` | ``seq_mean_token_mean`` | ``seq_mean_token_sum_norm``.
        clip_low: ε_low of the clipped surrogate.
        clip_high: ε_high (clip-higher, DAPO).
        dual_clip: c of dual clip for negative advantages (None = off).
        divergence: DPH-RL generator name in :data:`DIVERGENCES` (None = no anchor term).
        divergence_coef: η, multiplies the token-mean divergence of the anchor batch.
        divergence_level: ``token`` (as released) or ``sequence`` ratios.
        divergence_options: options of the generator (e.g. ``{"alpha": 0.5}``).
        divergence_value_cap: cap on each per-token f value with zero gradient beyond (None =
            uncapped, the exact divergence; 10.0 reproduces the DPH-RL release).
        kl_coef: β of the online KL(π_θ‖π_ref) penalty (RKL baseline; 0 = off).
        kl_estimator: ``k1`` | ``k2`` | ``k3``.
        kl_value_cap: cap on each per-token KL estimate (None = uncapped; 10.0 is verl's
            ``low_var_kl``).
        ppo_epochs: passes over each rollout batch.
        mini_batch_size: rows per optimizer step (None = the whole rollout batch).
        micro_batch_size: rows per forward/backward (None = the whole mini-batch).
        micro_batch_tokens: tokens per forward/backward, padding included (verl's
            ``ppo_max_token_len_per_gpu`` with ``use_dynamic_bsz``; None = no budget). Rows are
            grouped longest first so that rows of similar length share a micro-batch, and each
            micro-batch is cropped to its longest row: it costs rows × (longest prompt + longest
            completion) tokens (rows × longest row when padding-free). A row longer than the
            budget is a micro-batch of its own. Also bounds every no-grad log-prob pass.
        padding_free: pack each micro-batch's rows end to end instead of padding them: ``auto``
            (default: where measured faster, flash-attention's varlen kernel anywhere and sdpa on
            CPU, through transformers' block-diagonal mask for packed position ids), ``true``
            (wherever the attention keeps packed sequences apart, e.g. eager, sdpa on GPU),
            ``false`` (always padded). Same log-probs; checked on a probe once per model
            (:func:`lit_rlvr.policy.packs_sequences`).
        dynamic_sampling: drop groups whose rewards are all equal (DAPO).
        recompute_old_logprobs: use the trainer's log-probs at rollout time as old log-probs
            instead of the sampler's.
        max_grad_norm: gradient clipping (None = off).
        reward_workers: processes of the batch scorer (0 = score in the training process).
        reward_timeout: per-item reward deadline in seconds.
        reward_options: keyword options of each reward by name, e.g. ``{"sql": {"mode": "bird"}}``
            (checked at start-up against the reward's keyword-only parameters).
        pass_k: k values reported by validation (those above a set's n are dropped).
        retention_reference: a JSON file of the base policy's per-prompt pass counts (written by
            :class:`~lit_rlvr.callbacks.PassCountsWriter`); retention@k is pass@k over the
            prompts it solved at least once. Without it, the reference cache's base pass counts
            (training prompts) are used when the DataModule has a cache.
        optimizer: optimizer factory (LightningCLI dependency injection).
        lr_scheduler: optional scheduler factory, stepped once per optimizer step.
        seed: seeds the module's own generator (bootstrap advantages, mini-batch shuffling).
    """

    def __init__(
        self,
        model: str,
        dtype: str = "float32",
        attn_implementation: str | None = None,
        gradient_checkpointing: bool = False,
        lora: LoraOptions | None = None,
        samples_per_prompt: int = 8,
        max_new_tokens: int = 512,
        temperature: float = 1.0,
        advantage: str = "grpo",
        advantage_options: dict[str, Any] | None = None,
        loss_agg: str = "token_mean",
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        dual_clip: float | None = None,
        divergence: str | None = None,
        divergence_coef: float = 0.0,
        divergence_level: str = "token",
        divergence_options: dict[str, Any] | None = None,
        divergence_value_cap: float | None = None,
        kl_coef: float = 0.0,
        kl_estimator: str = "k3",
        kl_value_cap: float | None = None,
        ppo_epochs: int = 1,
        mini_batch_size: int | None = None,
        micro_batch_size: int | None = None,
        micro_batch_tokens: int | None = None,
        padding_free: bool | Literal["auto"] = "auto",
        dynamic_sampling: bool = False,
        recompute_old_logprobs: bool = False,
        max_grad_norm: float | None = 1.0,
        reward_workers: int = 0,
        reward_timeout: float = 10.0,
        reward_options: dict[str, dict[str, Any]] | None = None,
        pass_k: list[int] | None = None,
        retention_reference: str | None = None,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        seed: int = 0,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.automatic_optimization = False
        self.set_advantage(advantage, advantage_options)
        self._check_options()
        self.micro_batching = MicroBatching(micro_batch_size, micro_batch_tokens, padding_free)
        self.policy, self.tokenizer = load_policy(model, dtype, attn_implementation, gradient_checkpointing, lora)
        self._reference = None  # frozen π_ref for the RKL baseline (not a submodule: never trained or saved)
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.generator = torch.Generator().manual_seed(seed)
        self.scorer = None
        self.val_panels = torch.nn.ModuleDict()  # one ValidationPanel per validation set
        self.reference_pass_counts = _read_json(retention_reference, "model.retention_reference")

    # ------------------------------------------------------------------ configuration checks
    def set_advantage(self, name: str, options: dict[str, Any] | None = None) -> None:
        """Switch the advantage estimator (used at start-up and by :class:`AdvantageSchedule`)."""
        fn = ADVANTAGES.get_checked(name, "model.advantage")
        options = dict(options or {})
        params = inspect.signature(fn).parameters
        injected = {"entropies", "generator"}
        unknown = (set(options) - set(params)) | (set(options) & injected)
        if unknown:
            accepted = sorted(set(params) - {"rewards", "group_ids"} - injected)
            raise ValueError(
                f"model.advantage_options: {sorted(unknown)} not accepted by advantage {name!r}; accepted: {accepted}"
            )
        k = options.get("k")
        if k is not None and not 1 <= k <= self.hparams.samples_per_prompt:
            raise ValueError(
                f"model.advantage_options.k={k} must be between 1 and samples_per_prompt={self.hparams.samples_per_prompt}"
            )
        self.advantage_name, self.advantage_fn, self.advantage_options = name, fn, options

    def _check_options(self) -> None:
        """Fail at start-up, naming the key, the value and what is accepted (never mid-training)."""
        hp = self.hparams
        checked_aggregation(hp.loss_agg, "model.loss_agg")
        DIVERGENCE_LEVELS.get_checked(hp.divergence_level, "model.divergence_level")
        if hp.divergence is not None:
            _check_divergence(hp.divergence, hp.divergence_options or {}, hp.divergence_level, hp.divergence_value_cap)
        KL_ESTIMATORS.get_checked(hp.kl_estimator, "model.kl_estimator")
        if hp.temperature <= 0:
            raise ValueError(f"model.temperature must be > 0 (sampled rollouts), got {hp.temperature}")
        for key in ("ppo_epochs", "samples_per_prompt", "max_new_tokens"):
            if hp[key] < 1:
                raise ValueError(f"model.{key} must be >= 1, got {hp[key]}")
        for key in ("mini_batch_size", "micro_batch_size", "micro_batch_tokens"):
            if hp[key] is not None and hp[key] < 1:
                raise ValueError(f"model.{key} must be >= 1 or null, got {hp[key]}")
        for key in ("divergence_coef", "kl_coef"):
            if hp[key] < 0:
                raise ValueError(f"model.{key} must be >= 0, got {hp[key]}")
        for key in ("divergence_value_cap", "kl_value_cap"):
            if hp[key] is not None and not hp[key] > 0:
                raise ValueError(f"model.{key} must be > 0 or null (uncapped), got {hp[key]}")
        check_padding_free(hp.padding_free)
        check_reward_options(hp.reward_options or {}, reward_table(), key="model.reward_options")
        if hp.divergence_coef > 0 and hp.divergence is None:
            raise ValueError("model.divergence_coef > 0 needs model.divergence (e.g. 'forward_kl')")

    # ------------------------------------------------------------------ Lightning hooks
    @override
    def configure_model(self) -> None:
        """FSDP2 (``ModelParallelStrategy``): shard every decoder layer, then the whole policy."""
        mesh = getattr(self, "device_mesh", None) if self._trainer is not None else None
        if mesh is not None:
            shard_fsdp2(self.policy, mesh)

    @override
    def configure_optimizers(self):
        params = [p for p in self.policy.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params)
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.lr_scheduler_factory(optimizer)}}

    @override
    def setup(self, stage: str) -> None:
        if self.scorer is None:
            self.scorer = BatchScorer(
                num_workers=self.hparams.reward_workers,
                timeout_s=self.hparams.reward_timeout,
                reward_options=self.hparams.reward_options,
            )
        datamodule = getattr(self.trainer, "datamodule", None)
        if hasattr(datamodule, "all_rows"):
            self.scorer.check_options(datamodule.all_rows())  # option values, before any generation
        for name, n in getattr(datamodule, "val_samples_per_prompt", {}).items():
            if name not in self.val_panels:
                self.val_panels[name] = ValidationPanel(n, self.hparams.pass_k)
        cache = getattr(datamodule, "reference_cache", None)
        if stage == "fit" and cache is not None and self.hparams.lora is None:
            cache.check(model=self.policy)  # the anchors' log π_ref must be this policy's
        if stage == "fit" and self.hparams.divergence_coef > 0 and datamodule is not None and cache is None:
            raise ValueError(
                "model.divergence_coef > 0 (DPH-RL) needs data.cache: build it with `lit-rlvr cache` first"
            )

    @override
    def teardown(self, stage: str) -> None:
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None

    @override
    def on_fit_start(self) -> None:
        if self.hparams.kl_coef > 0 and self.hparams.lora is None and self._reference is None:
            self._reference = copy.deepcopy(self.policy).eval().requires_grad_(False)
        if self._reference is not None:
            self._reference.to(self.device)

    # ------------------------------------------------------------------ the recipe
    @override
    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        rollouts = _require_rollouts(batch)
        rows = [row for row in batch["rows"] for _ in range(rollouts.n)]  # (B,) prompt-major
        rewards = _rewards(self.score(rollouts.texts, rows, prefix="train"))  # (B,)
        data = {k: v.to(self.device) for k, v in rollouts.to_padded(self.tokenizer.pad_token_id).items()}
        data["rewards"] = rewards.to(self.device)
        if self.hparams.recompute_old_logprobs or _declares(self.advantage_fn, "entropies"):
            with torch.no_grad():
                old, entropy = self.logprobs(data, with_entropy=True)
            if self.hparams.recompute_old_logprobs:
                data["old_logprobs"] = old
            data["entropies"] = masked_row_mean(entropy, data["response_mask"])
        data["advantages"] = self.advantages(data)
        keep = self.rows_to_train(data)
        if self.hparams.kl_coef > 0:
            data["ref_logprobs"] = self.reference_logprobs(data)
        anchor = batch.get("anchor") if self.hparams.divergence_coef > 0 else None
        if self.hparams.divergence_coef > 0 and anchor is None:
            rank_zero_warn("DPH-RL: this batch has no anchor samples (empty D_pef?); L_pef is skipped")
        if anchor is not None:
            anchor = {k: v.to(self.device) for k, v in anchor.items()}

        filler = {k: v[:1] for k, v in data.items()}  # a row for the forwards that keep ranks in step
        data = {k: v[keep] for k, v in data.items()}
        losses, kept = [], int(keep.sum())
        # every rank takes the same number of optimizer steps (the most any rank has; none if no rank
        # has a row to learn from): a rank with fewer steps takes steps without rows of its own
        steps = self.lockstep(len(split_indices(kept, self.hparams.mini_batch_size)) if kept else 0)
        for _ in range(self.hparams.ppo_epochs if steps else 0):
            minis = split_indices(kept, self.hparams.mini_batch_size, self.generator) if kept else []
            for i in range(steps):
                mini = {k: v[minis[i]] for k, v in data.items()} if i < len(minis) else None
                losses.append(self.optimizer_step_on(mini, anchor, filler))
        self.log_step(data, rollouts, losses, keep)
        return torch.stack([parts["loss"] for parts in losses]).mean() if losses else torch.zeros(())

    def score(self, texts: list[str], rows: list[dict], prefix: str, with_answers: bool = False):
        """Score results from the batch scorer (with canonical answers for validation); logs each status's share."""
        results = self.scorer.score(texts, rows, with_answers=with_answers) if rows else []
        counts = Counter(r.status for r in results)
        for status in STATUSES:  # every status, every batch: the same keys on every rank (synced means)
            self.log(f"{prefix}/reward_status/{status}", counts[status] / max(len(results), 1), batch_size=max(len(results), 1),
                     add_dataloader_idx=False, sync_dist=True)  # the validation set's name is in the prefix
        return results

    def advantages(self, data: dict[str, Tensor]) -> Tensor:
        """``(B,)`` advantages from the configured estimator (options + injected tensors)."""
        options = dict(self.advantage_options)
        if _declares(self.advantage_fn, "entropies"):
            options["entropies"] = data["entropies"]
        if _declares(self.advantage_fn, "generator"):
            options["generator"] = self.generator
        return self.advantage_fn(data["rewards"].cpu(), data["group_ids"].cpu(), **options).to(self.device)

    def rows_to_train(self, data: dict[str, Tensor]) -> Tensor:
        """``(B,)`` bool: every row, or with dynamic sampling only groups with mixed rewards (DAPO)."""
        if self.hparams.dynamic_sampling:
            return mixed_reward_rows(data["rewards"], data["group_ids"])
        return torch.ones_like(data["rewards"], dtype=torch.bool)

    def logprobs(self, data: dict[str, Tensor], with_entropy: bool = False, model=None, temperature: float | None = None):
        """Per-token log-probs ``(B, T)`` (and entropies) at the rollout temperature by default.

        In the module's micro-batches (:attr:`micro_batching`), so the no-grad passes over a whole
        rollout batch pad only within similar lengths; a training micro-batch is one forward.
        """
        T = data["response_mask"].shape[1]
        temperature = self.hparams.temperature if temperature is None else temperature
        lockstep = None if torch.is_grad_enabled() else self.lockstep  # a training micro-batch is one forward
        return batched_completion_logprobs(model or self.policy, data["input_ids"], data["attention_mask"], T,
                                           temperature, with_entropy, self.micro_batching, lockstep)  # fmt: skip

    def micro_batches(self, batch: dict[str, Tensor]) -> list[dict[str, Tensor]]:
        """``batch`` (padded rows) as length-sorted micro-batches, each cropped to its longest row."""
        packed = packs_sequences(self.policy, self.hparams.padding_free)
        rows = self.micro_batching.split(batch["attention_mask"], batch["response_mask"], packed)
        return [crop_padding({k: v[idx] for k, v in batch.items()}) for idx in rows]

    @torch.no_grad()
    def reference_logprobs(self, data: dict[str, Tensor]) -> Tensor:
        """log π_ref ``(B, T)`` on the rollouts: the adapter-free base with LoRA, else the frozen copy."""
        if self.hparams.lora is not None:
            with self.policy.disable_adapter():
                return self.logprobs(data)[0]
        return self.logprobs(data, model=self._reference)[0]

    def across_ranks(self, value: float, op: str) -> float:
        """``value`` reduced over the training ranks (``"sum"`` or ``"max"``); ``value`` itself in one process."""
        if self._trainer is None or self.trainer.world_size == 1:
            return float(value)
        return float(self.trainer.strategy.reduce(torch.tensor(float(value), device=self.device), reduce_op=op))

    def lockstep(self, passes: int) -> int:
        """The number of forward passes every rank runs when this rank has ``passes``: the most any has."""
        return int(self.across_ranks(passes, "max"))

    def optimizer_step_on(self, mini: dict[str, Tensor] | None, anchor: dict[str, Tensor] | None,
                          filler: dict[str, Tensor] | None = None) -> dict[str, Tensor]:  # fmt: skip
        """One optimizer step: accumulate micro-batch gradients of L_exp (+ η L_pef) (+ β KL).

        Under data parallelism the ranks' gradients are averaged, so each micro-batch is weighted by
        its normaliser over the ranks' mean one: the step is the global batch's, however unevenly
        its tokens (or rows) fall on the ranks. Every rank runs as many forward/backward passes as
        the rank with the most micro-batches (DDP and FSDP2 communicate in each): the extra ones are
        on ``filler`` (one row of this step's rollouts) with weight 0. ``mini`` None: a step without
        rows of this rank's own (another rank has one more mini-batch).
        """
        hp = self.hparams
        optimizer = self.optimizers()
        optimizer.zero_grad()
        totals: Counter = Counter()
        parts = self.micro_batches(mini) if mini is not None else []
        anchors = self.micro_batches(anchor) if anchor is not None else []
        extra = self.lockstep(len(parts) + len(anchors)) - len(parts) - len(anchors)  # before any backward's collective
        world = self.trainer.world_size if self._trainer is not None else 1
        den = self.across_ranks(aggregation_normaliser(mini["response_mask"], hp.loss_agg) if mini is not None else 0.0, "sum") / world
        for part in parts:
            weight = aggregation_weight(part["response_mask"], den, hp.loss_agg)
            losses = self.rl_loss(part)
            self.manual_backward(losses["loss"] * weight)
            totals.update({k: float(v.detach()) * weight for k, v in losses.items()})
        if anchor is not None or hp.divergence_coef > 0:
            level = hp.divergence_level  # η multiplies the mean over the level's units, over every rank's anchors
            units = float(divergence_units(anchor["response_mask"], level).sum()) if anchor is not None else 0.0
            units = self.across_ranks(units, "sum") / world
            for part in anchors:
                weight = float(divergence_units(part["response_mask"], level).sum()) / units if units > 0 else 0.0
                pef = self.anchor_loss(part)
                self.manual_backward(hp.divergence_coef * pef * weight)
                totals["pef"] += float(pef.detach()) * weight
                totals["loss"] += hp.divergence_coef * float(pef.detach()) * weight
        for _ in range(extra):
            logprobs, _ = self.logprobs(filler)  # weight 0: only the passes' collectives
            self.manual_backward(logprobs.nan_to_num().sum() * 0.0)
        if hp.max_grad_norm is not None:
            self.clip_gradients(optimizer, gradient_clip_val=hp.max_grad_norm, gradient_clip_algorithm="norm")
        optimizer.step()
        optimizer.zero_grad()  # free the gradients now, not at the next step: the rollout in between needs no grads
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        totals.setdefault("loss", 0.0)
        return {k: torch.tensor(v) for k, v in totals.items()}

    def rl_loss(self, part: dict[str, Tensor]) -> dict[str, Tensor]:
        """L_exp (clipped surrogate, §1) + β·KL on one micro-batch; returns every component."""
        hp = self.hparams
        logprobs, _ = self.logprobs(part)
        loss, stats = policy_loss(
            logprobs,
            part["old_logprobs"],
            part["advantages"],
            part["response_mask"],
            clip_low=hp.clip_low,
            clip_high=hp.clip_high,
            dual_clip=hp.dual_clip,
            agg=hp.loss_agg,
            max_len=hp.max_new_tokens,
        )
        parts = {"policy": loss.detach(), **{k: torch.as_tensor(v).detach() for k, v in stats.items()}}
        if hp.kl_coef > 0:
            kl = aggregate(
                kl_estimate(logprobs, part["ref_logprobs"], hp.kl_estimator, value_cap=hp.kl_value_cap),
                part["response_mask"],
                hp.loss_agg,
                max_len=hp.max_new_tokens,
            )
            parts["kl"] = kl.detach()
            loss = loss + hp.kl_coef * kl
        parts["loss"] = loss
        return parts

    def anchor_loss(self, anchor: dict[str, Tensor]) -> Tensor:
        """L_pef: f-divergence to π_ref estimated on cached π_ref samples only (DPH-RL, §2)."""
        hp = self.hparams
        logprobs, _ = self.logprobs(anchor, temperature=1.0)
        return f_divergence(
            logprobs,
            anchor["ref_logprobs"],
            anchor["response_mask"],
            hp.divergence,
            level=hp.divergence_level,
            value_cap=hp.divergence_value_cap,
            **(hp.divergence_options or {}),
        )

    def log_step(self, data: dict[str, Tensor], rollouts, losses: list[dict[str, Tensor]], keep: Tensor) -> None:
        """Log every loss component and the rollout statistics of the step."""
        B = len(keep)
        mean = {k: torch.stack([p[k] for p in losses if k in p]).mean() for k in (losses[0] if losses else {})}
        self.log_dict({f"train/{k}": v for k, v in mean.items() if k != "loss"}, batch_size=B)
        if "loss" in mean:
            self.log("train/loss", mean["loss"], prog_bar=True, batch_size=B)
        rewards = data["rewards"]
        lengths = torch.tensor([len(c) for c in rollouts.completion_ids], dtype=torch.float32)
        shown = {  # on the progress bar
            "train/reward": rewards.mean() if len(rewards) else torch.zeros(()),
            "train/response_length": lengths.mean(),
        }
        self.log_dict(shown, prog_bar=True, batch_size=B)
        stats = {
            "train/nonfinite_old_logprobs": nonfinite_count(data["old_logprobs"], data["response_mask"]).float(),
            "train/kept_rows": keep.float().mean(),
            "train/truncated": torch.tensor([r == "length" for r in rollouts.finish_reasons]).float().mean(),
        }
        if "entropies" in data and len(data["entropies"]):  # computed for the step already: logging is free
            stats["train/entropy"] = data["entropies"].mean()
        self.log_dict(stats, batch_size=B)

    # ------------------------------------------------------------------ validation
    @override
    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> dict:
        """n samples per prompt → rewards and answers → the set's :class:`ValidationPanel`.

        Returns the batch's per-prompt correct counts (``{"set", "ids", "num_correct"}``) for
        callbacks such as :class:`~lit_rlvr.callbacks.PassCountsWriter`.
        """
        rollouts = _require_rollouts(batch)
        name, n = batch["set_name"], batch["n_samples"]
        if name not in self.val_panels:
            self.val_panels[name] = ValidationPanel(n, self.hparams.pass_k).to(self.device)
        # padding prompts only keep the ranks in step (EvalShardSampler): generated, never counted
        real = [p for p, pad in enumerate(batch.get("padding") or [False] * len(batch["rows"])) if not pad]
        prompts = [batch["rows"][p] for p in real]
        texts = [rollouts.texts[p * n : (p + 1) * n] for p in real]  # (P, n)
        results = self.score([t for group in texts for t in group], [row for row in prompts for _ in range(n)],
                             prefix=f"val/{name}", with_answers=True)  # fmt: skip
        rewards = _rewards(results)  # (P·n,)
        correct = (rewards > 0.5).view(-1, n)  # (P, n)
        ids = [row["id"] for row in prompts]
        self.val_panels[name].update(
            correct,
            answers=[[r.answer for r in results[p * n : (p + 1) * n]] for p in range(len(prompts))],
            texts=texts,
            rewards=rewards,
            base_solved=self._base_solved(name, ids),
        )
        if batch_idx + 1 == self._num_val_batches(dataloader_idx):
            self.log_panel(name)  # logged inside its dataloader: listed under it, not under every set
        return {"set": name, "ids": ids, "num_correct": correct.sum(-1).tolist()}

    def _num_val_batches(self, dataloader_idx: int) -> int | float:
        """Batches this validation runs on dataloader ``dataloader_idx`` (inf for a loader without a length)."""
        trainer = self.trainer
        return (trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches)[dataloader_idx]

    def _base_solved(self, set_name: str, ids: list[str]) -> Tensor | None:
        """``(P,)`` bool: prompts the base policy solved (None when no base counts are known)."""
        if self.reference_pass_counts is not None:
            counts = self.reference_pass_counts.get(set_name, {})
        else:
            counts = getattr(getattr(self.trainer, "datamodule", None), "base_pass_counts", None)
        if not counts:
            return None
        return torch.tensor([counts.get(i, 0) > 0 for i in ids], dtype=torch.bool)

    def log_panel(self, name: str) -> None:
        """Log set ``name``'s panel as ``val/<name>/<metric>`` and reset it (nothing if it has no update).

        Called at the last batch of the set's dataloader, Lightning files the values under that
        dataloader (``trainer.validate`` returns them in that dataloader's dict); logged at
        epoch end they would be listed under every dataloader.
        """
        panel = self.val_panels[name]
        values = {f"val/{name}/{k}": v for k, v in panel.compute().items()}  # synced across ranks by the sum states
        # one value per epoch (its batch weight is moot); the set's name is in the key
        self.log_dict(values, sync_dist=False, batch_size=1, add_dataloader_idx=False)
        panel.reset()

    @override
    def on_validation_epoch_end(self) -> None:
        for name in self.val_panels:  # sets whose dataloader has no length: their last batch was not known
            self.log_panel(name)

    # ------------------------------------------------------------------ checkpoints
    @override
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["lit_rlvr_rng"] = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "generator": self.generator.get_state(),
        }

    @override
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        rng = checkpoint.get("lit_rlvr_rng")
        if rng is not None:
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            self.generator.set_state(rng["generator"])


def _require_rollouts(batch: dict):
    if "rollouts" not in batch:
        raise RuntimeError(
            "batch has no 'rollouts': add a lit_rlvr.callbacks.RolloutCallback to the Trainer's callbacks "
            "(the CLI adds one by default)"
        )
    return batch["rollouts"]


def _read_json(path: str | None, key: str):
    """The parsed JSON file at ``path`` (None for None), with an error naming the config key."""
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{key}: cannot read {path!r} as JSON ({err})") from err


def _rewards(results) -> Tensor:
    """``(B,)`` float32 rewards of the scorer's results."""
    return torch.tensor([r.reward for r in results], dtype=torch.float32)


def _check_divergence(name: str, options: dict, level: str, value_cap: float | None) -> None:
    """Check the generator's name, then evaluate it once on a 1×1 batch so that an option it does
    not take, or a value it refuses (``alpha`` outside (0, 1)), fails at start-up."""
    DIVERGENCES.get_checked(name, "model.divergence")
    try:
        f_divergence(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), name, level=level, value_cap=value_cap, **options)
    except ValueError as err:
        raise ValueError(f"model.divergence_options: {err}") from err


def _declares(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters
