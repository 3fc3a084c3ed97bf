"""What a batch of rewards came to in the logs: a failing reward is named, its traceback shown, its
failed items missing from its mean, and a reward that always raises stops the run."""

from __future__ import annotations

import logging

import pytest
import torch

from lit_rlvr.rewards.base import ScoreResult, error_result
from lit_rlvr.rewards.combine import MixedScore
from lit_rlvr.rewards.report import RewardReport


class Logged:
    """What a LightningModule's ``log`` would have received (the report's only use of the module)."""

    global_step, global_rank = 3, 0

    def __init__(self):
        self.values: dict[str, float] = {}

    def log(self, name, value, **kwargs):
        self.values[name] = float(value)


def same(tensor):  # one process: the sum over the ranks is the tensor itself
    return tensor


def raised() -> ScoreResult:
    try:
        {}["solution"]
    except KeyError as e:
        return error_result(e)


def scores(*per_completion: tuple[ScoreResult, ...]) -> list[MixedScore]:
    return [MixedScore(0.0, 0.0, results) for results in per_completion]


ROWS = [{"id": "q"}] * 3


def quiet_trainer():
    """A CPU trainer of up to 10 steps with the hf rollouts, nothing logged or saved: the failing-step
    tests stop it long before."""
    from lightning import Trainer

    from lit_rlvr.callbacks import RolloutCallback

    return Trainer(
        max_steps=10,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RolloutCallback(engine="hf")],
    )


def test_a_failed_item_is_missing_from_its_rewards_mean_not_a_zero():
    """The mean used to count an error as 0: 1 of 3 here, where the reward scored 1 of 2."""
    module = Logged()
    batch = scores(
        (ScoreResult(1.0), ScoreResult(0.5)),
        (raised(), ScoreResult(0.5)),
        (ScoreResult(0.0), ScoreResult(0.0, "timeout")),
    )
    RewardReport(["accuracy", "format"])(module, batch, ROWS, "train", same)
    assert module.values["train/reward/accuracy"] == 0.5 and module.values["train/reward/format"] == 0.5
    assert module.values["train/reward_status/error"] == 1 / 6 and module.values["train/reward_errors"] == 1.0


def test_a_failing_reward_is_named_with_its_traceback(caplog):
    """The log line used to name neither the failing reward nor its traceback."""
    report = RewardReport(["accuracy", "format"])
    batch = scores((ScoreResult(1.0), raised()), (ScoreResult(0.0), raised()), (ScoreResult(1.0), ScoreResult(1.0)))
    quiet = scores(*[(ScoreResult(1.0), ScoreResult(1.0))] * 4, (ScoreResult(1.0), raised()))  # 1 of 5 failed: not loud
    with caplog.at_level(logging.INFO, logger="lit_rlvr.rewards.report"):
        report(Logged(), batch, ROWS, "train", same)
        report(Logged(), quiet, ROWS * 2, "train", same)
    records = [r for r in caplog.records if r.name == "lit_rlvr.rewards.report"]
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    (warning,) = warnings  # the first failure of the run (and every loud batch); later quiet ones at INFO
    assert [r.getMessage().split(": ", 2)[1] for r in records if r.levelno == logging.INFO] == ["reward 'format'"] * 2
    assert warning.startswith(
        "train rewards (step 3, rank 0): reward 'format': 2 of 3 items failed (status error or timeout), "
        "each scored 0; train/reward_errors counts the errors: 3 scored: ok 1, error 2; first error: KeyError: 'solution'"
    )
    assert "Traceback (most recent call last):" in warning and warning.rstrip().endswith("KeyError: 'solution'")
    assert all("'accuracy'" not in r.getMessage() for r in records)


def test_a_reward_that_times_out_is_warned_about_too(caplog):
    """Only status `error` used to be warned about; a reward that always ran out of time was silent."""
    with caplog.at_level(logging.WARNING, logger="lit_rlvr.rewards.report"):
        RewardReport([])(
            Logged(),
            scores((ScoreResult(0.0, "timeout"),), (ScoreResult(1.0),)),
            [{"reward": "math"}] * 2,
            "val/gsm8k",
            same,
        )
    (record,) = [r for r in caplog.records if r.name == "lit_rlvr.rewards.report"]
    assert record.getMessage() == (
        "val/gsm8k rewards (step 3, rank 0): reward 'math': 1 of 2 items failed (status error or timeout), "
        "each scored 0: 2 scored: ok 1, timeout 1; first timeout: no reason given"
    )


