"""Several weighted rewards per completion: the sum, None, the correctness reward, start-up checks."""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import pytest

from lit_rlvr.options import ScoringOptions
from lit_rlvr.rewards import REWARDS, BatchScorer, RewardMix
from lit_rlvr.rewards.combine import weighted_sum

VERL_EXAMPLE = (
    Path(__file__).resolve().parents[2] / "examples" / "verl_gsm8k" / "gsm8k_reward.py"
)  # verl's signature, no **kwargs


def reference_sum(parts, weights) -> Fraction:
    """Σ w·r over the rewards that apply, in exact fractions (TRL: rewards_per_func × weights, nansum)."""
    return sum((Fraction(w) * Fraction(r) for r, w in zip(parts, weights) if r is not None), Fraction(0))


@pytest.mark.parametrize("seed", range(20))
def test_weighted_sum_matches_exact_fractions(seed):
    rng = random.Random(seed)
    K = rng.randint(1, 5)
    weights = [rng.choice([1.0, 0.5, 0.2, -1.0, 2.0, 0.0]) for _ in range(K)]
    parts = [rng.choice([None, 0.0, 1.0, 0.25, -1.0, 0.7]) for _ in range(K)]
    assert weighted_sum(parts, weights) == pytest.approx(float(reference_sum(parts, weights)), abs=1e-12)


def test_no_reward_that_applies_sums_to_zero():
    assert weighted_sum([None, None], [1.0, 0.2]) == 0.0 and weighted_sum([], []) == 0.0


def halves(completion, answer, **row):
    """0.5 per '7' in the completion, at most 1; None for rows marked not to be judged."""
    if row.get("skip"):
        return None
    return min(1.0, 0.5 * completion.count("7"))


@pytest.fixture
def halves_reward():
    REWARDS.register("test_halves")(halves)
    yield "test_halves"
    REWARDS.pop("test_halves")


def test_mixed_scores_are_the_weighted_sum_and_correctness_is_one_term(halves_reward):
    mix = RewardMix.from_config(["math", halves_reward], [1.0, 0.2], correctness="math")
    rows = [{"id": "a", "prompt": "p", "answer": "7"}, {"id": "b", "prompt": "p", "answer": "7", "skip": True}]
    completions = ["\\boxed{7} 7", "\\boxed{77}"]
    with BatchScorer(workers=0, rewards=mix.records, options=mix.scorer_options) as scorer:
        scores = mix.score(scorer, completions, rows)
        expected_parts = [(1.0, 1.0), (0.0, None)]
        assert [s.parts for s in scores] == expected_parts
        assert [s.reward for s in scores] == [float(reference_sum(p, [1.0, 0.2])) for p in expected_parts] == [1.2, 0.0]
        assert [s.correct for s in scores] == [1.0, 0.0]
        assert [s.status for s in scores] == ["ok", "ok"] and scores[1].results[1].status == "not_applicable"
        with_answers = mix.score(scorer, completions, rows, with_answers=True)
    assert [s.answer for s in with_answers] == ["7", "77"]  # the correctness term's canonical answer (maj@k)
    assert with_answers[0].results[1].answer is None  # other terms are not asked for theirs
    assert [s.reward for s in with_answers] == [s.reward for s in scores]


