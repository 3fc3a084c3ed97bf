"""The tool-call bonus ``tool_call`` (lit_rlvr/rewards/tools.py): a weighted term of multi-turn trajectories."""

from __future__ import annotations

import re

import pytest
import yaml

from lit_rlvr.options import ScoringOptions
from lit_rlvr.rewards import REWARDS, BatchScorer, RewardMix
from lit_rlvr.rollout.types import Episode, Rollouts
from tests.conftest import REPO_ROOT

BONUS = 0.1  # verl PR #4998's +0.1


def multi_turn(environment_rewards: list[float | None]) -> Rollouts:
    """One prompt, two trajectories answering "18": the first checked "9+9" with a tool, the second
    answered at once. ``environment_rewards``: what the environment gave each (None: the rewards score)."""
    calls = [("9+9",), ()]
    texts = ["9+9?=18 \\boxed{18}", "\\boxed{18}"]
    masks = [[1, 1, 0, 1], [1]]
    episodes = [
        Episode(reward, "done", turns=len(c) + 1, tool_calls=c, final_text="\\boxed{18}")
        for reward, c in zip(environment_rewards, calls)
    ]
    ids = [list(range(len(m))) for m in masks]
    return Rollouts(
        [[1]], ids, [[0.0] * len(m) for m in masks], ["stop"] * 2, n=2, texts=texts, loss_mask=masks, episodes=episodes
    )


ROWS = [{"id": "q", "prompt": "9 + 9?", "answer": "18", "reward": "math"}]


def scores(mix: RewardMix, rollouts: Rollouts, with_answers: bool = False):
    with BatchScorer(workers=0, rewards=mix.records, options=mix.scorer_options) as scorer:
        return mix.score_rollouts(scorer, rollouts, ROWS, with_answers=with_answers)[0]


@pytest.mark.parametrize("given", [None, 1.0], ids=["rewards_score", "environment_scores"])
def test_the_bonus_is_added_to_a_trajectory_that_called_a_tool_and_not_to_one_that_did_not(given):
    mix = RewardMix.from_config(["row", "tool_call"], [1.0, BONUS], correctness="row")
    called, did_not = scores(mix, multi_turn([given, given]), with_answers=True)
    assert called.reward == pytest.approx(1.0 + BONUS) and did_not.reward == 1.0
    assert called.correct == did_not.correct == 1.0  # the bonus never makes an answer correct
    assert called.parts == (1.0, 1.0) and did_not.parts == (1.0, 0.0)
    assert called.answer == did_not.answer is not None  # maj@k still reads the correctness term
    wrong = scores(mix, multi_turn([0.0, 0.0]))[0] if given is not None else None
    if wrong is not None:  # an environment's wrong answer with a tool call: only the bonus
        assert wrong.reward == pytest.approx(BONUS) and wrong.correct == 0.0


def test_a_single_turn_completion_gets_no_bonus_and_the_weight_is_the_terms():
    mix = RewardMix.from_config(["math", "tool_call"], [1.0, 0.5], correctness="math")
    single = Rollouts([[1]], [[5], [6]], [[0.0], [0.0]], ["stop"] * 2, n=2, texts=["\\boxed{18}", "17"])
    right, wrong = scores(mix, single)
    assert (right.reward, right.parts) == (1.0, (1.0, None)) and (wrong.reward, wrong.parts) == (0.0, (0.0, None))
    called = scores(mix, multi_turn([None, None]))[0]
    assert called.reward == pytest.approx(1.5)


def test_the_bonus_is_a_registered_trajectory_reward_that_start_up_checks_know():
    assert REWARDS.trait("tool_call", "trajectory") is True and REWARDS.options("tool_call") == []
    assert REWARDS["tool_call"].values == (0.0, 1.0)
    mix = RewardMix.from_config(["math", "tool_call"], [1.0, BONUS], correctness="math")
    assert mix.trajectory_terms == [1] and RewardMix.from_config(["math"]).trajectory_terms == []
    assert mix.reward_values() == {0.0, BONUS, 1.0, 1.0 + BONUS}
    with pytest.raises(ValueError, match="needs binary rewards in"):
        mix.require_binary("model.loss.advantage='passk'")
    with pytest.raises(ValueError, match="correctness must name the reward"):
        RewardMix.from_config(["math", "tool_call"], [1.0, BONUS])
    block = re.search(
        r"### A tool-call bonus\n.*?```yaml\n(.*?)```", (REPO_ROOT / "docs" / "agents.md").read_text(), re.S
    )
    options = ScoringOptions(**yaml.safe_load(block.group(1))["model"]["scoring"])  # docs/agents.md's settings
    assert options.mix().names == ["row", "tool_call"] and options.mix().weights == [1.0, BONUS]
    assert options.mix().trajectory_terms == [1] and options.mix().correctness == "row"
