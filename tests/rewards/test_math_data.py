"""Math reward on every real gold answer: GSM8K (1,319), MATH-500 (500), AIME 2024, AMC 2023.

Every gold scores 1 against itself and equivalent rewritings (boxed in a sentence, ``$…$``,
``\\dfrac`` for ``\\frac``, spaces), in both extraction modes where the form has a marker, and 0
against a wrong answer: none is refused by the screen.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rlvr.rewards import REWARDS


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def _score(completion: str, answer, row_id: str, extraction: str = "math_verify") -> float:
    result = REWARDS["math"].score(completion, answer, id=row_id, prompt="q", reward="math", extraction=extraction)
    assert result.status in ("ok", "no_answer"), (row_id, completion, result)
    return result.reward


@pytest.mark.parametrize("extraction", ["math_verify", "boxed"])
def test_gsm8k_every_answer(shared_data, extraction):
    rows = _jsonl(shared_data / "gsm8k" / "test.jsonl")
    assert len(rows) == 1319
    for i, row in enumerate(rows):
        gold = row["answer"].rsplit("####", 1)[1].strip()
        value = int(gold.replace(",", ""))
        rid = f"gsm8k-{i}"
        assert _score(f"She makes \\boxed{{{gold}}} dollars.", row["answer"], rid, extraction) == 1.0, rid
        assert _score(f"...\n#### {value:,}", row["answer"], rid, extraction) == 1.0, rid
        assert _score(f"So the answer is {value}.", gold, rid, extraction) == 1.0, rid
        assert _score(f"\\boxed{{{value + 1}}}", row["answer"], rid, extraction) == 0.0, rid
        assert _score(f"the answer is {value - 1}", row["answer"], rid, extraction) == 0.0, rid
        if extraction == "math_verify":
            assert _score(f"In total ${value}$.", row["answer"], rid) == 1.0, rid
            assert _score(f"Answer: {gold}", row["answer"], rid) == 1.0, rid


def _math500_rewritings(answer: str) -> dict[str, tuple[str, ...]]:
    """Completion → the extraction modes that must find it."""
    spaced = " ".join(answer.split()).replace("+", " + ").replace("=", " = ")
    dfrac = answer.replace("\\frac", "\\dfrac")
    both = ("math_verify", "boxed")
    return {
        f"Therefore $\\boxed{{{answer}}}$.": both,
        f"So \\boxed{{{dfrac}}} is the value.": both,
        f"\\boxed{{ {spaced} }}": both,
        f"The final answer is ${answer}$.": ("math_verify",),
        f"Answer: ${answer}$": ("math_verify",),
    }


def test_math500_every_answer(shared_data):
    rows = _jsonl(shared_data / "math500" / "test.jsonl")
    assert len(rows) == 500
    for row in rows:
        for completion, extractions in _math500_rewritings(row["answer"]).items():
            for extraction in extractions:
                assert _score(completion, row["answer"], row["unique_id"], extraction) == 1.0, (
                    row,
                    completion,
                    extraction,
                )


@pytest.mark.parametrize("extraction", ["math_verify", "boxed"])
def test_math500_other_problems_answer_scores_zero(shared_data, extraction):
    """Another problem's answer scores 0, except where the two gold strings are identical."""
    rows = _jsonl(shared_data / "math500" / "test.jsonl")
    for i, row in enumerate(rows):
        other = rows[(i + 250) % len(rows)]["answer"]
        expected = 1.0 if other.strip() == row["answer"].strip() else 0.0
        assert _score(f"\\boxed{{{other}}}", row["answer"], row["unique_id"], extraction) == expected, (
            row["answer"],
            other,
        )


def _competition_golds(shared_data: Path) -> list[tuple[str, object]]:
    golds = [
        (f"aime24-{r['id']}", r["answer"]) for r in _jsonl(shared_data / "aime24" / "qwen25math_aime24_test.jsonl")
    ]
    golds += [
        (f"aime24-ds-{i}", r["answer"])
        for i, r in enumerate(json.load((shared_data / "aime24" / "deepscaler_aime.json").open()))
    ]
    golds += [(f"amc23-{r['id']}", r["answer"]) for r in _jsonl(shared_data / "amc23" / "qwen25math_amc23_test.jsonl")]
    golds += [
        (f"amc-ds-{i}", r["answer"])
        for i, r in enumerate(json.load((shared_data / "amc23" / "deepscaler_amc_2022_2023.json").open()))
    ]
    return golds


@pytest.mark.parametrize("extraction", ["math_verify", "boxed"])
def test_aime_amc_formats(shared_data, extraction):
    golds = _competition_golds(shared_data)
    assert len(golds) == 30 + 30 + 40 + 83
    assert any(isinstance(a, float) for _, a in golds) and any(
        isinstance(a, str) and a.startswith("0") for _, a in golds
    )
    for rid, answer in golds:
        value = float(answer)
        assert value.is_integer(), (rid, answer)
        value = int(value)
        assert _score(f"\\boxed{{{value}}}", answer, rid, extraction) == 1.0, (rid, answer)
        assert _score(f"\\boxed{{{value:03d}}}", answer, rid, extraction) == 1.0, (rid, answer)
        assert _score(f"The answer is {value}.0", answer, rid, extraction) == 1.0, (rid, answer)
        assert _score(f"\\boxed{{{value + 1}}}", answer, rid, extraction) == 0.0, (rid, answer)
        if extraction == "math_verify":
            assert _score(f"So $m+n={value}$.", answer, rid) == 1.0, (rid, answer)
            assert _score(f"**Final Answer:** {value}", answer, rid) == 1.0, (rid, answer)
