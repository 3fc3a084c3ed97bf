"""RLVRModule: the RLVR recipe as a LightningModule (docs/methods.md).

One training step, as :meth:`RLVRModule.training_step` reads:

    rollouts (RolloutCallback) → rewards → StepData → π_θ before the step, where a piece needs it
    → advantages (ADVANTAGES[name]) → rows to train (dynamic sampling) → token selections (§8)
    → for each PPO epoch and mini-batch, one optimizer step over micro-batches of
    policy loss (POLICY_LOSSES[name], §1, §8) − c · entropy bonus (§8.3)
    + η · f-divergence on cached π_ref anchors (DPH-RL, §2) + β · online KL to π_ref (§1.6)

Every method of both papers is this module with other option groups (:mod:`lit_rlvr.options`).
Optimisation is manual: one rollout batch feeds ``ppo_epochs`` × mini-batches optimizer steps,
each accumulated over micro-batches weighted so that accumulation, also across data-parallel
ranks, does not change the update (§5; :class:`~lit_rlvr.lockstep.Lockstep`). What is not the
recipe lives beside it: rollouts in :class:`~lit_rlvr.callbacks.RolloutCallback`, the start-up
checks in :mod:`lit_rlvr.contracts`, the forwards in :class:`~lit_rlvr.policy.PolicyForwards`, the
step's logs in :mod:`lit_rlvr.metrics.step`, the validation metrics in :class:`~lit_rlvr.metrics.ValidationPanels`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from lightning import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lit_rlvr.checkpoint import load_training_state, save_training_state
from lit_rlvr.contracts import (
    AnchorBatch,
    Rollouts,
    StepData,
    TrainBatch,
    ValBatch,
    check_prompt_data,
    check_trainer,
    require_rollouts,
)
from lit_rlvr.functional.advantages import ADVANTAGES, valid_row_advantages
from lit_rlvr.functional.batching import split_indices
from lit_rlvr.functional.entropy import entropy_bonus
from lit_rlvr.functional.losses import masked_row_mean, token_mean
from lit_rlvr.lockstep import Lockstep
from lit_rlvr.metrics.panel import ValidationPanels, is_last_val_batch
from lit_rlvr.metrics.step import log_step
from lit_rlvr.options import (
    DEFAULT_SAMPLING,
    AnchorOptions,
    BatchingOptions,
    DynamicSampling,
    EntropyOptions,
    EnvironmentOptions,
    EvalOptions,
    KLOptions,
    LossOptions,
    PolicyOptions,
    RolloutCorrection,
    SamplingParams,
    ScoringOptions,
    completion_budget,
    default_optimizer,
    group_outcomes,
    module_groups,
    optimizers,
    plain,
)
from lit_rlvr.policy import PolicyForwards, ReferencePolicy, load_policy, shard_fsdp2
from lit_rlvr.rewards.combine import MixedScore
from lit_rlvr.rewards.conventions import TrainerState
from lit_rlvr.rewards.report import EnvironmentReport
from lit_rlvr.upgrade import CHECKPOINT_FORMAT, upgrade_checkpoint, upgraded_checkpoint


class RLVRModule(LightningModule):
    """A policy trained with verifiable rewards; the method is chosen by its option groups.

    Each option group below is a class of :mod:`lit_rlvr.options` (None = off), which says what it sets;
    docs/configuration.md lists every key. ``sampling``'s
    ``temperature`` is also the trainer's log-probs' (DPH-RL's anchor term uses 1.0, its cached π_ref's).

    Args:
        recompute_old_logprobs: use the trainer's log-probs at rollout time as π_old instead of
            the sampler's.
        max_grad_norm: gradient clipping (None = off).
        optimizer: optimizer factory (LightningCLI dependency injection).
        lr_scheduler: optional scheduler factory, stepped once per optimizer step.
        seed: seeds the module's own generator (bootstrap advantages, mini-batch shuffling).

    A group may also be given as a mapping of its fields: the hyper-parameters are stored as plain
    data (:func:`~lit_rlvr.options.plain`), which loggers write and ``load_from_checkpoint`` reads back.
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
        environment: EnvironmentOptions | None = None,
        recompute_old_logprobs: bool = False,
        max_grad_norm: float | None = 1.0,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        seed: int = 0,
    ):
        super().__init__()
        groups = module_groups(locals())  # each as its group, also when given as a mapping (a checkpoint's)
        flags = {"recompute_old_logprobs": recompute_old_logprobs, "max_grad_norm": max_grad_norm, "seed": seed}
        self.save_hyperparameters({**{k: plain(v) for k, v in groups.items()}, **flags})
        self.automatic_optimization = False
        for key, group in groups.items():  # self.sampling, self.loss, self.anchor, …
            if key != "policy":  # self.policy is the model
                setattr(self, key, group)
        self.val_sampling = self.evaluation.sampling(self.sampling)
        self.completion_tokens = completion_budget(self.sampling, self.environment)  # Dr. GRPO's normaliser
        completion_budget(self.val_sampling, self.environment, "model.evaluation.max_new_tokens")  # checked alike
        self.entropy_state = self.entropy.initial_state() if self.entropy is not None else None  # saved in checkpoints
        self._unstepped: list[Counter] = []  # the groups of each batch since the last optimizer step
        self.reward_mix = self.scoring.mix()  # the rewards, their weights and the correctness term
        self.set_advantage(self.loss.advantage, self.loss.advantage_options)  # checked against G and the rewards
        self.configured_loss = self.loss  # self.loss may be switched by an AdvantageSchedule
        self.micro_batching = self.batching.micro_batching
        self.policy, self.tokenizer = load_policy(groups["policy"])
        self.reference = ReferencePolicy(self.policy, online=self.kl is not None)
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.generator = torch.Generator().manual_seed(seed)
        self.lockstep = Lockstep()  # the data-parallel ranks, set at setup for the Trainer's
        self.forwards = PolicyForwards(self.policy, self.micro_batching, self.sampling.temperature, self.lockstep)
        self.reward_report = self.scoring.report(self.reward_mix)
        self.environment_report = EnvironmentReport(self.scoring.max_failed_steps)  # multi-turn: why environments fail
        self.scorer = None
        evaluation, max_turns = self.evaluation, self.environment and self.environment.turns.max_turns
        self.val_panels = ValidationPanels(evaluation.pass_k, max_turns, evaluation.reference_pass_counts())  # by set

    # ------------------------------------------------------------------ configuration
    def set_advantage(self, name: str, options: dict[str, Any] | None = None, loss: LossOptions | None = None) -> None:
        """Switch the advantage estimator, checked against the group size and the rewards (at start-up, and by
        :class:`AdvantageSchedule`)."""
        loss = (loss or self.loss).with_advantage(name, options, group_size=self.sampling.n)
        if ADVANTAGES.trait(name, "binary_rewards", default=False):  # rewards known to be non-binary: refused now
            self.reward_mix.require_binary(f"model.loss.advantage={name!r}")
        self.loss = loss

    @property
    def advantage_name(self) -> str:
        return self.loss.advantage

    @property
    def advantage_options(self) -> dict[str, Any]:
        return self.loss.advantage_options

    # ------------------------------------------------------------------ Lightning hooks
    @override
    def configure_model(self) -> None:
        """FSDP2 (``ModelParallelStrategy``): shard every decoder layer, then the whole policy."""
        shard_fsdp2(self.policy, getattr(self, "device_mesh", None) if self._trainer is not None else None)

    @override
    def configure_callbacks(self) -> list:
        """No callbacks of the module's own; refuses Lightning's gradient clipping first (this hook runs
        before Lightning checks the Trainer: :func:`~lit_rlvr.contracts.check_trainer`)."""
        check_trainer(self.trainer)
        return []

    @override
    def configure_optimizers(self):
        return optimizers(self.policy.parameters(), self.optimizer_factory, self.lr_scheduler_factory)

    @override
    def setup(self, stage: str) -> None:
        self.lockstep = self.forwards.ranks = Lockstep(self.trainer)
        if self.scorer is None:
            self.scorer = self.scoring.scorer()
        datamodule = self.trainer.datamodule  # None: plain dataloaders, nothing to check here
        if datamodule is not None:
            pi_ref = self.reference if stage == "fit" else None  # training: the reference cache must be π_ref's
            check_prompt_data(
                datamodule, self.tokenizer, self.reward_mix, self.advantage_name, self.environment, pi_ref, self.anchor
            )
            for name, n in datamodule.val_samples_per_prompt.items():
                self.val_panels.panel(name, n)
        if stage == "fit":
            self.reference.setup()  # before a checkpoint is restored: π_ref is the initial policy

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
        """Rollouts → rewards → advantages → token selections → optimizer steps on L_exp (+ η L_pef) (docs/methods.md §5)."""
        rollouts = require_rollouts(batch)
        if rollouts.episodes is not None:  # every rank alike: the check sums over the ranks
            where = f"train environments (step {self.global_step}, rank {self.global_rank})"
            self.environment_report(rollouts.episodes, where, self.lockstep.reduce_tensor)
        scores = self.score_rollouts(rollouts, batch.rows, "train")
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)  # (B,) Σ_k w_k r_k
        data = StepData.from_rollouts(rollouts, self.tokenizer.pad_token_id, rewards).to(self.device)
        data = self.start_of_step(data)
        data.advantages = self.advantages(data)
        keep = self.rows_to_train(data)
        if self.kl is not None:  # log π_ref on the rollouts (:class:`~lit_rlvr.policy.ReferencePolicy`)
            with self.reference.active() as reference:
                data.ref_logprobs = self.forwards.logprobs(data, model=reference)[0]
        anchor = self.anchor_batch(batch)
        filler = data.select(slice(0, 1))  # a row for the passes that keep ranks in step
        unfiltered = (data.rewards, data.group_ids)  # what dynamic sampling saw
        data = self.token_selections(data.select(keep))
        # every rank takes the same number of optimizer steps (the most any rank has; none if no rank
        # has a row to learn from): a rank with fewer steps takes steps without rows of its own
        steps = self.lockstep.optimizer_steps(len(data), self.batching.mini_batch_size)
        self.check_progress(steps, *unfiltered)
        losses = []
        for _ in range(self.batching.ppo_epochs if steps else 0):
            minis = split_indices(len(data), self.batching.mini_batch_size, self.generator) if len(data) else []
            for i in range(steps):
                losses.append(self.optimizer_step_on(data.select(minis[i]) if i < len(minis) else None, anchor, filler))
        log_step(self, data, keep, losses, rollouts, self.environment and self.environment.turns.max_turns)
        if self.entropy is not None and losses:  # every rank has the same optimizer steps: the reduction is in step
            self.log("train/entropy_coef", self.entropy_state.applied, batch_size=1)  # this step's, then moved (§8.3)
            self.entropy_state = self.entropy.state_after(self.entropy_state, losses, self.lockstep)
        return torch.stack([parts["loss"] for parts in losses]).mean() if losses else torch.zeros(())

    def start_of_step(self, data: StepData) -> StepData:
        """π_θ's log-probs and entropies before the step, where a piece needs them: the trainer's π_old
        (``recompute_old_logprobs``, the rollout correction and its importance weights), an advantage
        that reads entropies, a token selection."""
        trainer_old = self.hparams.recompute_old_logprobs or self.rollout_correction is not None
        if not (trainer_old or ADVANTAGES.declares(self.advantage_name, "entropies") or self.loss.selects_tokens):
            return data
        old, entropy = self.forwards.logprobs(data, with_entropy=True)
        data.token_logprobs, data.token_entropy = old, entropy
        if self.rollout_correction is not None:  # π_old is the trainer's; the sampler's tokens are re-weighted
            data.is_weights, stats = self.rollout_correction.weights(old, data.old_logprobs, data.loss_tokens)
            self.log_dict({f"train/{k}": v for k, v in stats.items()}, batch_size=len(old))
        if trainer_old:
            data.old_logprobs = old
        data.entropies = masked_row_mean(entropy, data.loss_tokens)
        return data

    def score_rollouts(
        self, rollouts: Rollouts, prompts: list[dict], prefix: str, with_answers: bool = False
    ) -> list[MixedScore]:
        """P·n scores, prompt-major, of each trajectory's final turn by :attr:`reward_mix` in the reward workers
        (with the correctness term's answers for validation), logged under ``prefix`` (:class:`RewardReport`)."""
        state = TrainerState.of(self._trainer)
        scores, rows = self.reward_mix.score_rollouts(self.scorer, rollouts, prompts, state, with_answers)
        self.reward_report(self, scores, rows, prefix, self.lockstep.reduce_tensor)
        return scores

    def advantages(self, data: StepData) -> Tensor:
        """``(B,)`` advantages from the configured estimator (options + injected tensors); rows whose
        environment failed are left out of their group's statistics and get 0
        (:func:`~lit_rlvr.functional.advantages.valid_row_advantages`)."""
        name, options, rows = self.advantage_name, dict(self.advantage_options), {}
        if ADVANTAGES.declares(name, "entropies"):
            rows["entropies"] = data.need("entropies")
        if ADVANTAGES.declares(name, "generator"):
            options["generator"] = self.generator
        if ADVANTAGES.declares(name, "mean_logprobs"):  # each row's mean token log π_old; NaN (no usable mass) as -inf
            old = torch.nan_to_num(data.old_logprobs, nan=float("-inf"))
            rows["mean_logprobs"] = masked_row_mean(old, data.loss_tokens).cpu()
        rewards, groups = data.rewards.cpu(), data.group_ids.cpu()
        valid = None if data.valid is None else data.valid.cpu()
        advantages = valid_row_advantages(ADVANTAGES[name], rewards, groups, valid, row_options=rows, **options)
        return advantages.to(self.device)

    def token_selections(self, data: StepData) -> StepData:
        """``(B, T)`` selections of the trained rows' tokens, made once per rollout batch (§8).

        From π_θ's log-probs and entropies at the start of the step (``token_logprobs``,
        ``token_entropy``, dropped here): ``token_mask`` (float, the token mask's kept tokens) and
        ``selected`` (bool, the policy loss's covariance selection). They travel with the rows into
        mini- and micro-batches, so micro-batching does not change them.
        """
        loss, mask = self.loss, data.loss_tokens
        if loss.token_mask is not None:
            data.token_mask = loss.kept_tokens(data.need("token_entropy"), mask)
        if loss.entry.select is not None:
            adv = data.advantages
            adv = adv.unsqueeze(-1).expand_as(mask) if adv.dim() == 1 else adv
            old = torch.nan_to_num(data.old_logprobs, nan=float("-inf"))
            data.selected = loss.covariance_selection(
                data.need("token_logprobs"), old, adv, mask.bool(), self.generator
            )
        data.token_logprobs = data.token_entropy = None
        return data

    def rows_to_train(self, data: StepData) -> Tensor:
        """``(B,)`` bool: every row, or with dynamic sampling only groups with mixed rewards (DAPO)."""
        if self.dynamic_sampling is not None:
            return self.dynamic_sampling.rows_to_train(data.rewards, data.group_ids)
        return torch.ones_like(data.rewards, dtype=torch.bool)

    def check_progress(self, steps: int, rewards: Tensor, group_ids: Tensor) -> None:
        """Dynamic sampling: stop once ``max_batches_per_step`` batches in a row took no step
        (:meth:`DynamicSampling.check_progress <lit_rlvr.options.DynamicSampling.check_progress>`)."""
        if steps or self.dynamic_sampling is None:
            self._unstepped.clear()
            return
        self._unstepped.append(group_outcomes(rewards, group_ids))
        self.dynamic_sampling.check_progress(self._unstepped)

    def anchor_batch(self, batch: TrainBatch) -> AnchorBatch | None:
        """The step's DPH-RL anchor samples on this device (None without the anchor term)."""
        if self.anchor is None:
            return None
        if batch.anchor is None:
            rank_zero_warn("DPH-RL: this batch has no anchor samples (empty D_pef?); L_pef is skipped")
            return None
        return batch.anchor.to(self.device)

    def optimizer_step_on(
        self, mini: StepData | None, anchor: AnchorBatch | None, filler: StepData
    ) -> dict[str, Tensor]:
        """One optimizer step: accumulate micro-batch gradients of L_exp (+ η L_pef) (+ β KL).

        The micro-batch weights and the passes that keep data-parallel ranks in step come from
        :meth:`Lockstep.plan <lit_rlvr.lockstep.Lockstep.plan>`; the extra passes run on ``filler``
        (one row of this step's rollouts) with weight 0. ``mini`` None: a step without rows of
        this rank's own (another rank has one more mini-batch).
        """
        optimizer = self.optimizers()
        optimizer.zero_grad()
        totals: Counter = Counter()
        parts = mini.micro_batches(self.micro_batching, self.forwards.packs) if mini is not None else []
        anchors = anchor.micro_batches(self.micro_batching, self.forwards.packs) if anchor is not None else []
        plan = self.lockstep.plan(
            mini, parts, self.loss.aggregation, anchor, anchors, self.anchor.level if self.anchor else None
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
            logprobs, _ = self.forwards.forward_logprobs(filler.crop())  # weight 0: only the passes' collectives
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

    def rl_loss(self, part: StepData) -> dict[str, Tensor]:
        """L_exp (the policy loss, §1/§8) − c·entropy bonus + β·KL on one micro-batch; returns every component.

        The training forward's token entropies are logged every step (``entropy``, their token
        mean); they carry a gradient only for the bonus.
        """
        loss_options, max_len, mask = self.loss, self.completion_tokens, part.loss_tokens
        bonus = self.entropy_state is not None and self.entropy_state.applied != 0.0
        logprobs, entropy = self.forwards.forward_logprobs(part, with_entropy=True, entropy_grad=bonus)
        advantages, weights = part.need("advantages"), part.token_weights
        loss, stats = loss_options.objective(
            logprobs, part.old_logprobs, advantages, mask, max_len, weights, part.selected
        )
        parts = {"policy": loss.detach(), **{k: torch.as_tensor(v).detach() for k, v in stats.items()}}
        parts["entropy"] = token_mean(entropy.detach(), mask)
        if part.token_mask is not None:
            parts["token_mask_kept"] = token_mean(part.token_mask, mask)
        if bonus:
            loss = loss - self.entropy_state.applied * entropy_bonus(
                entropy, mask, loss_options.aggregation, max_len, part.token_mask
            )
        if self.kl is not None:
            kl = self.kl.penalty(logprobs, part.need("ref_logprobs"), mask, loss_options.aggregation, max_len)
            parts["kl"] = kl.detach()
            loss = loss + self.kl.coef * kl
        parts["loss"] = loss
        return parts

    def anchor_loss(self, anchor: AnchorBatch) -> Tensor:
        """L_pef: f-divergence to π_ref estimated on cached π_ref samples only (DPH-RL, §2)."""
        logprobs, _ = self.forwards.forward_logprobs(anchor, temperature=1.0)
        return self.anchor.divergence_loss(logprobs, anchor.ref_logprobs, anchor.loss_tokens)

    # ------------------------------------------------------------------ validation
    @override
    def validation_step(self, batch: ValBatch, batch_idx: int, dataloader_idx: int = 0) -> dict:
        """n samples per prompt → rewards and answers → the set's :class:`ValidationPanel`.

        Returns the batch's per-prompt correct counts (``{"set", "ids", "num_correct"}``) for
        callbacks such as :class:`~lit_rlvr.callbacks.PassCountsWriter`.
        """
        rollouts, name = require_rollouts(batch), batch.set_name
        prompts, rollouts = batch.counted(rollouts)  # the padding prompts only keep the ranks in step
        scores = self.score_rollouts(rollouts, prompts, f"val/{name}", with_answers=True)
        ids, base = [row["id"] for row in prompts], getattr(self.trainer.datamodule, "base_pass_counts", None)
        behaviour, tools = rollouts.behaviour(), rollouts.tool_sequences()
        correct = self.val_panels.add(
            name, batch.n_samples, ids, scores, rollouts.texts, base, behaviour, tools, self.device
        )
        if is_last_val_batch(self.trainer, batch_idx, dataloader_idx):
            self.val_panels.log(self, name)  # logged inside its dataloader: listed under it, not under every set
        return {"set": name, "ids": ids, "num_correct": correct.sum(-1).tolist()}

    @override
    def on_validation_epoch_end(self) -> None:
        for name in self.val_panels:  # sets whose dataloader has no length: their last batch was not known
            self.val_panels.log(self, name)

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    @override
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None, **kwargs):
        """Lightning's ``load_from_checkpoint`` on a checkpoint read safely and upgraded in memory from the
        0.1 layout (:func:`~lit_rlvr.upgrade.upgraded_checkpoint`; the file is not changed)."""
        stream = upgraded_checkpoint(checkpoint_path)
        return super().load_from_checkpoint(stream, map_location, hparams_file, strict, weights_only=True, **kwargs)

    @override
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["lit_rlvr_format"] = CHECKPOINT_FORMAT
        save_training_state(checkpoint, self.generator, self.entropy_state)

    @override
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore the RNG states and the entropy bonus's coefficient; a checkpoint of the 0.1 layout
        is upgraded in place first (:func:`lit_rlvr.upgrade.upgrade_checkpoint`: runs before the
        callbacks read their state)."""
        upgrade_checkpoint(checkpoint)
        self.entropy_state = load_training_state(checkpoint, self.generator, self.entropy_state)
