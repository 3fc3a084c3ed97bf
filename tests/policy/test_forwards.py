"""PolicyForwards: the trainer's forwards are the policy's log-prob functions with the module's settings."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlvr.contracts import StepData
from lit_rlvr.lockstep import Lockstep
from lit_rlvr.policy import MicroBatching, PolicyForwards, batched_completion_logprobs, completion_logprobs
from lit_rlvr.rollout.types import Rollouts


class CountingRanks:
    """One rank that records what it is asked (``Lockstep.most``)."""

    def __init__(self):
        self.asked: list[int] = []

    def most(self, passes: int) -> int:
        self.asked.append(passes)
        return passes


def test_forwards_are_the_log_prob_functions_at_the_rollout_temperature(tiny_model_dir):
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tok("C375=026:").input_ids, tok("C12=3:").input_ids]
    completions = [tok(t).input_ids for t in ["3*7+5;", "12", "777", "5;"]]
    rollouts = Rollouts(prompts, completions, [[0.0] * len(c) for c in completions], ["stop"] * 4, n=2)
    data = StepData.from_rollouts(rollouts, tok.pad_token_id, torch.zeros(4))
    batching, ranks = MicroBatching(max_rows=3), CountingRanks()
    forwards = PolicyForwards(policy, batching, 0.7, ranks)
    lp, h = forwards.logprobs(data, with_entropy=True)
    want = batched_completion_logprobs(policy, *data.forward_args, 0.7, True, batching, Lockstep().most)
    assert torch.equal(lp, want[0]) and torch.equal(h, want[1]) and ranks.asked == [2]  # 4 rows in 2 micro-batches
    assert not lp.requires_grad
    lp1, _ = forwards.forward_logprobs(data, temperature=1.0)
    assert torch.equal(lp1, completion_logprobs(policy, *data.forward_args, 1.0)[0])
    assert lp1.requires_grad and forwards.packs is False
