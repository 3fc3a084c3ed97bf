"""Math reward: extraction modes, options, fast paths vs math-verify, screening, deadlines, golds."""

from __future__ import annotations

import random
import signal
import threading
import time
from fractions import Fraction

import pytest
from math_verify import parse, verify
from sympy import Integer, srepr

from lit_rlvr.rewards import REWARDS, GoldAnswerError, ScoreResult
from lit_rlvr.rewards import math as math_reward
from lit_rlvr.rewards.base import RewardTimeout, deadline
from lit_rlvr.rewards.math import _as_number, extract_answer, gold_answer, screen_answer

EXTRACTIONS = ["math_verify", "boxed"]


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
        ("Answer: $9$", None),  # not a marker of the strict extraction
        ("nothing here", None),
        ("\\boxed{}", None),
        ("#### ", None),
        ("", None),
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        ("$9$", "9"),
        ("Answer: 9", "9"),
        ("Answer \\( 9 \\)", "9"),
        ("Final Answer: The largest $n$ is 34.", "34"),
        ("\\boxed{1},\\boxed{2},\\boxed{3}", "\\{1,2,3\\}"),
        ("First \\boxed{5}. Then the final answer is $10,455$", "10,455"),
        ("She pays 9 * 2 = 18 dollars.", "18"),
    ],
)
def test_math_verify_extraction_finds_what_boxed_misses(completion, gold):
    """The issue's false negatives: scored 0 by boxed-only extraction, 1 by math-verify's."""
    assert REWARDS["math"].score(completion, gold, id="x").reward == 1.0
    assert REWARDS["math"].score(completion, gold, id="x", extraction="boxed").reward == 0.0


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


@pytest.mark.parametrize("extraction", EXTRACTIONS)
def test_unparsable_gold_raises_with_row_id(extraction):
    with pytest.raises(ValueError, match="row id='m-3'.*cannot parse"):
        REWARDS["math"]("\\boxed{x}", "}", id="m-3", extraction=extraction)


@pytest.mark.parametrize("extraction", EXTRACTIONS)
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
def test_equivalence(pred, gold, reward, extraction):
    completion = f"... \\boxed{{{pred}}}"
    assert REWARDS["math"](completion, gold, id="t", prompt="p", reward="math", extraction=extraction) == reward


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
def test_number_fast_paths_agree_with_math_verify(seed, math_verify_reference):
    """Reference: math-verify alone (unhooked) on the same boxed numbers; both extractions."""
    rng = random.Random(seed)
    for _ in range(60):
        gold, pred = _random_number(rng), _random_number(rng)
        if rng.random() < 0.3:
            pred = gold.replace(",", "")
        expected = math_verify_reference(f"\\boxed{{{pred}}}", gold)
        for extraction in EXTRACTIONS:
            assert REWARDS["math"](f"\\boxed{{{pred}}}", gold, id="n", extraction=extraction) == expected, (gold, pred)
        assert (_as_number(gold) == _as_number(pred)) == expected


def test_integer_literals_skip_antlr_with_latex2sympys_result():
    """The fast path returns exactly what math-verify's latex2sympy call returns."""
    rng = random.Random(0)
    literals = ["0", "-0", "00", "007", "+5", "-5", "1,234", "12,345,678", "999", "1" * 400]
    literals += [f"{rng.choice(['', '-', '+'])}{rng.randint(0, 10 ** rng.randint(1, 30))}" for _ in range(60)]
    literals += [f"{rng.randint(1, 10**12):,}" for _ in range(30)]
    for literal in literals:
        assert math_reward._INTEGER_LITERAL.fullmatch(literal), literal
        expected = math_reward._MV_PARSE_LATEX.__wrapped__(literal)
        assert srepr(math_reward._latex_to_sympy(literal)) == srepr(expected), literal
    for not_integer in ["1,23", "1.0", "1,2345", "10^{3}", "1\\,234", "1" * 401]:
        assert not math_reward._INTEGER_LITERAL.fullmatch(not_integer), not_integer


