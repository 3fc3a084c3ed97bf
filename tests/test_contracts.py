"""The typed contracts between the pieces: batches, and what callbacks require of the module."""

from __future__ import annotations

import pytest


def test_the_module_provides_what_every_callback_requires(tiny_model_dir):
    from lit_rlvr.contracts import AdvantageHost, PolicyHost, RolloutHost
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions

    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=8, seed=3),
        scoring=ScoringOptions(workers=0),
    )
    for protocol in (PolicyHost, RolloutHost, AdvantageHost):
        assert isinstance(module, protocol), protocol.__name__
    assert module.val_sampling.n == 1 and module.val_sampling.seed == 3 and module.val_sampling.max_new_tokens == 8
    assert module.lockstep.most(5) == 5  # one process


def test_require_names_every_missing_member():
    from lit_rlvr.contracts import AdvantageHost, RolloutHost, require

    class Half:
        policy, tokenizer = object(), object()

    with pytest.raises(
        TypeError, match="RolloutHost: Half has no sampling, val_sampling, environment, micro_batching, lockstep"
    ):
        require(Half(), RolloutHost, "RolloutCallback")
    with pytest.raises(TypeError, match="AdvantageHost: Half has no advantage_name, advantage_options, set_advantage"):
        require(Half(), AdvantageHost, "AdvantageSchedule")


def test_the_module_refuses_a_batch_that_is_not_the_contracts(tiny_model_dir):
    from lit_rlvr.contracts import require_rollouts

    with pytest.raises(TypeError, match="RLVRModule takes lit_rlvr.contracts.TrainBatch / ValBatch batches"):
        require_rollouts({"rows": [], "prompt_ids": []})


def test_a_datamodule_whose_tokenizer_is_not_the_policys_is_refused(tiny_model_dir, tmp_path):
    from lit_rlvr.contracts import check_tokenizer
    from lit_rlvr.demo.tiny import build_char_tokenizer

    other = build_char_tokenizer("0123456789")
    policy_tok = build_char_tokenizer()

    class DM:
        tokenizer = other

    with pytest.raises(ValueError, match="data.tokenizer .* does not tokenize like the policy's"):
        check_tokenizer(DM().tokenizer, policy_tok)
    DM.tokenizer = build_char_tokenizer()
    check_tokenizer(DM().tokenizer, policy_tok)  # an equal tokenizer passes


# ------------------------------------------------------------------ the step's tensors


def step(B: int = 4, T: int = 3, Lp: int = 2):
    import torch

    from lit_rlvr.contracts import StepData

    mask = torch.ones(B, Lp + T, dtype=torch.long)
    return StepData(
        torch.arange(B * (Lp + T)).view(B, -1),
        mask,
        mask[:, Lp:].clone(),
        torch.zeros(B, T),
        torch.arange(B) // 2,
        torch.arange(B, dtype=torch.float32),
    )


def test_a_misspelled_or_missing_step_field_fails_loudly():
    import torch

    from lit_rlvr.contracts import StepData

    data = step()
    with pytest.raises(TypeError, match="unexpected keyword argument 'is_weight'"):
        StepData(**data.present(), is_weight=torch.ones(4, 3))
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'rewards'"):
        StepData(**{k: v for k, v in data.present().items() if k != "rewards"})
    with pytest.raises(AttributeError, match="is_weight"):
        data.is_weight = torch.ones(4, 3)  # a slots dataclass: no silent new attribute
    with pytest.raises(ValueError, match="StepData.ref_logprobs is not set for this step"):
        data.need("ref_logprobs")


def test_step_data_select_moves_every_field_with_its_rows_and_micro_batches_split_once():
    import torch

    from lit_rlvr.policy import MicroBatching

    data = step(B=5)
    data.advantages = torch.arange(5.0)
    data.token_mask = torch.rand(5, 3)
    picked = data.select(torch.tensor([4, 1]))
    assert picked.rewards.tolist() == [4.0, 1.0] and torch.equal(picked.token_mask, data.token_mask[[4, 1]])
    assert picked.ref_logprobs is None  # an absent field stays absent
    data.attention_mask[0, -1] = 0  # one row a token shorter: lengths (2, 2) then four (2, 3)
    data.response_mask[0, -1] = 0
    parts = data.micro_batches(MicroBatching(max_tokens=10), packed=False)
    assert [p.rewards.tolist() for p in parts] == [[1.0, 2.0], [3.0, 4.0], [0.0]]  # longest first, 2 x 5 tokens each
    assert parts[-1].response_mask.shape == (1, 2) and parts[-1].token_mask.shape == (1, 2)  # cropped to its row
    assert sorted(float(r) for p in parts for r in p.rewards) == data.rewards.tolist()
    assert data.loss_tokens is data.response_mask
    data.loss_mask = torch.tensor([[1, 0, 1]] * 5)
    assert data.loss_tokens.tolist()[0] == [1, 0, 0] and data.loss_tokens.tolist()[1] == [1, 0, 1]


