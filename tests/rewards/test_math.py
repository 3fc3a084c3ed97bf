"""Math reward: extraction, exact-number path vs math-verify, screening, deadlines, gold errors."""

from __future__ import annotations

import random
import threading
import time
from fractions import Fraction

import pytest
from math_verify import verify

from lit_rlvr.rewards import REWARDS, GoldAnswerError
from lit_rlvr.rewards.base import RewardTimeout, deadline
from lit_rlvr.rewards.math import _as_number, _parse, extract_answer, gold_answer, screen_answer


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("\\boxed{42}", "42"),
        ("first \\boxed{1} then \\boxed{\\frac{a}{b^{2}}}", "\\frac{a}{b^{2}}"),
        ("\\boxed {7}", "7"),
        ("\\fbox{3}", "3"),
        ("\\boxed 5 apples", "5"),
        ("$\\boxed{\\{1,2\\}}$", "\\{1,2\\}"),
        ("reasoning\n#### 1,234\n", "1,234"),
        ("#### 3\nmore text\n#### -7", "-7"),
        ("So the answer is 18.", "18"),
        ("The final answer is $\\frac{3}{4}$. Thanks", "\\frac{3}{4}"),
        ("THE ANSWER IS: 12 dollars", "12"),
        ("the answer is \\(x+1\\)", "x+1"),
        ("The answer is 3.5. Next.", "3.5"),
        ("\\boxed{1} but #### 2", "1"),  # boxed has priority
        ("unbalanced \\boxed{1 then the answer is 4", "4"),
        ("nothing here", None),
        ("\\boxed{}", None),
        ("#### ", None),
        ("", None),
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(
    ("answer", "row", "expected"),
    [
        ("Janet ... = 18\n#### 18", {}, "18"),
        ("#### 1,234", {}, "1,234"),
        ("025", {}, "025"),
        (27.0, {}, "27.0"),
        (5, {}, "5"),
        ("142.0", {}, "142.0"),
        ("\\frac{14}{3}", {}, "\\frac{14}{3}"),
    ],
)
def test_gold_formats(answer, row, expected):
    assert gold_answer(answer, row) == expected


@pytest.mark.parametrize("answer", ["", "   ", "#### ", None, True, [1]])
def test_malformed_gold_raises_with_row_id(answer):
    with pytest.raises(GoldAnswerError, match="row id='row-17'"):
        REWARDS["math"]("\\boxed{1}", answer, id="row-17")


def test_unparsable_gold_raises_with_row_id():
    with pytest.raises(ValueError, match="row id='m-3'.*cannot parse"):
        REWARDS["math"]("\\boxed{x}", "}", id="m-3")


@pytest.mark.parametrize(
    ("pred", "gold", "reward"),
    [
        ("25", "025", 1.0),  # AIME zero padding
        ("27", 27.0, 1.0),  # AMC JSON float
        ("142", "142.0", 1.0),  # AMC float string
        ("1234", "#### 1,234", 1.0),  # GSM8K thousands separator
        ("1{,}234", "1234", 1.0),
        ("\\$18", "18", 1.0),
        ("18.00", "18", 1.0),
        ("19", "18", 0.0),
        ("0.5", "\\frac{1}{2}", 1.0),
        ("\\dfrac{14}{3}", "\\frac{14}{3}", 1.0),
        ("\\frac{28}{6}", "\\frac{14}{3}", 1.0),
        ("x+1", "1+x", 1.0),
        ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", 1.0),
        ("(1, 2)", "(1,2)", 1.0),
        ("(2, 1)", "(1,2)", 0.0),
        ("\\text{(C)}", "\\text{(C)}", 1.0),
        ("x", "y", 0.0),
    ],
)
def test_equivalence(pred, gold, reward):
    assert REWARDS["math"](f"... \\boxed{{{pred}}}", gold, id="t", prompt="p", reward="math") == reward


def _random_number(rng: random.Random) -> str:
    whole = rng.choice([0, 1, 7, 18, 25, 100, 1234, 98765, 10**6])
    form = rng.choice(["int", "comma", "pad", "dec", "neg", "frac_dec"])
    if form == "comma":
        return f"{whole:,}"
    if form == "pad":
        return f"{whole:03d}"
    if form == "dec":
        return f"{whole}.{rng.choice(['0', '00', '5', '25'])}"
    if form == "neg":
        return f"-{whole}"
    if form == "frac_dec":
        return f"0.{rng.randint(0, 999):03d}"
    return str(whole)