def test_integer_verdict_matches_verify():
    rng = random.Random(1)
    values = [Integer(v) for v in (0, 1, 7, 42, -42, 10**20, 10**20 + 1)]
    texts = ["7", " 7 ", "42", "", "x", "1,234"]
    for _ in range(300):
        gold = tuple(rng.sample(values, rng.randint(0, 2)) + rng.sample(texts, rng.randint(0, 2)))
        pred = tuple(rng.sample(values, rng.randint(0, 2)) + rng.sample(texts, rng.randint(0, 2)))
        expected = verify(list(gold), list(pred), timeout_seconds=None)
        assert math_reward._integer_verdict(gold, pred) == expected, (gold, pred)
    assert math_reward._integer_verdict((Integer(1),), (Fraction(1, 2),)) is None


# ----------------------------------------------------------------------------------------------
# options


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"extraction": "latex"}, r"extraction='latex' is not one of \['math_verify', 'boxed'\]"),
        ({"float_rounding": -1}, r"float_rounding=-1 must be an integer >= 0"),
        ({"float_rounding": 2.5}, r"float_rounding=2.5 must be an integer >= 0"),
        ({"numeric_precision": 0}, r"numeric_precision=0 must be an integer >= 1"),
        ({"numeric_precision": True}, r"numeric_precision=True must be an integer >= 1"),
        ({"strict": "yes"}, r"strict='yes' must be true or false"),
        ({"allow_set_relation_comp": 1}, r"allow_set_relation_comp=1 must be true or false"),
    ],
)
def test_bad_options_raise_specific_errors(options, match):
    with pytest.raises(ValueError, match=match):
        REWARDS["math"].score("$1$", "1", id="o", **options)


def test_options_reach_verify(math_verify_reference):
    cases = [
        ("\\boxed{0.333}", "\\frac{1}{3}", {"float_rounding": 3}),
        ("\\boxed{y+1}", "x+1", {"strict": False}),
        ("\\boxed{1 < x < 2}", "(1, 2)", {"allow_set_relation_comp": True}),
    ]
    for completion, gold, options in cases:
        assert REWARDS["math"].score(completion, gold, id="o").reward == math_verify_reference(completion, gold) == 0.0
        assert (
            REWARDS["math"].score(completion, gold, id="o", **options).reward
            == math_verify_reference(completion, gold, **options)
            == 1.0
        )


def test_every_option_is_passed_to_verify(monkeypatch):
    seen = []
    monkeypatch.setattr(math_reward, "verify", lambda gold, pred, **kwargs: seen.append(kwargs) or True)
    options = {"float_rounding": 2, "numeric_precision": 30, "strict": False, "allow_set_relation_comp": True}
    assert REWARDS["math"].score("$\\sqrt{7}$", "\\sqrt{7.0}", id="o", **options).reward == 1.0
    assert seen == [{"timeout_seconds": None, **options}]


# ----------------------------------------------------------------------------------------------
# screening


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("10^{10^{10^{10}}}", "a power with up to 1e+10 digits"),
        ("2**3**4**5", "a power with up to inf digits"),
        ("10^10^10^10", "a power with up to 1e+10 digits"),
        ("10^{1000000000}", "a power with up to 1e+09 digits"),
        ("10^{" + "9" * 400 + "}", "a power with up to inf digits"),
        ("((10^{999})^{999})^{999}", "a power with up to 9.98e+05 digits"),
        ("2^{2^{2^{2^{2^{2}}}}}", "a power"),
        ("x^{12345}", "exponent up to 1.23e+04 on a non-numeric base"),
        ("99999!", "a factorial with up to 4.57e+05 digits"),
        ("(9^{99})!", "a factorial"),
        ("(((3!)!)!)!", "a factorial"),
        ("\\binom{10^{6}}{500000}", "a binomial coefficient"),
        ("10^{99999}\\cdot 10^{99999}", "a product with up to 2e+05 digits"),
        ("x_{10^{10^{10}}}", "a power"),
        ("{" * 13 + "1" + "}" * 13, "nesting depth 13"),
        ("1" * 501, "501 characters"),
    ],
)
def test_screen_rejects_in_milliseconds(answer, reason):
    start = time.perf_counter()
    assert reason in screen_answer(answer)
    assert time.perf_counter() - start < 0.05