def test_rewards_an_environment_gave_are_not_scored_again(halves_reward):
    """Multi-turn trajectories: the environment's reward where it gave one (correct when > 0.5, its text
    stripped the answer), the rewards on the text elsewhere; the reward logs leave the given ones out."""
    from lit_rlvr.rewards.report import RewardReport

    mix = RewardMix.from_config(["math", halves_reward], [1.0, 0.2], correctness="math")
    rows = [{"id": "a", "prompt": "p", "answer": "7"}] * 3
    completions = ["\\boxed{7} 7", " 3*7+5; ", "\\boxed{77}"]
    with BatchScorer(workers=0, rewards=mix.records, options=mix.scorer_options) as scorer:
        sent = []
        score = scorer.score
        scorer.score = lambda texts, *a, **kw: sent.append(list(texts)) or score(texts, *a, **kw)
        scores = mix.score(scorer, completions, rows, with_answers=True, given=[None, 1.0, None])
        alone = mix.score(scorer, [completions[0], completions[2]], [rows[0], rows[2]], with_answers=True)
    assert all("3*7+5" not in t for texts in sent for t in texts)  # the given one never reached the rewards
    assert [scores[0], scores[2]] == alone
    given = scores[1]
    assert (given.reward, given.correct, given.answer, given.given, given.parts) == (
        1.0,
        1.0,
        "3*7+5;",
        True,
        (1.0, None),
    )
    assert not any(s.given for s in alone)

    class Logged:
        global_step, global_rank, values = 0, 0, {}

        def log(self, name, value, **kwargs):
            self.values[name] = float(value)

    logged, without = Logged(), Logged()
    logged.values, without.values = {}, {}
    RewardReport(mix.names)(logged, scores, rows, "train", lambda t: t)
    RewardReport(mix.names)(without, alone, [rows[0], rows[2]], "train", lambda t: t)
    assert logged.values == without.values


def test_without_reward_funcs_each_row_keeps_its_own_reward(halves_reward):
    mix = ScoringOptions(workers=0).mix()
    rows = [
        {"id": "a", "prompt": "p", "reward": "math", "answer": "7"},
        {"id": "b", "prompt": "p", "reward": halves_reward, "answer": "x"},
    ]
    with BatchScorer(workers=0) as scorer:
        scores = mix.score(scorer, ["\\boxed{7}", "7"], rows)
        plain = scorer.score(["\\boxed{7}", "7"], rows)
    assert mix.names == [] and [s.reward for s in scores] == [r.reward for r in plain] == [1.0, 0.5]
    assert [s.correct for s in scores] == [1.0, 0.5] and mix.correctness_sources(rows) == sorted(
        ["math", halves_reward]
    )


def test_the_correctness_scorer_sees_only_the_correctness_reward(halves_reward):
    mix = RewardMix.from_config(["math", halves_reward], [1.0, 0.2], correctness=halves_reward)
    with BatchScorer(workers=0, rewards=mix.records) as scorer:
        results = mix.correctness_scorer(scorer).score(["\\boxed{7}"], [{"id": "a", "prompt": "p", "answer": "3"}])
    assert [r.reward for r in results] == [0.5] and mix.correctness_sources([]) == [halves_reward]


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"reward_funcs": ["math", "sql"]}, r"scoring.correctness must name the reward .* one of \['math', 'sql'\]"),
        ({"reward_funcs": ["math"], "correctness": "sql"}, r"scoring.correctness='sql' is not one of"),
        (
            {"reward_funcs": ["math", "sql"], "reward_weights": [1.0], "correctness": "math"},
            "has 1 weights for 2 reward_funcs",
        ),
        ({"reward_funcs": ["math"], "reward_weights": [float("nan")]}, "must be finite numbers"),
        (
            {"reward_funcs": ["math", "sql"], "reward_weights": [0, 0.0], "correctness": "math"},
            r"reward_weights=\[0, 0.0\]: every weight is 0",
        ),
        ({"reward_funcs": [3]}, "3 is not a reward: give a registered reward's name, an import path or"),
        (
            {"reward_funcs": ["<python object, not importable: m:<lambda>>"]},
            "was given as a Python object, which a checkpoint",
        ),
        ({"reward_funcs": ["math", "math"], "correctness": "math"}, "two rewards share a name"),
        ({"reward_funcs": ["maths"]}, r"unknown reward 'maths'; registered: \[.*'math'"),
        ({"reward_funcs": []}, "must name at least one reward"),
        ({"reward_weights": [1.0]}, "needs scoring.reward_funcs"),
        (
            {"reward_funcs": ["math"], "options": {"sql": {"mode": "bird"}}},
            r"scoring.options names \['sql'\], which are not in",
        ),
        ({"reward_funcs": ["sql"], "options": {"sql": {"mode": "birds"}}}, "sql reward mode must be one of"),
        (
            {"reward_funcs": [f"{VERL_EXAMPLE}:compute_score"], "options": {"compute_score": {"nope": 1}}},
            r"scoring.options.compute_score: .* it takes no \['nope'\]",
        ),
        ({"reward_funcs": ["os.path.join"]}, "match no known signature"),
    ],
)
def test_bad_reward_settings_fail_at_start_up(settings, match):
    with pytest.raises(ValueError, match=match):
        ScoringOptions(**settings)