@pytest.mark.parametrize("seed", range(4))
def test_number_fast_path_agrees_with_math_verify(seed):
    """Reference: math-verify's own verdict on the parsed numbers (the fast path skips it)."""
    rng = random.Random(seed)
    for _ in range(60):
        gold, pred = _random_number(rng), _random_number(rng)
        if rng.random() < 0.3:
            pred = gold.replace(",", "")
        expected = verify(_parse(gold), _parse(pred), timeout_seconds=None)
        assert REWARDS["math"](f"\\boxed{{{pred}}}", gold, id="n") == float(expected), (gold, pred)
        assert (_as_number(gold) == _as_number(pred)) == expected


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("10^{10^{10^{10}}}", "nested exponent"),
        ("2**3**4**5", "nested exponent"),
        ("10^{12345}", "more than 4 digits"),
        ("((10^{999})^{999})^{999}", "product of numeric exponents"),
        ("99999!", "factorial of a number"),
        ("(3!)!", "more than one factorial"),
        ("(9^{99})!", "factorial together with a power"),
        ("{" * 13 + "1" + "}" * 13, "nesting depth"),
        ("1" * 501, "characters"),
    ],
)
def test_screen_rejects(answer, reason):
    assert reason in screen_answer(answer)


@pytest.mark.parametrize(
    "answer", ["x^2y^3", "2^{10}\\cdot 3^{5}", "9^{9999}", "5!", "11,\\! 111,\\! 100", "e^{i\\pi}", "\\left( 3, \\frac{\\pi}{2} \\right)"]
)
def test_screen_accepts(answer):
    assert screen_answer(answer) is None


ADVERSARIAL = {
    "nested_braces": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
    "nested_fracs": "\\boxed{" + "\\frac{1}{" * 12 + "2" + "}" * 12 + "}",
    "power_tower": "\\boxed{10^{10^{10^{10}}}}",
    "python_tower": "the answer is 10**10**10**10",
    "bare_tower": "\\boxed{10^10^10^10}",
    "huge_factorial": "\\boxed{(10^{4})!}",
    "big_string": "x" * 100_000 + " \\boxed{" + "9" * 100_000 + "}",
    "many_boxes": "\\boxed{" * 20_000,
    "surrogates": "\\boxed{\ud800\udfff 1}",
    "unbalanced_left": "\\boxed{\\left( 1, 2 + \\left[ 3}",
    "long_sum": "\\boxed{\\sum_{n=1}^{9999} n^{99}}",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
@pytest.mark.parametrize("where", ["main", "thread"])
def test_adversarial_inputs_score_zero_within_deadline(name, where):
    completion, out = ADVERSARIAL[name], {}

    def run():
        start = time.perf_counter()
        out["result"] = REWARDS["math"].score(completion, "7", id="adv", timeout_s=1.0)
        out["elapsed"] = time.perf_counter() - start

    if where == "main":
        run()
    else:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join(10)
        assert not worker.is_alive()
    assert out["result"].reward == 0.0
    assert out["elapsed"] < 1.5, out


def test_deadline_interrupts_python_loop_in_main_thread():
    start = time.perf_counter()
    with pytest.raises(RewardTimeout), deadline(0.2) as armed:
        assert armed
        while True:
            pass
    assert time.perf_counter() - start < 1.0
    time.sleep(0.15)  # the re-firing timer is disarmed: no stray SIGALRM


def test_deadline_is_inert_off_main_thread_and_when_disabled():
    seen = []
    worker = threading.Thread(target=lambda: seen.append(deadline(0.1).__enter__()))
    worker.start()
    worker.join()
    with deadline(None) as armed:
        seen.append(armed)
    assert seen == [False, False]


def test_scorer_statuses():
    assert REWARDS["math"].score("\\boxed{18}", "#### 18", id="a").status == "ok"
    assert REWARDS["math"].score("no answer", "18", id="a").status == "no_answer"
    assert REWARDS["math"].score("\\boxed{99999!}", "18", id="a").status == "rejected"


def test_answer_keys():
    key = REWARDS["math"].answer_key
    assert key("\\boxed{1,234}") == key("#### 1234.0") == key("the answer is 1234 apples") == "1234"
    assert key("\\boxed{0.5}") == key("\\boxed{\\frac{1}{2}}") == str(Fraction(1, 2))
    assert key("\\boxed{x + 1}") == key("\\boxed{1+x}")
    assert key("\\boxed{2}") != key("\\boxed{3}")
    assert key("no answer", id="r", prompt="p") is None
    assert key("\\boxed{10^{10^{10^{10}}}}") == "10^{10^{10^{10}}}"  # unsafe: its text, unparsed