FALSE_NEGATIVES = [  # refused by the shape rules of the previous screen; all cheap
    "e^{-x^2}",
    "2^{x^2}",
    "\\frac{10!}{5!}",
    "5!\\cdot 3!",
    "x^{9}+x^{8}+x^{7}+x^{6}+x^{5}+x^{4}+x^{3}+x^{2}+x+1",
    "+".join(f"{i}^{{2}}" for i in range(1, 18)),
    "(3!)!",
    "10!!",
]


@pytest.mark.parametrize(
    "answer",
    [
        *FALSE_NEGATIVES,
        "x^2y^3",
        "2^{10}\\cdot 3^{5}",
        "9^{9999}",
        "10^{12345}",
        "(x+1)^{9999}",
        "5!",
        "11,\\! 111,\\! 100",
        "e^{i\\pi}",
    ]
    + [
        "\\left( 3, \\frac{\\pi}{2} \\right)",
        "\\binom{100}{50}",
        "30^\\circ",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
    ],
)
def test_screen_accepts(answer):
    assert screen_answer(answer) is None


@pytest.mark.parametrize("extraction", EXTRACTIONS)
@pytest.mark.parametrize("answer", FALSE_NEGATIVES)
def test_former_false_negatives_score_one_against_themselves(answer, extraction):
    result = REWARDS["math"].score(f"so the answer is $\\boxed{{{answer}}}$.", answer, id="fn", extraction=extraction)
    assert result == ScoreResult(1.0, "ok"), result