def test_options_of_an_imported_function_are_its_call_arguments():
    mix = ScoringOptions(
        reward_funcs=["lit_rlvr.rewards.conventions._doc_trl_reward", "sql"],
        correctness="sql",
        options={"_doc_trl_reward": {"answer": ["42"]}, "sql": {"mode": "bird"}},
    ).mix()
    assert mix.scorer_options == {"sql": {"mode": "bird"}} and mix.records["_doc_trl_reward"].score.options == {
        "answer": ["42"]
    }


def test_trl_items_carry_completion_ids_and_the_trainer_state():
    from lit_rlvr.rewards import TrainerState

    mix = RewardMix.from_config(["math", "lit_rlvr.rewards.conventions._doc_trl_reward"], correctness="math")
    math_rows, trl_rows = mix.item_rows([{"id": "a", "prompt": "p"}], [[4, 5]], TrainerState(global_step=3))
    assert math_rows == [{"id": "a", "prompt": "p", "reward": "math", "answer": None}]
    assert trl_rows == [
        {
            "id": "a",
            "prompt": "p",
            "reward": "_doc_trl_reward",
            "answer": None,
            "completion_ids": [4, 5],
            "trainer_state": TrainerState(global_step=3),
        }
    ]


@pytest.mark.parametrize(
    ("funcs", "rows", "match"),
    [
        (None, [{"id": "a", "prompt": "p", "answer": "1"}], r"row 'a' has no \['reward'\]"),
        (["math"], [{"id": "b", "prompt": "p", "solution": "1"}], r"row 'b' has no \['answer'\]"),
    ],
)
def test_rows_the_rewards_cannot_score_fail_at_start_up(funcs, rows, match):
    with pytest.raises(ValueError, match=match):
        RewardMix.from_config(funcs).check_rows(rows)
    RewardMix.from_config(["lit_rlvr.rewards.conventions._doc_trl_reward"]).check_rows(rows)  # TRL's read columns


def test_the_row_entry_is_each_rows_own_reward_among_others(halves_reward):
    """A dataset mixing rewards by row (math rows, `halves` rows) plus a bonus for every row."""
    mix = RewardMix.from_config(["row", halves_reward], [1.0, 0.5], correctness="row", options={"math": {}})
    rows = [
        {"id": "m", "prompt": "p", "reward": "math", "answer": "7"},
        {"id": "h", "prompt": "p", "reward": halves_reward, "answer": "-"},
    ]
    with BatchScorer(workers=0, rewards=mix.records, options=mix.scorer_options) as scorer:
        scores = mix.score(scorer, ["\\boxed{7}", "77"], rows)
    assert [s.parts for s in scores] == [(1.0, 0.5), (1.0, 1.0)]  # row: math 1.0, halves 1.0; bonus: halves 0.5, 1.0
    assert [s.reward for s in scores] == [1.25, 1.5] and [s.correct for s in scores] == [1.0, 1.0]
    assert mix.correctness_sources(rows) == sorted(["math", halves_reward])
    with pytest.raises(ValueError, match=r"row 'x' has no \['reward'\]"):
        mix.check_rows([{"id": "x", "prompt": "p", "answer": "1"}])


