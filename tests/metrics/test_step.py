"""log_step: what a training step logs, through the module's logger."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lit_rlvr.metrics.step import log_step


class Logged:
    def __init__(self):
        self.values: dict[str, float] = {}
        self.prog_bar: set[str] = set()

    def log(self, name, value, prog_bar=False, **kwargs):
        self.values[name] = float(value)
        if prog_bar:
            self.prog_bar.add(name)

    def log_dict(self, values, **kwargs):
        self.values.update({k: float(v) for k, v in values.items()})


def test_a_step_logs_each_loss_component_its_mean_over_optimizer_steps_and_what_it_trained_on():
    losses = [
        {"loss": torch.tensor(1.0), "policy": torch.tensor(2.0), "kl": torch.tensor(0.5)},
        {"loss": torch.tensor(3.0), "policy": torch.tensor(4.0)},
    ]
    old = torch.tensor([[0.0, float("nan")], [-1.0, 0.0]])
    data = SimpleNamespace(rewards=torch.tensor([1.0, 0.0]), old_logprobs=old, loss_tokens=torch.ones(2, 2))
    rollouts = SimpleNamespace(behaviour=lambda: None)
    module = Logged()
    log_step(module, data, torch.tensor([True, False, True, True]), losses, rollouts, None)
    assert module.values == pytest.approx(
        {
            "train/loss": 2.0,
            "train/policy": 3.0,
            "train/kl": 0.5,
            "train/reward": 0.5,
            "train/nonfinite_old_logprobs": 1.0,
            "train/kept_rows": 0.75,
        }
    )
    assert module.prog_bar == {"train/loss", "train/reward"}


def test_a_step_without_optimizer_steps_or_rows_logs_a_zero_reward_and_no_loss():
    data = SimpleNamespace(rewards=torch.zeros(0), old_logprobs=torch.zeros(0, 2), loss_tokens=torch.zeros(0, 2))
    module = Logged()
    log_step(module, data, torch.tensor([False, False]), [], SimpleNamespace(behaviour=lambda: None), None)
    assert module.values == {"train/reward": 0.0, "train/nonfinite_old_logprobs": 0.0, "train/kept_rows": 0.0}