def test_a_user_datamodule_missing_a_piece_fails_at_set_up_with_its_name(tiny_model_dir):
    import lightning as L
    from torch.utils.data import DataLoader

    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions

    class Prompts(L.LightningDataModule):  # tokenizer, rows and validation sets, but no cache attribute
        tokenizer = None
        base_pass_counts = None
        val_samples_per_prompt: dict = {}

        def all_rows(self):
            return []

        def train_dataloader(self):
            return DataLoader([])

    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=2, max_new_tokens=4),
        scoring=ScoringOptions(workers=0),
    )
    trainer = L.Trainer(
        max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    with pytest.raises(
        TypeError,
        match="RLVRModule needs the DataModule to provide PromptData: Prompts has no reference_cache, fit_context",
    ):
        trainer.fit(module, datamodule=Prompts())


def test_a_validation_batch_counts_its_prompts_but_not_its_padding():
    from lit_rlvr.contracts import ValBatch
    from lit_rlvr.rollout.types import Rollouts

    rows = [{"id": "a"}, {"id": "pad"}, {"id": "b"}]
    rollouts = Rollouts([[1], [2], [3]], [[4], [5], [6], [7], [8], [9]], [[0.0]] * 6, ["stop"] * 6, n=2)
    batch = ValBatch(rows, [[1], [2], [3]], [False, True, False], "set", 2, rollouts)
    prompts, counted = batch.counted(rollouts)
    assert prompts == [{"id": "a"}, {"id": "b"}]
    assert counted.completion_ids == [[4], [5], [8], [9]] and counted.prompt_ids == [[1], [3]]


def test_rows_an_environment_scores_need_no_reward_the_others_are_refused_naming_the_fix():
    """A skyrl-gym or lit_rlvr environment that scores its trajectories needs no ``reward`` in its rows (the
    docs' skyrl-gym example); single-turn, or in an environment that does not score, a row still needs one."""
    import lit_rlvr.demo  # noqa: F401  (the countdown environment, which scores its episodes)
    from lit_rlvr.contracts import StartupError, check_prompt_data
    from lit_rlvr.envs import ENVIRONMENTS, EnvironmentBase, register_environment
    from lit_rlvr.options import EnvironmentOptions
    from lit_rlvr.rewards import RewardMix

    class DM:
        tokenizer = reference_cache = base_pass_counts = None
        val_samples_per_prompt: dict = {}

        def __init__(self, rows):
            self.rows = rows

        def all_rows(self):
            return self.rows

        def fit_context(self, context, train_new_tokens, val_new_tokens, where):
            pass

    rows = [{"id": "c1", "prompt": "C375=026:", "answer": "26", "digits": "375"}]
    check_prompt_data(DM(rows), None, RewardMix(), "grpo", EnvironmentOptions("countdown"))
    with pytest.raises(ValueError, match=r"row 'c1' has no \['reward'\] .* run it in an environment that scores"):
        check_prompt_data(DM(rows), None, RewardMix(), "grpo")
    with pytest.raises(StartupError, match="row 'c1' has no 'environment' field and model.environment.name is null"):
        check_prompt_data(DM(rows), None, RewardMix(), "grpo", EnvironmentOptions(None))  # at start-up, exit 2
    register_environment("_test_unscored")(type("Unscored", (EnvironmentBase,), {}))
    try:
        with pytest.raises(ValueError, match=r"row 'c1' has no \['reward'\]"):
            check_prompt_data(DM(rows), None, RewardMix(), "grpo", EnvironmentOptions("_test_unscored"))
    finally:
        ENVIRONMENTS.pop("_test_unscored")