@pytest.mark.parametrize("stored_as", ["plain", "group"])
def test_a_python_reward_is_kept_as_plain_data_in_a_checkpoint(tmp_path, stored_as):
    """A checkpoint's hyper-parameters hold the scoring options (plain data; the group itself in
    earlier versions); torch.load(weights_only=True) refuses a pickled function, so a Python
    reward is saved as its import path (a lambda as a marker that is refused with advice)."""
    import torch

    from lit_rlvr.options import as_group, plain
    from lit_rlvr.rewards.conventions import _doc_trl_reward

    scoring = ScoringOptions(
        reward_funcs=[_doc_trl_reward, "math", lambda completions, **kw: [1.0]], correctness="math", workers=0
    )
    torch.save(
        {"hyper_parameters": {"scoring": plain(scoring) if stored_as == "plain" else scoring}}, tmp_path / "c.ckpt"
    )
    loaded = torch.load(tmp_path / "c.ckpt", weights_only=True)["hyper_parameters"]["scoring"]
    funcs = loaded["reward_funcs"] if stored_as == "plain" else loaded.reward_funcs
    assert funcs[:2] == ["lit_rlvr.rewards.conventions:_doc_trl_reward", "math"]
    assert funcs[2].startswith("<python object, not importable: ")
    settings = plain(scoring)
    assert as_group(ScoringOptions, {**settings, "reward_funcs": funcs[:2]}).mix().names == ["_doc_trl_reward", "math"]
    with pytest.raises(ValueError, match="pass the rewards again"):
        as_group(ScoringOptions, {**settings, "reward_funcs": funcs})


@pytest.mark.parametrize(
    ("funcs", "weights", "rows", "binary"),
    [
        (["math"], None, None, True),
        (["math", "sql"], [1.0, 1.0], None, False),  # 0, 1 or 2
        (["math"], [0.5], None, False),
        (None, None, [{"reward": "math"}, {"reward": "sql"}], True),
        (
            ["lit_rlvr.rewards.conventions._doc_trl_reward"],
            None,
            None,
            None,
        ),  # an imported function: unknown until it runs
    ],
)
def test_rewards_known_to_be_non_binary_are_refused_at_start_up(funcs, weights, rows, binary):
    mix = RewardMix.from_config(funcs, weights, correctness=funcs[0] if funcs and len(funcs) > 1 else None)
    values = mix.reward_values(rows)
    assert (None if values is None else values <= {0.0, 1.0}) == binary
    if binary is False:
        with pytest.raises(ValueError, match="model.loss.advantage='passk' needs binary rewards in \\{0, 1\\}"):
            mix.require_binary("model.loss.advantage='passk'", rows)
    else:
        mix.require_binary("model.loss.advantage='passk'", rows)


def test_a_correctness_reward_that_never_exceeds_one_half_is_refused(halves_reward):
    REWARDS.register("test_format_only", values=(0.0, 0.25, 0.5))(halves)
    try:
        with pytest.raises(
            ValueError,
            match=r"scoring.correctness: a completion counts as correct when its correctness reward is > 0.5, "
            r"but 'test_format_only' only gives \[0.0, 0.25, 0.5\]",
        ):
            ScoringOptions(reward_funcs=["math", "test_format_only"], correctness="test_format_only")
        with pytest.raises(
            ValueError, match="data: a completion counts as correct"
        ):  # each row's own reward, known from the rows
            RewardMix.from_config().check_rows([{"id": "f", "reward": "test_format_only", "answer": "1"}])
        ScoringOptions(reward_funcs=["math", "test_format_only"], correctness="math")
    finally:
        REWARDS.pop("test_format_only")


def test_rollouts_are_scored_prompt_major_on_their_final_turns(halves_reward):
    """score_rollouts: each prompt's row repeated for its n samples, the final turns' texts and ids, an
    environment's reward kept; no prompt (a rank with only padding prompts): nothing scored."""
    from lit_rlvr.rollout.types import Rollouts

    mix = RewardMix.from_config([halves_reward])
    prompts = [{"id": "a", "prompt": "p", "answer": ""}, {"id": "b", "prompt": "q", "answer": ""}]
    texts = ["7", "77", "x", "7 7"]
    rollouts = Rollouts([[1], [2]], [[3], [4], [5], [6]], [[0.0]] * 4, ["stop"] * 4, n=2, texts=texts)
    with BatchScorer(workers=0, rewards=mix.records, options=mix.scorer_options) as scorer:
        scores, rows = mix.score_rollouts(scorer, rollouts, prompts)
        expected = mix.score(scorer, texts, [prompts[0]] * 2 + [prompts[1]] * 2, completion_ids=[[3], [4], [5], [6]])
        assert (scores, rows) == (expected, [prompts[0]] * 2 + [prompts[1]] * 2)
        assert mix.score_rollouts(scorer, rollouts.of_prompts([]), []) == ([], [])