def test_a_reward_that_raises_on_every_item_stops_the_run_after_max_failed_steps():
    report = RewardReport(["accuracy", "format"], max_failed_steps=3)
    failing = scores((ScoreResult(1.0), raised()), (ScoreResult(0.0), raised()))
    for _ in range(2):
        report(Logged(), failing, ROWS, "train", same)
        report(Logged(), failing, ROWS, "val/set", same)  # validation neither counts nor resets
    report(
        Logged(), scores((ScoreResult(1.0), raised()), (ScoreResult(0.0), ScoreResult(1.0))), ROWS, "train", same
    )  # resets
    for _ in range(2):
        report(Logged(), failing, ROWS, "train", same)
    with pytest.raises(
        RuntimeError,
        match=r"reward 'format' raised on every item, on every rank, for 3 training batches in a row "
        r"\(model.scoring.max_failed_steps=3\).*first error here: KeyError: 'solution'\nTraceback",
    ):
        report(Logged(), failing, ROWS, "train", same)
    timeouts = scores(
        (ScoreResult(1.0), ScoreResult(0.0, "timeout")),
    )
    never = RewardReport(["accuracy", "format"], max_failed_steps=1)
    never(Logged(), timeouts, ROWS, "train", same)  # timeouts do not count toward it


def test_the_decision_is_taken_on_the_counts_of_every_rank():
    """A reward that failed on every item here but scored on another rank does not stop any rank."""
    report = RewardReport(["format"], max_failed_steps=1)
    other_rank = torch.tensor([[1.0, 1.0, 0.0, 1.0]], dtype=torch.float64)  # sum, count, errors, items
    report(Logged(), scores((raised(),)), ROWS, "train", lambda t: t + other_rank)
    with pytest.raises(RuntimeError, match="reward 'format' raised on every item"):
        report(Logged(), scores((raised(),)), ROWS, "train", lambda t: t)


def always_raises(completions, **kwargs):
    """A TRL reward with a bug: the column it reads is not in the data."""
    return [float(s == "7") for s in kwargs["solution"]]


@pytest.mark.timeout(120)
def test_a_fit_with_a_reward_that_always_raises_stops_with_its_name_and_traceback(tiny_model_dir, toy_prompts, caplog):
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import DatasetSpec
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions

    dm = PromptDataModule(
        tokenizer=str(tiny_model_dir), train=DatasetSpec(files=toy_prompts(4), name="toy"), batch_size=2
    )
    scoring = ScoringOptions(workers=0, reward_funcs=[always_raises], max_failed_steps=2)
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)), sampling=SamplingParams(n=2, max_new_tokens=4, seed=0), scoring=scoring
    )
    trainer = quiet_trainer()
    with caplog.at_level(logging.WARNING, logger="lit_rlvr.rewards.report"):
        with pytest.raises(
            RuntimeError,
            match=r"reward 'always_raises' raised on every item.*for 2 training batches in a row.*"
            r"first error here: KeyError: 'solution'\nTraceback[^$]*in always_raises",
        ):
            trainer.fit(module, datamodule=dm)
    first, second = [
        r.getMessage() for r in caplog.records if r.name == "lit_rlvr.rewards.report"
    ]  # every batch of it is loud
    assert (
        first.startswith("train rewards (step 0, rank 0): reward 'always_raises': 4 of 4 items failed")
        and "in always_raises" in first
    )
    assert second.startswith("train rewards (step 1, rank 0)")  # the second batch: the run stops there


