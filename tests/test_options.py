"""The recipe's option groups (lit_rlvr/options.py): each checks itself naming the key, parses from
the command line and YAML as the module takes it, and round-trips through plain data and checkpoints."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from lit_rlvr.cli import main
from lit_rlvr.options import (
    AnchorOptions,
    BatchingOptions,
    DynamicSampling,
    EntropyOptions,
    EvalOptions,
    KLOptions,
    LoraOptions,
    LossOptions,
    PolicyOptions,
    RolloutCorrection,
    SamplingParams,
    ScoringOptions,
    as_group,
    group_outcomes,
    plain,
)
from lit_rlvr.policy.logprobs import MicroBatching
from tests.conftest import REPO_ROOT

BASE = REPO_ROOT / "configs" / "math" / "base.yaml"


@pytest.fixture
def model_options(print_config):
    """The parsed ``model.init_args`` of the math base config with ``args`` on top."""
    return lambda *args: print_config("fit", "--config", str(BASE), *args)["model"]["init_args"]


@pytest.mark.parametrize("given,parsed", [("auto", "auto"), ("true", True), ("false", False)])
def test_padding_free_and_token_budget_parse(given, parsed, model_options):
    model = model_options(f"--model.batching.padding_free={given}", "--model.batching.micro_batch_tokens=4096")
    assert model["batching"]["padding_free"] == parsed and model["batching"]["micro_batch_tokens"] == 4096


def test_defaults_are_auto_and_no_budget(model_options):
    model = model_options()
    assert model["batching"]["padding_free"] == "auto" and model["batching"]["micro_batch_tokens"] is None


def test_a_wrong_padding_free_value_names_the_key():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit):
        main(["fit", "--config", str(BASE), "--model.batching.padding_free=always", "--print_config"])
    assert "padding_free" in err.getvalue()


def test_dynamic_sampling_true_is_the_group_with_its_defaults(print_config):
    config = print_config(
        "fit",
        "--config",
        str(REPO_ROOT / "configs/demo/base.yaml"),
        "--config",
        str(REPO_ROOT / "configs/demo/dapo.yaml"),
    )
    assert config["model"]["init_args"]["dynamic_sampling"] is True
    assert DynamicSampling().max_batches_per_step == 10
    with pytest.raises(ValueError, match=r"model.dynamic_sampling.max_batches_per_step must be an integer > 0, got 0"):
        DynamicSampling(max_batches_per_step=0)


# ------------------------------------------------------------------------------ each group checks itself


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: LossOptions(clip_low=1.5), r"model.loss.clip_low must be in \[0, 1\], got 1.5"),
        (lambda: LossOptions(clip_high=-0.1), r"model.loss.clip_high must be a number >= 0, got -0.1"),
        (lambda: LossOptions(dual_clip=1.0), r"model.loss.dual_clip must be > 1 or null \(off\), got 1.0"),
        (
            lambda: LossOptions(token_mask_options={"top_entropy_quantile": 0.2}),
            r"without a model.loss.token_mask; set one of \['top_entropy'\]",
        ),
        (lambda: EntropyOptions(control="nope"), r"model.entropy.control: unknown entropy control 'nope'"),
        (lambda: AnchorOptions(coef=0.0), r"model.anchor.coef must be a number > 0, got 0.0"),
        (lambda: AnchorOptions(coef=0.5, level="word"), r"model.anchor.level: unknown divergence level 'word'"),
        (lambda: AnchorOptions(coef=0.5, value_cap=0), r"model.anchor.value_cap must be a number > 0 or null, got 0"),
        (lambda: KLOptions(coef=float("nan")), r"model.kl.coef must be a number > 0, got nan"),
        (lambda: KLOptions(coef=0.1, estimator="k9"), r"model.kl.estimator: unknown KL estimator 'k9'"),
        (lambda: RolloutCorrection(mode="nope"), r"model.rollout_correction.mode: unknown rollout correction mode"),
        (lambda: RolloutCorrection(clip_min=4.0, clip_max=3.0), r"clip_min \(4.0\) must be below clip_max \(3.0\)"),
        (lambda: BatchingOptions(ppo_epochs=True), r"model.batching.ppo_epochs must be an integer > 0, got True"),
        (
            lambda: BatchingOptions(mini_batch_size=2.5),
            r"model.batching.mini_batch_size must be an integer > 0 or null",
        ),
        (
            lambda: BatchingOptions(shared_prompts="yes"),
            r"model.batching.shared_prompts must be true or false, got 'yes'",
        ),
        (
            lambda: BatchingOptions(shared_prompts=True, padding_free=True),
            r"model.batching: shared_prompts: true runs the padded forward in two parts, padding_free: true packs it",
        ),
        (lambda: ScoringOptions(workers=-1), r"scoring.workers must be an integer >= 0, got -1"),
        (lambda: ScoringOptions(timeout_s=0), r"scoring.timeout_s must be a number > 0, got 0"),
        (lambda: ScoringOptions(max_failed_steps=0), r"scoring.max_failed_steps must be an integer > 0 or null"),
        (lambda: EvalOptions(pass_k=[1, 0]), r"model.evaluation.pass_k must be an integer > 0, got 0"),
        (lambda: EvalOptions(temperature=-1.0), r"temperature must be >= 0, got -1.0"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key_and_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_with_advantage_swaps_the_estimator_and_checks_it_against_the_group_size():
    loss = LossOptions(clip_high=0.3)
    options = {"k": 4}
    passk = loss.with_advantage("passk", options, group_size=8)
    assert (passk.advantage, passk.advantage_options, passk.clip_high) == ("passk", {"k": 4}, 0.3)
    options["k"] = 2
    assert passk.advantage_options == {"k": 4}  # a copy: the schedule's dict does not reach the group
    assert loss.advantage == "grpo"  # frozen: a new group, this one unchanged
    assert loss.with_advantage("passk", {"k": 8}).advantage_options == {"k": 8}  # no group size: not compared
    with pytest.raises(ValueError, match=r"model.loss.advantage_options.k=8 must be between 1 and model.sampling.n=4"):
        loss.with_advantage("passk", {"k": 8}, group_size=4)
    with pytest.raises(ValueError, match=r"model.sampling.n=1: advantage 'grpo' .* needs model.sampling.n >= 2"):
        loss.with_advantage("grpo", group_size=1)


def test_batching_gives_every_forward_its_row_cap_token_budget_and_packing():
    batching = BatchingOptions(micro_batch_size=4, micro_batch_tokens=512, padding_free=False)
    assert batching.micro_batching == MicroBatching(4, 512, False)
    assert BatchingOptions().micro_batching == MicroBatching(None, None, "auto")
    assert BatchingOptions(shared_prompts=True).micro_batching == MicroBatching(None, None, "auto", True)


def test_validation_sampling_overrides_only_what_it_sets():
    train = SamplingParams(n=8, temperature=0.7, top_p=0.9, max_new_tokens=32, seed=3)
    assert EvalOptions().sampling(train) == SamplingParams(n=1, temperature=0.7, top_p=0.9, max_new_tokens=32, seed=3)
    evaluation = EvalOptions(temperature=1.0, top_k=5, max_new_tokens=64)
    assert evaluation.sampling(train) == SamplingParams(
        n=1, temperature=1.0, top_p=0.9, top_k=5, max_new_tokens=64, seed=3
    )


# ------------------------------------------------------------------------------ dynamic sampling


def test_group_outcomes_count_the_groups_and_each_constant_reward():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert group_outcomes(rewards, groups) == {"groups": 4, "1": 1, "0": 1, "0.5": 1}
    assert DynamicSampling.rows_to_train(rewards, groups).tolist() == [False, False, True, True] + [False] * 4


def test_dynamic_sampling_stops_after_its_batches_without_a_step_saying_what_it_saw():
    dynamic = DynamicSampling(max_batches_per_step=2)
    one = group_outcomes(torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    dynamic.check_progress([one])  # one batch: draw another
    with pytest.raises(RuntimeError, match=r"0 of 4 groups had mixed rewards in the last 2 batches on this rank "):
        dynamic.check_progress([one, one])
    with pytest.raises(RuntimeError, match=r"\(2 with every reward 0, 2 with every reward 1\)"):
        dynamic.check_progress([one, one])


# ------------------------------------------------------------------------------ plain data and checkpoints


def test_as_group_reads_a_mapping_into_the_group_and_keeps_a_group_or_none():
    kl = KLOptions(coef=0.1)
    assert as_group(KLOptions, kl) is kl and as_group(KLOptions, None) is None
    assert as_group(KLOptions, {"coef": 0.2, "estimator": "k1"}) == KLOptions(coef=0.2, estimator="k1")
    policy = as_group(PolicyOptions, {"path": "model", "lora": {"r": 4}})
    assert policy.lora == LoraOptions(r=4)  # the nested group, read too
    assert as_group(SamplingParams, {"stop": ["</a>"]}).stop == ("</a>",)  # YAML's list, the group's tuple
    with pytest.raises(TypeError, match="KLOptions: expected KLOptions or a mapping of its fields, got list"):
        as_group(KLOptions, [0.1])
    with pytest.raises(ValueError, match="model.kl.coef must be a number > 0"):
        as_group(KLOptions, {"coef": -1})  # read through the group's own checks


def test_plain_data_round_trips_through_as_group():
    groups = [
        LossOptions(advantage="passk", advantage_options={"k": 4}, dual_clip=3.0),
        AnchorOptions(coef=0.5, divergence="alpha", options={"alpha": 0.5}, value_cap=10.0),
        PolicyOptions("model", lora=LoraOptions(r=8)),
        SamplingParams(n=4, stop=("</a>",)),
        ScoringOptions(workers=0, reward_funcs=["math"], options={"math": {"strict": False}}),
    ]
    for group in groups:
        data = plain(group)
        assert isinstance(data, dict) and not any(hasattr(v, "__dataclass_fields__") for v in data.values())
        assert as_group(type(group), data) == group
    assert plain(3) == 3 and plain(KLOptions) is KLOptions  # not a group instance: as it is


def test_option_groups_load_with_torchs_weights_only_loader(tmp_path):
    """Lightning resumes with ``torch.load(weights_only=True)``: the groups are allowed globals."""
    hparams = {
        "loss": LossOptions(advantage="passk", advantage_options={"k": 2}),
        "kl": KLOptions(coef=0.1),
        "batching": BatchingOptions(micro_batch_size=2),
        "evaluation": EvalOptions(pass_k=[1, 4]),
        "dynamic_sampling": DynamicSampling(4),
        "policy": PolicyOptions("model", lora=LoraOptions()),
    }
    torch.save(hparams, tmp_path / "hparams.pt")
    assert torch.load(tmp_path / "hparams.pt", weights_only=True) == hparams


def test_fields_a_checkpoint_lacks_get_their_defaults_when_it_loads():
    loaded = []
    for _ in range(2):
        scoring = ScoringOptions.__new__(ScoringOptions)
        scoring.__setstate__({"workers": 1, "timeout_s": 5.0})  # a checkpoint from before the newer fields
        loaded.append(scoring)
    first, second = loaded
    assert (first.workers, first.timeout_s, first.reward_funcs, first.max_failed_steps) == (1, 5.0, None, 3)
    assert first.options == {} and first.options is not second.options  # each its own default dict


def test_the_entropy_coefficient_moves_with_the_steps_mean_entropy_over_the_ranks():
    """state_after: the mean over the step's optimizer steps of their entropies (0 where one has none),
    summed over the ranks and divided by their number, then the controller's next state."""

    class TwoRanks:  # the other rank's mean entropy is 1.0
        world = 2

        def reduce(self, value, op):
            assert op == "sum"
            return value + 1.0

    options = EntropyOptions(control="adaptive", options={"entropy_target": 0.5, "entropy_coef_delta": 0.1})
    state = options.initial_state()
    losses = [{"entropy": torch.tensor(0.2)}, {"entropy": torch.tensor(0.4)}, {"policy": torch.tensor(1.0)}]
    moved = options.state_after(state, losses, TwoRanks())  # ((0.2 + 0.4 + 0) / 3 + 1.0) / 2 = 0.6
    assert moved == options.next_state(state, 0.6) != options.next_state(state, 0.2)  # above the target, not below


