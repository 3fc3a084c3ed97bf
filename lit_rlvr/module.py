"""RLVRModule: the RLVR recipe as a LightningModule.

One training step (docs/methods.md):

    rollouts (RolloutCallback) → rewards (BatchScorer) → advantages (ADVANTAGES[name])
    → token selections on π_θ's log-probs and entropies (forking tokens, Clip-Cov/KL-Cov, §8)
    → policy loss (POLICY_LOSSES[name], §1, §8) − c · entropy bonus (§8.3)
    + η · f-divergence on cached π_ref anchors (DPH-RL, §2) + β · online KL to π_ref (RKL baseline, §1)

Every method of both papers is this module with other option groups (:mod:`lit_rlvr.options`):
GRPO/DAPO/Dr.GRPO/RLOO pick an advantage and an aggregation (``loss``); DPH-RL sets ``anchor``
(η and the divergence) and gets anchor batches from the reference cache through the DataModule;
Pass@k Training picks a ``passk*`` advantage; RKL sets ``kl`` (β); the entropy and diversity
methods of §8 pick a policy loss (Clip-Cov, KL-Cov), a token mask (forking tokens), an entropy
bonus (``entropy``) or an advantage (NSR, W-REINFORCE, the unlikeliness reward).

Optimisation is manual, because one rollout batch feeds ``batching.ppo_epochs`` × mini-batches
optimizer steps, each accumulated over micro-batches whose losses are weighted so that
accumulation does not change the update, also across data-parallel ranks (docs/methods.md §5).
What is not the recipe lives elsewhere: the ranks' lock-step and the micro-batch weights in
:class:`~lit_rlvr.lockstep.Lockstep`, loading the policy in :mod:`lit_rlvr.policy.loading`, π_ref
in :class:`~lit_rlvr.policy.ReferencePolicy`, rollouts and weight sync in
:class:`~lit_rlvr.callbacks.RolloutCallback`, the validation metrics in
:class:`~lit_rlvr.metrics.ValidationPanel`, export and per-prompt pass counts in
:class:`~lit_rlvr.callbacks.HFExport` and :class:`~lit_rlvr.callbacks.PassCountsWriter`.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from lightning import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lit_rlvr.checkpoint import verify_checkpoint
from lit_rlvr.contracts import TrainBatch, ValBatch
from lit_rlvr.functional.advantages import ADVANTAGES
from lit_rlvr.functional.batching import crop_padding, split_indices
from lit_rlvr.functional.correction import correction_weights
from lit_rlvr.functional.divergences import f_divergence
from lit_rlvr.functional.entropy import ENTROPY_CONTROLS, TOKEN_MASKS, EntropyState, entropy_bonus, initial_state
from lit_rlvr.functional.losses import (
    POLICY_LOSSES,
    aggregate,
    kl_estimate,
    masked_row_mean,
    nonfinite_count,
    policy_loss,
    token_mean,
)
from lit_rlvr.functional.metrics import mixed_reward_rows
from lit_rlvr.lockstep import Lockstep
from lit_rlvr.metrics.panel import ValidationPanel
from lit_rlvr.options import (
    DEFAULT_SAMPLING,
    AnchorOptions,
    BatchingOptions,
    DynamicSampling,
    EntropyOptions,
    EvalOptions,
    KLOptions,
    LossOptions,
    PolicyOptions,
    RolloutCorrection,
    SamplingParams,
    ScoringOptions,
)
from lit_rlvr.policy import ReferencePolicy, batched_completion_logprobs, load_policy, packs_sequences, shard_fsdp2
from lit_rlvr.rewards.base import STATUSES
from lit_rlvr.rewards.combine import MixedScore
from lit_rlvr.rewards.conventions import TrainerState
from lit_rlvr.rewards.scorer import summarize
from lit_rlvr.upgrade import CHECKPOINT_FORMAT, upgrade_checkpoint


log = logging.getLogger(__name__)

_FUSED_ADAMW_DEVICES = ("cpu", "cuda", "xpu", "mps")  # where torch has a fused AdamW kernel


def default_optimizer(params) -> torch.optim.Optimizer:
    """AdamW at the papers' learning rate (1e-6; docs/methods.md §2–3), fused where torch has the kernel.

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
    """A policy trained with verifiable rewards; the method is chosen by its option groups.

    Args:
        policy: what to load (:class:`~lit_rlvr.options.PolicyOptions`: path, dtype, LoRA, …).
        sampling: the training rollouts (:class:`~lit_rlvr.options.SamplingParams`): ``n`` is the
            group size G, ``max_new_tokens`` the length cap (also Dr. GRPO's normaliser),
            ``temperature`` also that of the trainer's log-probs, so the ratio compares like with
            like (the DPH-RL anchor term always uses 1.0, the temperature of the stored π_ref
            log-probs), ``seed`` the rollouts' seed (offset per step and rank). The rollout
            callback reads it from here.
        loss: the policy loss (:class:`~lit_rlvr.options.LossOptions`).
        anchor: DPH-RL's anchor term (:class:`~lit_rlvr.options.AnchorOptions`; None = off).
        kl: the online KL penalty (:class:`~lit_rlvr.options.KLOptions`; None = off).
        entropy: the entropy bonus and its coefficient's control (:class:`~lit_rlvr.options.EntropyOptions`;
            None = off). The adaptive coefficient is state, saved in checkpoints.
        batching: optimizer steps and forward passes (:class:`~lit_rlvr.options.BatchingOptions`).
        scoring: the reward workers (:class:`~lit_rlvr.options.ScoringOptions`).
        evaluation: validation (:class:`~lit_rlvr.options.EvalOptions`).
        rollout_correction: importance weights between the sampler and the trainer's π_old
            (:class:`~lit_rlvr.options.RolloutCorrection`; None = off: π_old is the sampler's
            log-probs, unless ``recompute_old_logprobs``).
        dynamic_sampling: drop groups whose rewards are all equal (DAPO;
            :class:`~lit_rlvr.options.DynamicSampling`: ``true`` = its defaults, None/``false`` = off),
            stopping after ``max_batches_per_step`` batches in a row without an optimizer step.
        recompute_old_logprobs: use the trainer's log-probs at rollout time as π_old instead of
            the sampler's.
        max_grad_norm: gradient clipping (None = off).
        optimizer: optimizer factory (LightningCLI dependency injection).
        lr_scheduler: optional scheduler factory, stepped once per optimizer step.
        seed: seeds the module's own generator (bootstrap advantages, mini-batch shuffling).
    """

    def __init__(
        self,
        policy: PolicyOptions,
        sampling: SamplingParams = DEFAULT_SAMPLING,
        loss: LossOptions = LossOptions(),
        anchor: AnchorOptions | None = None,
        kl: KLOptions | None = None,
        entropy: EntropyOptions | None = None,
        batching: BatchingOptions = BatchingOptions(),
        scoring: ScoringOptions = ScoringOptions(),
        evaluation: EvalOptions = EvalOptions(),
        rollout_correction: RolloutCorrection | None = None,
        dynamic_sampling: DynamicSampling | bool | None = None,
        recompute_old_logprobs: bool = False,
        max_grad_norm: float | None = 1.0,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        seed: int = 0,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.automatic_optimization = False
        if sampling.temperature <= 0:
            raise ValueError(f"model.sampling.temperature must be > 0 (sampled rollouts), got {sampling.temperature}")
        self.sampling = sampling
        self.val_sampling = evaluation.sampling(sampling)
        self.anchor, self.kl, self.batching, self.scoring, self.evaluation = anchor, kl, batching, scoring, evaluation
        self.entropy = entropy
        self.entropy_state = initial_state(entropy.control, entropy.options) if entropy is not None else None
        self.rollout_correction = rollout_correction
        self.dynamic_sampling = DynamicSampling() if dynamic_sampling is True else dynamic_sampling or None
        self._batches_without_step: list[Counter] = []  # the groups of each batch since the last optimizer step
        self.set_advantage(loss.advantage, loss.advantage_options, loss)
        self.configured_loss = self.loss  # self.loss may be switched by an AdvantageSchedule
        self.micro_batching = batching.micro_batching
        self.policy, self.tokenizer = load_policy(policy)
        self.reference = ReferencePolicy(self.policy, online=kl is not None)
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.generator = torch.Generator().manual_seed(seed)
        self.reward_mix = scoring.mix()  # the rewards, their weights and the correctness term
        self.scorer = None
        self._warned_unscored = False
        self._warned_reward_error = False  # the first failed reward of a run is a warning
        self.val_panels = torch.nn.ModuleDict()  # one ValidationPanel per validation set
        self.reference_pass_counts = _read_json(evaluation.retention_reference, "model.evaluation.retention_reference")

    # ------------------------------------------------------------------ configuration
    def set_advantage(self, name: str, options: dict[str, Any] | None = None, loss: LossOptions | None = None) -> None:
        """Switch the advantage estimator, checked (at start-up, and by :class:`AdvantageSchedule`)."""
        loss = (loss or self.loss).with_advantage(name, options)
        k = loss.advantage_options.get("k")
        if k is not None and not 1 <= k <= self.sampling.n:
            raise ValueError(f"model.loss.advantage_options.k={k} must be between 1 and model.sampling.n={self.sampling.n}")
        need = ADVANTAGES.trait(name, "min_group_size", loss.advantage_options, default=1)
        if self.sampling.n < need:
            raise ValueError(
                f"model.sampling.n={self.sampling.n}: advantage {name!r} compares the samples of a prompt with each "
                f"other and needs model.sampling.n >= {need} (with fewer, every advantage is 0 and the policy never learns)"
            )
        self.loss = loss

    @property
    def advantage_name(self) -> str:
        return self.loss.advantage

    @property
    def advantage_options(self) -> dict[str, Any]:
        return self.loss.advantage_options

    @property
    def lockstep_ranks(self) -> Lockstep:
        """The data-parallel ranks this module trains on (:class:`~lit_rlvr.lockstep.Lockstep`)."""
        return Lockstep(self._trainer, self.device)

    def lockstep(self, passes: int) -> int:
        """The number of forward passes every rank runs when this rank has ``passes``: the most any has."""
        return self.lockstep_ranks.most(passes)

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
            self.scorer = self.scoring.scorer()
        datamodule = getattr(self.trainer, "datamodule", None)
        _check_tokenizer(datamodule, self.tokenizer)
        if hasattr(datamodule, "all_rows"):  # every row can be scored by these rewards, before any generation
            self.reward_mix.check_rows(datamodule.all_rows(), "data")
        for name, n in getattr(datamodule, "val_samples_per_prompt", {}).items():
            if name not in self.val_panels:
                self.val_panels[name] = ValidationPanel(n, self.evaluation.pass_k)
        if stage != "fit":
            return
        self.reference.setup()  # before a checkpoint is restored: π_ref is the initial policy
        cache = getattr(datamodule, "reference_cache", None)
        if cache is not None:
            self.reference.check_cache(cache)  # the anchors' log π_ref must be this policy's
        if self.anchor is not None and datamodule is not None and cache is None:
            raise ValueError("model.anchor (DPH-RL) needs data.cache: build it with `lit-rlvr cache` first")

    @override
    def teardown(self, stage: str) -> None:
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None

    @override
    def on_fit_start(self) -> None:
        self.reference.to(self.device)

    # ------------------------------------------------------------------ the recipe
    @override
    def training_step(self, batch: TrainBatch, batch_idx: int) -> Tensor:
        rollouts = _require_rollouts(batch)
        rows = [row for row in batch.rows for _ in range(rollouts.n)]  # (B,) prompt-major
        scores = self.score(rollouts.texts, rows, prefix="train", completion_ids=rollouts.completion_ids)
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)  # (B,) Σ_k w_k r_k
        data = {k: v.to(self.device) for k, v in rollouts.to_padded(self.tokenizer.pad_token_id).items()}
        data["rewards"] = rewards.to(self.device)
        trainer_old = self.hparams.recompute_old_logprobs or self.rollout_correction is not None
        if trainer_old or ADVANTAGES.declares(self.advantage_name, "entropies") or self.loss.selects_tokens:
            with torch.no_grad():  # π_θ at the start of the step
                old, entropy = self.logprobs(data, with_entropy=True)
            data["token_logprobs"], data["token_entropy"] = old, entropy
            if self.rollout_correction is not None:  # π_old is the trainer's; the sampler's tokens are re-weighted
                c = self.rollout_correction
                data["is_weights"], stats = correction_weights(old, data["old_logprobs"], data["response_mask"],
                                                               c.mode, c.clip_max, c.clip_min)  # fmt: skip
                self.log_dict({f"train/{k}": v for k, v in stats.items()}, batch_size=len(old))
            if trainer_old:
                data["old_logprobs"] = old
            data["entropies"] = masked_row_mean(entropy, data["response_mask"])
        data["advantages"] = self.advantages(data)
        keep = self.rows_to_train(data)
        if self.kl is not None:
            data["ref_logprobs"] = self.reference_logprobs(data)
        anchor = batch.anchor if self.anchor is not None else None
        if self.anchor is not None and anchor is None:
            rank_zero_warn("DPH-RL: this batch has no anchor samples (empty D_pef?); L_pef is skipped")
        if anchor is not None:
            anchor = {k: v.to(self.device) for k, v in anchor.tensors().items()}

        filler = {k: v[:1] for k, v in data.items()}  # a row for the passes that keep ranks in step
        groups = (data["rewards"], data["group_ids"])  # (B,) each, before the filter: what dynamic sampling saw
        data = {k: v[keep] for k, v in data.items()}
        data.update(self.token_selections(data))
        losses, kept = [], int(keep.sum())
        # every rank takes the same number of optimizer steps (the most any rank has; none if no rank
        # has a row to learn from): a rank with fewer steps takes steps without rows of its own
        steps = self.lockstep_ranks.optimizer_steps(kept, self.batching.mini_batch_size)
        self._bound_unstepped_batches(steps, *groups)
        for _ in range(self.batching.ppo_epochs if steps else 0):
            minis = split_indices(kept, self.batching.mini_batch_size, self.generator) if kept else []
            for i in range(steps):
                mini = {k: v[minis[i]] for k, v in data.items()} if i < len(minis) else None
                losses.append(self.optimizer_step_on(mini, anchor, filler))
        self.log_step(data, keep, losses)
        if self.entropy is not None and losses:  # every rank has the same optimizer steps: the reduction is in step
            self.update_entropy_control(losses)
        return torch.stack([parts["loss"] for parts in losses]).mean() if losses else torch.zeros(())

    def score(self, texts: list[str], rows: list[dict], prefix: str, with_answers: bool = False,
              completion_ids: list[list[int]] | None = None) -> list[MixedScore]:  # fmt: skip
        """Every reward of :attr:`reward_mix` on every completion, in the reward workers (with the
        correctness term's canonical answers for validation).

        Logs each status's share over all the rewards' items, with several rewards each one's mean
        as ``<prefix>/reward/<name>``, and for training the number of failed rewards
        (``train/reward_errors``); a batch with failures is summarised in the log (items per
        status, the first reason verbatim): at INFO, as a warning the first time in a run and
        whenever at least a quarter of the batch failed (:class:`~lit_rlvr.rewards.scorer.ScoreSummary`).
        """
        scores = self.reward_mix.score(self.scorer, texts, rows, with_answers=with_answers, completion_ids=completion_ids,
                                       trainer_state=self._trainer_state()) if rows else []  # fmt: skip
        summary = summarize([r for s in scores for r in s.results])
        size = max(summary.total, 1)
        for status in STATUSES:  # every status, every batch: the same keys on every rank (synced means)
            self.log(f"{prefix}/reward_status/{status}", summary.counts[status] / size, batch_size=size,
                     add_dataloader_idx=False, sync_dist=True)  # the validation set's name is in the prefix
        if prefix == "train":
            self.log("train/reward_errors", float(summary.errors), batch_size=size, reduce_fx="sum", sync_dist=True)
        self._report_failures(summary, prefix)
        if self.reward_mix.terms:
            self.log_reward_terms(scores, rows, prefix)
        return scores

    def log_reward_terms(self, scores: list[MixedScore], rows: list[dict], prefix: str) -> None:
        """``<prefix>/reward/<name>``: each reward's mean over the completions it applies to, across
        ranks (TRL's ``rewards/<name>/mean``); a reward that applied to none is not logged."""
        names = self.reward_mix.names
        totals = torch.zeros(len(names), 2, dtype=torch.float64)  # (K, [sum, count])
        for s in scores:
            for k, part in enumerate(s.parts):
                if part is not None:
                    totals[k] += torch.tensor([part, 1.0], dtype=torch.float64)
        if self._trainer is not None and self.trainer.world_size > 1:
            totals = self.trainer.strategy.reduce(totals.to(self.device), reduce_op="sum").cpu()
        for k, name in enumerate(names):
            if totals[k, 1] > 0:
                self.log(f"{prefix}/reward/{name}", float(totals[k, 0] / totals[k, 1]), batch_size=int(totals[k, 1]),
                         add_dataloader_idx=False, sync_dist=False)  # fmt: skip
        unscored = next((i for i, s in enumerate(scores) if all(p is None for p in s.parts)), None)
        if unscored is not None and not self._warned_unscored:  # TRL warns too; once is enough
            self._warned_unscored = True
            rank_zero_warn(f"every reward of {names} returned None for a completion of row {rows[unscored].get('id')!r}, "
                           "so it scores 0; check that some reward judges every row")

    def _trainer_state(self) -> TrainerState:
        """Progress as TRL reward functions read it (``trainer_state.global_step``, ...)."""
        if self._trainer is None:
            return TrainerState()
        return TrainerState(self.trainer.global_step, self.trainer.current_epoch, self.trainer.max_steps)

    def _report_failures(self, summary, prefix: str) -> None:
        if summary.first_reason is None:
            return
        where = f"{prefix} rewards (step {self.global_step}, rank {self.global_rank})"
        log.info("%s: %s", where, summary)
        if summary.loud:
            log.warning("%s: %d of %d rewards failed (status error), each scored 0: %s", where, summary.errors, summary.total, summary)
        elif summary.errors and not self._warned_reward_error:
            counted = "; train/reward_errors counts them" if prefix == "train" else ""
            log.warning("%s: a reward failed (status error, scored 0%s): %s", where, counted, summary)
        self._warned_reward_error = self._warned_reward_error or summary.errors > 0

    def advantages(self, data: dict[str, Tensor]) -> Tensor:
        """``(B,)`` advantages from the configured estimator (options + injected tensors)."""
        name, options = self.advantage_name, dict(self.advantage_options)
        if ADVANTAGES.declares(name, "entropies"):
            options["entropies"] = data["entropies"]
        if ADVANTAGES.declares(name, "generator"):
            options["generator"] = self.generator
        if ADVANTAGES.declares(name, "mean_logprobs"):  # each row's mean token log π_old; NaN (no usable mass) as -inf
            old = torch.nan_to_num(data["old_logprobs"], nan=float("-inf"))
            options["mean_logprobs"] = masked_row_mean(old, data["response_mask"]).cpu()
        return ADVANTAGES[name](data["rewards"].cpu(), data["group_ids"].cpu(), **options).to(self.device)

    def token_selections(self, data: dict[str, Tensor]) -> dict[str, Tensor]:
        """``(B, T)`` selections of the trained rows' tokens, made once per rollout batch (§8).

        From π_θ's log-probs and entropies at the start of the step (``token_logprobs``,
        ``token_entropy``, popped here): ``token_mask`` (float, the token mask's kept tokens) and
        ``selected`` (bool, the policy loss's covariance selection). They travel with the rows into
        mini- and micro-batches, so micro-batching does not change them.
        """
        stats = {k: data.pop(k) for k in ("token_logprobs", "token_entropy") if k in data}
        out, loss = {}, self.loss
        if loss.token_mask is not None:
            mask = TOKEN_MASKS[loss.token_mask](stats["token_entropy"], data["response_mask"], **loss.token_mask_options)
            out["token_mask"] = mask.float()
        entry = POLICY_LOSSES[loss.policy_loss]
        if entry.select is not None:
            adv = data["advantages"]
            adv = adv.unsqueeze(-1).expand_as(data["response_mask"]) if adv.dim() == 1 else adv
            old = torch.nan_to_num(data["old_logprobs"], nan=float("-inf"))
            out["selected"] = entry.choose(stats["token_logprobs"], old, adv, data["response_mask"].bool(), clip_low=loss.clip_low,
                                           clip_high=loss.clip_high, dual_clip=loss.dual_clip, generator=self.generator,
                                           **loss.policy_loss_options)  # fmt: skip
        return out

    def rows_to_train(self, data: dict[str, Tensor]) -> Tensor:
        """``(B,)`` bool: every row, or with dynamic sampling only groups with mixed rewards (DAPO)."""
        if self.dynamic_sampling is not None:
            return mixed_reward_rows(data["rewards"], data["group_ids"])
        return torch.ones_like(data["rewards"], dtype=torch.bool)

    def _bound_unstepped_batches(self, steps: int, rewards: Tensor, group_ids: Tensor) -> None:
        """Raise once dynamic sampling has drawn ``max_batches_per_step`` batches in a row without a step.

        ``steps`` is the same on every rank (:meth:`Lockstep.optimizer_steps`), so every rank
        raises at the same batch; the message counts this rank's groups.
        """
        if steps or self.dynamic_sampling is None:
            self._batches_without_step.clear()
            return
        self._batches_without_step.append(_group_outcomes(rewards, group_ids))
        limit = self.dynamic_sampling.max_batches_per_step
        if len(self._batches_without_step) < limit:
            return
        seen = Counter()
        for outcome in self._batches_without_step:
            seen.update(outcome)
        constant = ", ".join(f"{n} with every reward {key}" for key, n in sorted(seen.items()) if key != "groups")
        raise RuntimeError(
            f"dynamic sampling: 0 of {seen['groups']} groups had mixed rewards in the last {limit} batches on this "
            f"rank ({constant}), so no optimizer step was taken and trainer.max_steps cannot be reached. The task is "
            "too hard or too easy for the policy, or the reward fails (see train/reward_status/*); raise "
            "model.dynamic_sampling.max_batches_per_step to draw more batches per step"
        )

    def logprobs(self, data: dict[str, Tensor], with_entropy: bool = False, model=None, temperature: float | None = None,
                 entropy_grad: bool = False):  # fmt: skip
        """Per-token log-probs ``(B, T)`` (and entropies, differentiable with ``entropy_grad``) at the
        rollout temperature by default.

        In the module's micro-batches (:attr:`micro_batching`), so the no-grad passes over a whole
        rollout batch pad only within similar lengths; a training micro-batch is one forward.
        """
        T = data["response_mask"].shape[1]
        temperature = self.sampling.temperature if temperature is None else temperature
        lockstep = None if torch.is_grad_enabled() else self.lockstep  # a training micro-batch is one forward
        return batched_completion_logprobs(model or self.policy, data["input_ids"], data["attention_mask"], T,
                                           temperature, with_entropy, self.micro_batching, lockstep, entropy_grad)  # fmt: skip

    def micro_batches(self, batch: dict[str, Tensor]) -> list[dict[str, Tensor]]:
        """``batch`` (padded rows) as length-sorted micro-batches, each cropped to its longest row."""
        packed = packs_sequences(self.policy, self.micro_batching.padding_free)
        rows = self.micro_batching.split(batch["attention_mask"], batch["response_mask"], packed)
        return [crop_padding({k: v[idx] for k, v in batch.items()}) for idx in rows]

    @torch.no_grad()
    def reference_logprobs(self, data: dict[str, Tensor]) -> Tensor:
        """log π_ref ``(B, T)`` on the rollouts (:class:`~lit_rlvr.policy.ReferencePolicy`)."""
        with self.reference.active() as reference:
            return self.logprobs(data, model=reference)[0]

    def optimizer_step_on(self, mini: dict[str, Tensor] | None, anchor: dict[str, Tensor] | None,
                          filler: dict[str, Tensor] | None = None) -> dict[str, Tensor]:  # fmt: skip
        """One optimizer step: accumulate micro-batch gradients of L_exp (+ η L_pef) (+ β KL).

        The micro-batch weights and the passes that keep data-parallel ranks in step come from
        :meth:`Lockstep.plan <lit_rlvr.lockstep.Lockstep.plan>`; the extra passes run on ``filler``
        (one row of this step's rollouts) with weight 0. ``mini`` None: a step without rows of
        this rank's own (another rank has one more mini-batch).
        """
        optimizer = self.optimizers()
        optimizer.zero_grad()
        totals: Counter = Counter()
        parts = self.micro_batches(mini) if mini is not None else []
        anchors = self.micro_batches(anchor) if anchor is not None else []
        plan = self.lockstep_ranks.plan(
            mini["response_mask"] if mini is not None else None,
            [p["response_mask"] for p in parts],
            self.loss.aggregation,
            anchor["response_mask"] if anchor is not None else None,
            [a["response_mask"] for a in anchors],
            self.anchor.level if self.anchor is not None else None,
        )
        for part, weight in zip(parts, plan.loss_weights):
            losses = self.rl_loss(part)
            self.manual_backward(losses["loss"] * weight)
            totals.update({k: float(v.detach()) * weight for k, v in losses.items()})
        for part, weight in zip(anchors, plan.anchor_weights):
            pef = self.anchor_loss(part)
            self.manual_backward(self.anchor.coef * pef * weight)
            totals["pef"] += float(pef.detach()) * weight
            totals["loss"] += self.anchor.coef * float(pef.detach()) * weight
        for _ in range(plan.filler_passes):
            logprobs, _ = self.logprobs(filler)  # weight 0: only the passes' collectives
            self.manual_backward(logprobs.nan_to_num().sum() * 0.0)
        if self.hparams.max_grad_norm is not None:
            self.clip_gradients(optimizer, gradient_clip_val=self.hparams.max_grad_norm, gradient_clip_algorithm="norm")
        optimizer.step()
        optimizer.zero_grad()  # free the gradients now, not at the next step: the rollout in between needs no grads
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        totals.setdefault("loss", 0.0)
        return {k: torch.tensor(v) for k, v in totals.items()}

    def rl_loss(self, part: dict[str, Tensor]) -> dict[str, Tensor]:
        """L_exp (the policy loss, §1/§8) − c·entropy bonus + β·KL on one micro-batch; returns every component.

        The training forward's token entropies are logged every step (``entropy``, their token
        mean); they carry a gradient only for the bonus.
        """
        loss_options, max_len = self.loss, self.sampling.max_new_tokens
        bonus = self.entropy_state is not None and self.entropy_state.applied != 0.0
        logprobs, entropy = self.logprobs(part, with_entropy=True, entropy_grad=bonus)
        mask = part["response_mask"]
        weights = [part[k] for k in ("is_weights", "token_mask") if k in part]
        loss, stats = policy_loss(
            logprobs,
            part["old_logprobs"],
            part["advantages"],
            mask,
            clip_low=loss_options.clip_low,
            clip_high=loss_options.clip_high,
            dual_clip=loss_options.dual_clip,
            agg=loss_options.aggregation,
            max_len=max_len,
            token_weights=torch.stack(weights).prod(0) if weights else None,
            loss=loss_options.policy_loss,
            options=loss_options.policy_loss_options,
            selected=part.get("selected"),
        )
        parts = {"policy": loss.detach(), **{k: torch.as_tensor(v).detach() for k, v in stats.items()}}
        parts["entropy"] = token_mean(entropy.detach(), mask)
        if "token_mask" in part:
            parts["token_mask_kept"] = token_mean(part["token_mask"], mask)
        if bonus:
            loss = loss - self.entropy_state.applied * entropy_bonus(entropy, mask, loss_options.aggregation, max_len,
                                                                     part.get("token_mask"))  # fmt: skip
        if self.kl is not None:
            kl = aggregate(
                kl_estimate(logprobs, part["ref_logprobs"], self.kl.estimator, value_cap=self.kl.value_cap),
                part["response_mask"],
                loss_options.aggregation,
                max_len=max_len,
            )
            parts["kl"] = kl.detach()
            loss = loss + self.kl.coef * kl
        parts["loss"] = loss
        return parts

    def update_entropy_control(self, losses: list[dict[str, Tensor]]) -> None:
        """Log the entropy bonus's coefficient of this step, then move it with the step's entropy (§8.3).

        The step's entropy is the mean over its optimizer steps of the micro-batches' token-mean
        entropies weighted as the loss weights them (their shares of the ranks' mean normaliser:
        with ``token_mean``, the token mean over every process's tokens), summed over the ranks, so
        every rank gets the same coefficient.
        """
        ranks = self.lockstep_ranks
        entropy = ranks.reduce(sum(float(parts.get("entropy", 0.0)) for parts in losses) / len(losses), "sum") / ranks.world
        self.log("train/entropy_coef", self.entropy_state.applied, batch_size=1)
        update = ENTROPY_CONTROLS[self.entropy.control]
        self.entropy_state = update(self.entropy_state, entropy, **self.entropy.options)

    def anchor_loss(self, anchor: dict[str, Tensor]) -> Tensor:
        """L_pef: f-divergence to π_ref estimated on cached π_ref samples only (DPH-RL, §2)."""
        logprobs, _ = self.logprobs(anchor, temperature=1.0)
        return f_divergence(
            logprobs,
            anchor["ref_logprobs"],
            anchor["response_mask"],
            self.anchor.divergence,
            level=self.anchor.level,
            value_cap=self.anchor.value_cap,
            **self.anchor.options,
        )

    def log_step(self, data: dict[str, Tensor], keep: Tensor, losses: list[dict[str, Tensor]]) -> None:
        """Log every loss component of the step and what it trained on (the rollouts' own statistics
        are the rollout callback's: ``rollout/mean_len``, ``rollout/truncated``)."""
        B = len(keep)
        mean = {k: torch.stack([p[k] for p in losses if k in p]).mean() for k in (losses[0] if losses else {})}
        self.log_dict({f"train/{k}": v for k, v in mean.items() if k != "loss"}, batch_size=B)
        if "loss" in mean:
            self.log("train/loss", mean["loss"], prog_bar=True, batch_size=B)
        rewards = data["rewards"]
        self.log("train/reward", rewards.mean() if len(rewards) else torch.zeros(()), prog_bar=True, batch_size=B)
        stats = {
            "train/nonfinite_old_logprobs": nonfinite_count(data["old_logprobs"], data["response_mask"]).float(),
            "train/kept_rows": keep.float().mean(),
        }
        self.log_dict(stats, batch_size=B)

    # ------------------------------------------------------------------ validation
    @override
    def validation_step(self, batch: ValBatch, batch_idx: int, dataloader_idx: int = 0) -> dict:
        """n samples per prompt → rewards and answers → the set's :class:`ValidationPanel`.

        Returns the batch's per-prompt correct counts (``{"set", "ids", "num_correct"}``) for
        callbacks such as :class:`~lit_rlvr.callbacks.PassCountsWriter`.
        """
        rollouts = _require_rollouts(batch)
        name, n = batch.set_name, batch.n_samples
        if name not in self.val_panels:
            self.val_panels[name] = ValidationPanel(n, self.evaluation.pass_k).to(self.device)
        # padding prompts only keep the ranks in step (EvalShardSampler): generated, never counted
        real = [p for p, pad in enumerate(batch.padding) if not pad]
        prompts = [batch.rows[p] for p in real]
        texts = [rollouts.texts[p * n : (p + 1) * n] for p in real]  # (P, n)
        scores = self.score([t for group in texts for t in group], [row for row in prompts for _ in range(n)],
                            prefix=f"val/{name}", with_answers=True)  # fmt: skip
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)  # (P·n,)
        correct = (torch.tensor([s.correct for s in scores], dtype=torch.float32) > 0.5).view(-1, n)  # (P, n) by the correctness reward
        ids = [row["id"] for row in prompts]
        self.val_panels[name].update(
            correct,
            answers=[[s.answer for s in scores[p * n : (p + 1) * n]] for p in range(len(prompts))],
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
    @classmethod
    @override
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None, **kwargs):
        """Lightning's ``load_from_checkpoint``, also for a checkpoint of the 0.1 layout (upgraded in
        memory, :func:`lit_rlvr.upgrade.upgrade_checkpoint`; the file is not changed), after checking
        the sha256 a checkpoint carries (:func:`lit_rlvr.checkpoint.verify_checkpoint`)."""
        import io

        from lightning.fabric.utilities.cloud_io import _load

        if isinstance(checkpoint_path, (str, Path)) and Path(checkpoint_path).is_file():
            verify_checkpoint(checkpoint_path)
        checkpoint = _load(checkpoint_path, map_location="cpu", weights_only=False)
        if upgrade_checkpoint(checkpoint):
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            buffer.seek(0)
            checkpoint_path = buffer
        return super().load_from_checkpoint(checkpoint_path, map_location, hparams_file, strict, **kwargs)

    @override
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["lit_rlvr_format"] = CHECKPOINT_FORMAT
        checkpoint["lit_rlvr_rng"] = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "generator": self.generator.get_state(),
        }
        if self.entropy_state is not None:  # the adaptive coefficient moves with training: it resumes where it was
            checkpoint["lit_rlvr_entropy_control"] = {"coef": self.entropy_state.coef, "active": self.entropy_state.active}

    @override
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the RNG states and the entropy bonus's coefficient; a checkpoint of the 0.1 layout
        is upgraded in place first (:func:`lit_rlvr.upgrade.upgrade_checkpoint`: runs before the
        callbacks read their state)."""
        upgrade_checkpoint(checkpoint)
        control = checkpoint.get("lit_rlvr_entropy_control")
        if control is not None and self.entropy_state is not None:
            self.entropy_state = EntropyState(float(control["coef"]), bool(control["active"]))
        rng = checkpoint.get("lit_rlvr_rng")
        if rng is not None:
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            self.generator.set_state(rng["generator"])


def _require_rollouts(batch: TrainBatch | ValBatch):
    if not isinstance(batch, (TrainBatch, ValBatch)):
        raise TypeError(
            f"RLVRModule takes lit_rlvr.contracts.TrainBatch / ValBatch batches (PromptDataModule makes them), got "
            f"{type(batch).__name__}"
        )
    if batch.rollouts is None:
        raise RuntimeError(
            "batch has no rollouts: add a lit_rlvr.callbacks.RolloutCallback to the Trainer's callbacks "
            "(the CLI adds one by default)"
        )
    return batch.rollouts


def _check_tokenizer(datamodule, tokenizer) -> None:
    """The prompts must be token ids of the policy's own tokenizer: refuse a DataModule whose tokenizer differs."""
    theirs = getattr(datamodule, "tokenizer", None)
    if theirs is None or theirs is tokenizer:
        return
    probe = "Solve 12 + 7 = ? Answer: \\boxed{19}"
    if len(theirs) != len(tokenizer) or theirs(probe).input_ids != tokenizer(probe).input_ids:
        raise ValueError(
            f"data.tokenizer ({getattr(theirs, 'name_or_path', '?')!r}) does not tokenize like the policy's "
            f"({getattr(tokenizer, 'name_or_path', '?')!r}); give the DataModule the policy's path "
            "(the CLI links data.tokenizer to model.policy.path)"
        )


def _read_json(path: str | None, key: str):
    """The parsed JSON file at ``path`` (None for None), with an error naming the config key."""
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{key}: cannot read {path!r} as JSON ({err})") from err


def _group_outcomes(rewards: Tensor, group_ids: Tensor) -> Counter:
    """How many groups there are, and how many have each constant reward (``{"groups": 3, "0.0": 2, "1.0": 1}``)."""
    out = Counter(groups=len(torch.unique(group_ids)))
    for g in torch.unique(group_ids):
        values = rewards[group_ids == g]
        if bool((values == values[0]).all()):
            out[f"{float(values[0]):g}"] += 1
    return out