def test_each_reason_an_environment_failed_is_warned_once_with_its_count(caplog):
    """The reasons kept in the episodes reach the log: one warning per distinct reason, with how many
    trajectories it ended; a reason seen before goes to INFO; a batch that trained something resets the count."""
    from types import SimpleNamespace

    from lit_rlvr.rewards.report import EnvironmentReport

    def episodes(*statuses_reasons):
        return [SimpleNamespace(status=s, reason=r) for s, r in statuses_reasons]

    report = EnvironmentReport(max_failed_steps=2)
    batch = episodes(
        ("env_error", "KeyError: 'db'"), ("env_error", "KeyError: 'db'"), ("done", ""), ("env_timeout", "")
    )
    with caplog.at_level(logging.INFO, logger="lit_rlvr.rewards.report"):
        report(batch, "step 0, rank 0", same)
        report(batch, "step 1, rank 0", same)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        len(warnings) == 2 and "failed on 2 of 4 trajectories" in warnings[0] and warnings[0].endswith("KeyError: 'db'")
    )
    assert "failed on 1 of 4 trajectories" in warnings[1] and warnings[1].endswith("env_timeout")
    assert sum("step 1, rank 0: 2 of 4" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO) == 1
    assert report.failed_steps == 0  # one trajectory of each batch ran


def test_environments_failing_on_every_trajectory_stop_the_run_after_max_failed_steps():
    from types import SimpleNamespace

    from lit_rlvr.rewards.report import EnvironmentReport

    failed = [SimpleNamespace(status="env_error", reason="ValueError: cannot parse tool calls")] * 3
    report = EnvironmentReport(max_failed_steps=3)
    report(failed, "s0", same)
    report([SimpleNamespace(status="done", reason="")] + failed[1:], "s1", same)  # one ran: the count starts again
    report(failed, "s2", same)
    report(failed, "s3", same)
    with pytest.raises(
        RuntimeError,
        match=r"for 3 training batches in a row .*reasons here \(s4\): 3x ValueError: cannot parse tool calls",
    ):
        report(failed, "s4", same)
    never = EnvironmentReport(max_failed_steps=None)
    for _ in range(5):
        never(failed, "s", same)
    # several ranks: a batch fails only when every rank's every trajectory did
    other_rank_ran = EnvironmentReport(max_failed_steps=1)
    other_rank_ran(failed, "s", lambda t: t + torch.tensor([0.0, 2.0]))


def test_a_fit_whose_environment_always_fails_stops_naming_why(tiny_model_dir, toy_prompts, caplog):
    """Every trajectory's environment raises: the reason is warned about at the first step, and the
    run stops after ``max_failed_steps`` batches naming it, rather than end with nothing trained."""
    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import DatasetSpec
    from lit_rlvr.envs import ENVIRONMENTS, EnvironmentBase, register_environment
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions
    from lit_rlvr.rollout.turns import EnvironmentOptions

    class Broken(EnvironmentBase):
        def step(self, action):
            raise ValueError("this tokenizer's tool calls cannot be parsed")

    register_environment("_test_broken")(Broken)
    try:
        dm = PromptDataModule(
            tokenizer=str(tiny_model_dir), train=DatasetSpec(files=toy_prompts(4), name="toy"), batch_size=2
        )
        module = RLVRModule(
            PolicyOptions(str(tiny_model_dir)),
            sampling=SamplingParams(n=2, max_new_tokens=4, seed=0),
            scoring=ScoringOptions(workers=0, max_failed_steps=2),
            environment=EnvironmentOptions("_test_broken", max_turns=2),
        )
        trainer = quiet_trainer()
        with caplog.at_level(logging.WARNING, logger="lit_rlvr.rewards.report"):
            with pytest.raises(
                RuntimeError,
                match=r"environment failed on every trajectory.*for 2 training batches in a row.*"
                r"4x ValueError: this tokenizer's tool calls cannot be parsed",
            ):
                trainer.fit(module, datamodule=dm)
    finally:
        ENVIRONMENTS.pop("_test_broken")
    warned = [r.getMessage() for r in caplog.records if r.name == "lit_rlvr.rewards.report"]
    assert len(warned) == 1 and warned[0].startswith(
        "train environments (step 0, rank 0): the environment failed on 4 of 4"
    )
    assert warned[0].endswith("ValueError: this tokenizer's tool calls cannot be parsed")