def test_the_reward_report_is_built_for_the_scoring_settings():
    options = ScoringOptions(workers=0, max_failed_steps=3)
    report = options.report(options.mix())
    assert (report.names, report.max_failed_steps) == ([], 3)  # one reward per row: no per-reward means


def test_optimizers_takes_only_trainable_parameters_and_steps_a_scheduler_when_given():
    import torch

    from lit_rlvr.options import optimizers

    frozen, trained = torch.nn.Parameter(torch.ones(2), requires_grad=False), torch.nn.Parameter(torch.ones(3))
    opt = optimizers([frozen, trained], lambda ps: torch.optim.SGD(ps, lr=0.1))
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["params"] == [trained]
    out = optimizers([trained], lambda ps: torch.optim.SGD(ps, lr=0.1), lambda o: torch.optim.lr_scheduler.StepLR(o, 1))
    assert isinstance(out["lr_scheduler"]["scheduler"], torch.optim.lr_scheduler.StepLR)
    assert out["lr_scheduler"]["scheduler"].optimizer is out["optimizer"]


def test_completion_budget_is_max_new_tokens_or_the_trajectorys_total():
    from lit_rlvr.options import SamplingParams, completion_budget

    assert completion_budget(SamplingParams(n=2, max_new_tokens=8), None) == 8


def test_a_trajectory_budget_smaller_than_one_turn_is_refused_at_start_up(tiny_model_dir):
    """``max_total_tokens`` below one turn's ``max_new_tokens`` once ran without a word, every trajectory cut."""
    import lit_rlvr.demo  # noqa: F401  (the countdown environment)
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import EnvironmentOptions, EvalOptions, PolicyOptions, SamplingParams, completion_budget

    env = EnvironmentOptions("countdown", max_total_tokens=100)
    with pytest.raises(
        ValueError, match=r"max_total_tokens=100 is smaller than one turn's 256 tokens \(model.sampling"
    ):
        completion_budget(SamplingParams(max_new_tokens=256), env)
    assert completion_budget(SamplingParams(max_new_tokens=64), env) == 100
    with pytest.raises(ValueError, match=r"smaller than one turn's 200 tokens \(model.evaluation.max_new_tokens\)"):
        RLVRModule(
            PolicyOptions(path=str(tiny_model_dir)),
            sampling=SamplingParams(n=2, max_new_tokens=8),
            evaluation=EvalOptions(max_new_tokens=200),
            environment=env,
        )