ADVERSARIAL = {
    "nested_braces": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
    "nested_fracs": "\\boxed{" + "\\frac{1}{" * 12 + "2" + "}" * 12 + "}",
    "power_tower": "\\boxed{10^{10^{10^{10}}}}",
    "python_tower": "the answer is 10**10**10**10",
    "bare_tower": "\\boxed{10^10^10^10}",
    "huge_factorial": "\\boxed{(10^{5})!}",
    "big_string": "x" * 100_000 + " \\boxed{" + "9" * 100_000 + "}",
    "surrogates": "\\boxed{\ud800\udfff 1}",
    "unbalanced_left": "\\boxed{\\left( 1, 2 + \\left[ 3}",
    "long_sum": "\\boxed{\\sum_{n=1}^{9999} n^{99}}",
    "tower_in_dollars": "so $10^{10^{10^{10}}}$",
    "binomial_power": "\\boxed{(x+1)^{9999}}",  # pure-Python expansion: only the deadline stops it
    "deep_parens": "$" + "(" * 12 + "1" + ")" * 12 + "$",
}
# math-verify's regexes are quadratic on these; one search is a C call that only a signal
# interrupts, so they are bounded in the main thread (and in BatchScorer workers) only.
MAIN_THREAD_ONLY = {
    "spaced_digits": "1 " * 50_000,
    "numbers_list": " ".join(str(i) for i in range(5000)),
    "operators_without_end": "1+" * 5000 + "x",
    "unclosed_brackets": "\\[ a " * 5000,
    "many_boxes": "\\boxed{" * 20_000,
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extraction", EXTRACTIONS)
@pytest.mark.parametrize(
    ("name", "where"),
    [(name, where) for name in sorted(ADVERSARIAL) for where in ("main", "thread")]
    + [(name, "main") for name in sorted(MAIN_THREAD_ONLY)],
)
def test_adversarial_inputs_score_zero_within_deadline(name, where, extraction):
    completion, out = {**ADVERSARIAL, **MAIN_THREAD_ONLY}[name], {}

    def run():
        start = time.perf_counter()
        out["result"] = REWARDS["math"].score(completion, "7", id="adv", timeout_s=1.0, extraction=extraction)
        out["elapsed"] = time.perf_counter() - start

    if where == "main":
        run()
    else:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join(10)
        assert not worker.is_alive()
    assert out["result"].reward == 0.0
    # the deadline is 1 s; the slack is for a loaded CI machine, a hang would take minutes
    assert out["elapsed"] < 4.0, out


# ----------------------------------------------------------------------------------------------
# deadline


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_deadline_interrupts_python_loop_in_main_thread():
    start = time.perf_counter()
    with pytest.raises(RewardTimeout), deadline(0.2) as armed:
        assert armed
        _spin(5.0)
    assert time.perf_counter() - start < 1.0
    time.sleep(0.15)  # the re-firing timer is disarmed: no stray SIGALRM


def test_deadline_is_enforced_off_main_thread():
    out = {}

    def run():
        start = time.perf_counter()
        try:
            with deadline(0.2) as armed:
                out["armed"] = armed
                _spin(5.0)
        except RewardTimeout:
            out["raised_after"] = time.perf_counter() - start
        _spin(0.3)  # nothing fires once the block has exited
        out["clean_exit"] = True
        with deadline(1.0):
            out["fast_block"] = sum(range(1000))
        _spin(1.2)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(10)
    assert out == {"armed": True, "raised_after": pytest.approx(0.2, abs=0.3), "clean_exit": True, "fast_block": 499500}


def test_deadline_shares_the_interval_timer():
    """A timer armed by someone else (pytest-timeout's) is suspended, then re-armed: not lost."""
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(time.perf_counter()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        with pytest.raises(RewardTimeout), deadline(0.2) as armed:
            assert armed
            _spin(5.0)
        assert 25.0 < signal.getitimer(signal.ITIMER_REAL)[0] < 30.0
        signal.setitimer(signal.ITIMER_REAL, 0.1)  # falls due inside the next block
        with deadline(1.0):
            _spin(0.3)
            assert fired == []
        time.sleep(0.05)
        assert len(fired) == 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)


def test_deadline_disabled():
    for timeout_s in (None, 0):
        with deadline(timeout_s) as armed:
            assert armed is False


# ----------------------------------------------------------------------------------------------
# statuses and answer keys


def test_scorer_statuses():
    assert REWARDS["math"].score("\\boxed{18}", "#### 18", id="a").status == "ok"
    assert REWARDS["math"].score("no answer", "18", id="a").status == "no_answer"
    assert REWARDS["math"].score("\\boxed{99999!}", "18", id="a").status == "rejected"
    assert REWARDS["math"].score("Answer: 99999!", "18", id="a", extraction="boxed").status == "no_answer"


def test_gold_is_parsed_once_per_process():
    math_reward._parse_gold.cache_clear()
    for i in range(5):
        REWARDS["math"].score(f"\\boxed{{\\frac{{{i}}}{{7}}}}", "\\frac{3}{7}", id="g")
    info = math_reward._parse_gold.cache_info()
    assert (info.misses, info.hits) == (1, 9)  # checked, then used by the verdict


def test_answer_keys():
    key = REWARDS["math"].answer_key
    assert key("\\boxed{1,234}") == key("#### 1234.0") == key("the answer is 1234 apples") == "1234"
    assert key("\\boxed{0.5}") == key("\\boxed{\\frac{1}{2}}") == key("Answer: $\\dfrac{1}{2}$") == str(Fraction(1, 2))
    assert key("\\boxed{x + 1}") == key("\\boxed{1+x}")
    assert key("\\boxed{2}") != key("\\boxed{3}")
    assert key("no answer", id="r", prompt="p") is None
    assert key("\\boxed{10^{10^{10^{10}}}}") == "10^{10^{10^{10}}}"  # unsafe: its text, unparsed


def test_answer_key_extracts_like_the_reward():
    key = REWARDS["math"].answer_key
    assert key("Final Answer: The largest $n$ is 34.") == "34"
    assert key("Final Answer: The largest $n$ is 34.", extraction="boxed") is None
    assert key("\\boxed{1},\\boxed{2},\\boxed{3}") == key("$\\{3, 2, 1\\}$")
    assert key("\\boxed{1},\\boxed{2},\\boxed{3}", extraction="boxed") == "3"
    with pytest.raises(ValueError, match="extraction='last' is not one of"):
        key("$1$", extraction="last")


def test_parse_is_unchanged_outside_scoring(math_verify_reference):
    """The hooks installed in math-verify screen only while the reward parses a completion."""
    assert math_verify_reference("$10^{10^{2}}$", "10^{100}") == 1.0
    assert str(parse("$10^{10^{10^{10}}}$", parsing_timeout=None)[0]) == "10**(10**(10**10))"
    assert parse("$1,234$", parsing_timeout=None) == [Integer(1234), "1,234"]
