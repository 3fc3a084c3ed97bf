"""Reward functions for TRL's GRPOTrainer, in TRL's documented signature.

lit_rlvr calls them unchanged (``model.scoring.reward_funcs`` in configs/migrate/trl_grpo.yaml):
each gets the prompts, the completions (for a conversational dataset, one assistant message
each), the completion token ids, the trainer state and every other dataset column by name, and
returns one float per completion, or None where it does not apply.
"""

import re

from math_verify import LatexExtractionConfig, parse, verify


def _text(completion) -> str:
    """A completion's text: conversational completions are ``[{"role": "assistant", "content": ...}]``."""
    return completion if isinstance(completion, str) else completion[0]["content"]


def accuracy_reward(completions, solution, **kwargs) -> list[float | None]:
    """1.0 when the completion's final answer equals the solution (math-verify), 0.0 when not;
    None when the solution itself cannot be parsed (the example is skipped, as TRL's own)."""
    rewards = []
    for completion, gold in zip(completions, solution):
        gold_parsed = parse(gold)
        if not gold_parsed:
            rewards.append(None)
            continue
        answer = parse(_text(completion), extraction_config=[LatexExtractionConfig()])
        rewards.append(float(verify(gold_parsed, answer)))
    return rewards


THINK_ANSWER = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when the completion is ``<think>…</think><answer>…</answer>``, else 0.0."""
    return [float(bool(THINK_ANSWER.match(_text(c)))) for c in completions]
