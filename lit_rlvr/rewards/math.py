"""Math reward: extract the final answer, check it against the gold with math-verify.

Extraction, in priority order: the last ``\\boxed{…}`` / ``\\fbox{…}`` (nested braces), else the
last ``#### N`` (GSM8K), else the last "the answer is …". Gold formats accepted: a GSM8K answer
field (reasoning then ``#### 1,234``) or its bare number, MATH LaTeX, AIME zero-padded strings
(``"025"``) and AMC floats or float strings (``27.0``, ``"142.0"``).

Equivalence is math-verify's ``verify(gold, pred)`` (gold first — it is asymmetric), with two
departures, both for speed and safety:

- Plain decimal numbers on both sides (the GSM8K/AIME/AMC case) are compared exactly as
  fractions (``"1,234" == "1234.0"``, ``"025" == "25"``) without sympy; two unequal *integers*
  score 0 directly (math-verify would round both to 15 significant digits).
- Predictions are screened before any parsing (:func:`screen_answer`): at most 500 characters,
  nesting depth <= 12, no power towers (an exponent that itself holds a power), no exponent or
  factorial operand with more than 4 digits, numeric exponents multiplying to at most 10^5
  (``((10^{999})^{999})^{999}``), at most one ``!`` and no ``!`` next to a power. These are the inputs whose
  sympy evaluation runs inside one long C call (``10^{10^{10^{10}}}`` builds a 10^10-digit
  integer) that no signal can interrupt. A rejected answer scores 0 with status
  ``rejected`` (the reason says which bound).

Deadline: the parse + verify step runs under :func:`~lit_rlvr.rewards.base.deadline`
(``setitimer``), which interrupts sympy's pure-Python work when called from the main thread —
as the single call ``REWARDS["math"](...)`` usually is, and as each ``BatchScorer`` worker does.
Off the main thread only the screening bounds the work; use the ``BatchScorer`` (which kills a
worker that overruns) for a hard guarantee there. math-verify's own ``signal.alarm`` timeouts
are disabled (``parsing_timeout=None``, ``timeout_seconds=None``) because they fail off the main
thread and only take whole seconds.

Gold parses, prediction parses and (gold, prediction) verdicts are memoised per process, so a
group of G completions pays for its gold once and for each distinct answer once.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify import grader as _mv_grader
from math_verify import parser as _mv_parser

from lit_rlvr.rewards.base import (
    STATUS_ERROR,
    STATUS_NO_ANSWER,
    STATUS_OK,
    STATUS_REJECTED,
    STATUS_TIMEOUT,
    GoldAnswerError,
    RewardTimeout,
    ScoreResult,
    deadline,
    gold_error,
    register_reward,
    sanitize_text,
)

# We enforce our own deadline (module docstring), so math-verify's one-time "timeout disabled"
# warning is noise in every worker; these flags are how math-verify remembers it was shown.
for _module in (_mv_grader, _mv_parser):
    if hasattr(_module, "TIMEOUT_WARNING_SHOWN"):
        _module.TIMEOUT_WARNING_SHOWN = True

MAX_ANSWER_CHARS = 500
MAX_NESTING = 12
MAX_OPERAND_DIGITS = 4
MAX_EXPONENT_PRODUCT = 100_000
DEFAULT_TIMEOUT_S = 5.0

_EXTRACTION = [LatexExtractionConfig(), ExprExtractionConfig()]
_ANSWER_IS = re.compile(r"answer\s+is\s*:?", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_LEADING_NUMBER = re.compile(r"^\\?\$?\s*([+-]?(?:\d[\d,]*)?\.?\d+)(?=\s+[A-Za-z]|\s*$)")
_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?$")
_BRACKETS = re.compile(r"[{}()\[\]]")
_POWER = re.compile(r"\^|\*\*")
_DIGITS = re.compile(r"\d+")
_BARE_LATEX_EXPONENT = re.compile(r"(\\[A-Za-z]+|.?)\s*(\^|\*\*)?", re.DOTALL)  # x^2y: one token
_BARE_PYTHON_EXPONENT = re.compile(r"([\w.]*)\s*(\^|\*\*)?")  # 2**10*3: a literal
_FACTORIAL_OPERAND = re.compile(r"(\d+)\s*\)?\s*!")


def _brace_group(text: str, open_at: int) -> tuple[str, int] | None:
    """``(content, end)`` of the ``{…}`` group opening at ``text[open_at]``; None if unbalanced."""
    depth = 0
    for m in re.compile(r"[{}]").finditer(text, open_at):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return text[open_at + 1 : m.start()], m.end()
    return None


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}``/``\\fbox{…}`` (or ``\\boxed 5``); None if absent/unbalanced."""
    start, command = max((text.rfind(c), c) for c in ("\\boxed", "\\fbox"))
    if start < 0:
        return None
    i = start + len(command)
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        group = _brace_group(text, i)
        return None if group is None else group[0]
    token = re.match(r"[^\s$]+", text[i:])
    return token.group() if token and i > start + len(command) else None


def _after_marker(text: str) -> str | None:
    """The value after the last ``####`` or, failing that, the last "the answer is"."""
    hashes = text.rfind("####")
    if hashes >= 0:
        value = text[hashes + 4 :].split("\n", 1)[0]
    else:
        last = None
        for last in _ANSWER_IS.finditer(text):
            pass
        if last is None:
            return None
        value = _SENTENCE_END.split(text[last.end() :].split("\n", 1)[0], 1)[0]
    value = value.strip().strip("$").strip()
    for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
        if value.startswith(left) and value.endswith(right):
            value = value[len(left) : -len(right)].strip()
    number = _LEADING_NUMBER.match(value)  # "18 dollars" -> "18"
    return number.group(1) if number else value


def extract_answer(completion: str) -> str | None:
    """The final answer written in ``completion``, or None when there is none.

    Args:
        completion: model output text.

    Returns:
        The last ``\\boxed{…}`` content, else the value after the last ``####``, else after the last
        "the answer is"; stripped; None if no marker is present or the value is empty.

    Example:
        >>> extract_answer("so x = \\\\boxed{\\\\frac{1}{2}} and \\\\boxed{\\\\{1, 2\\\\}}")
        '\\\\{1, 2\\\\}'
        >>> extract_answer("She pays 9 * 2 = 18.\\n#### 1,234")
        '1,234'
        >>> extract_answer("Thus the answer is 18 dollars. Done.")
        '18'
        >>> extract_answer("no idea") is None
        True
    """
    completion = sanitize_text(completion)
    answer = _last_boxed(completion)
    if answer is None:
        answer = _after_marker(completion)
    answer = None if answer is None else answer.strip()
    return answer or None


def _as_number(text: str) -> Fraction | None:
    """``text`` as an exact number if it is a plain decimal (``$1{,}234.50``), else None."""
    s = text.strip().strip("$").replace("{,}", ",").replace("\\!", "").replace("\\,", "")
    s = s.removeprefix("\\$").strip().rstrip(".")
    if not s or len(s) > MAX_ANSWER_CHARS or not _NUMBER.match(s) or not any(ch.isdigit() for ch in s):
        return None
    return Fraction(s.replace(",", ""))


def _is_integer_literal(text: str) -> bool:
    return "." not in text.rstrip().rstrip(".")


def screen_answer(answer: str) -> str | None:
    """Why ``answer`` is unsafe to hand to sympy, or None if it is safe (module docstring).

    Example:
        >>> screen_answer("\\\\frac{1}{2}") is None
        True
        >>> screen_answer("10^{10^{10^{10}}}")
        'nested exponent (power tower)'
        >>> screen_answer("99999!")
        'factorial of a number with more than 4 digits'
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return f"answer has {len(answer)} characters (> {MAX_ANSWER_CHARS})"
    depth = max_depth = 0
    for m in _BRACKETS.finditer(answer):
        depth = max(depth + (1 if m.group() in "{([" else -1), 0)
        max_depth = max(max_depth, depth)
    if max_depth > MAX_NESTING:
        return f"nesting depth {max_depth} (> {MAX_NESTING})"
    exponent_product = 1
    for m in _POWER.finditer(answer):
        rest = answer[m.end() :].lstrip()
        if rest.startswith("{"):
            group = _brace_group(rest, 0)
            exponent = group[0] if group else rest
        else:
            token = (_BARE_LATEX_EXPONENT if m.group() == "^" else _BARE_PYTHON_EXPONENT).match(rest)
            if token.group(2):
                return "nested exponent (power tower)"
            exponent = token.group(1)
        if _POWER.search(exponent):
            return "nested exponent (power tower)"
        literals = _DIGITS.findall(exponent)
        if any(len(d) > MAX_OPERAND_DIGITS for d in literals):
            return f"exponent with more than {MAX_OPERAND_DIGITS} digits"
        exponent_product *= max(map(int, literals), default=1)
        if exponent_product > MAX_EXPONENT_PRODUCT:
            return f"product of numeric exponents > {MAX_EXPONENT_PRODUCT}"
    answer = answer.replace("\\!", "")  # LaTeX negative thin space, not a factorial
    if answer.count("!") > 1:
        return "more than one factorial"
    if any(len(d) > MAX_OPERAND_DIGITS for d in _FACTORIAL_OPERAND.findall(answer)):
        return f"factorial of a number with more than {MAX_OPERAND_DIGITS} digits"
    if "!" in answer and _POWER.search(answer):
        return "factorial together with a power"
    return None


@lru_cache(maxsize=16384)
def _parse(answer: str) -> list:
    """math-verify parse of a bare answer (wrapped in ``\\boxed{}``); memoised."""
    return parse("\\boxed{" + answer + "}", extraction_config=_EXTRACTION, parsing_timeout=None)


@lru_cache(maxsize=65536)
def _equivalent(gold: str, pred: str) -> bool:
    """math-verify ``verify(gold, pred)`` on memoised parses (both must parse)."""
    return verify(_parse(gold), _parse(pred), timeout_seconds=None)


def gold_answer(answer: str | int | float, row: dict) -> str:
    """The bare gold answer from any supported gold format; raises :class:`GoldAnswerError`.

    Example:
        >>> gold_answer("18 - 3 = 15\\n#### 1,234", {"id": "g1"})
        '1,234'
        >>> gold_answer(27.0, {"id": "amc1"})
        '27.0'
        >>> gold_answer("  ", {"id": "bad"})
        Traceback (most recent call last):
        ...
        lit_rlvr.rewards.base.GoldAnswerError: row id='bad': empty gold math answer '  '
    """
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise gold_error(row, f"gold math answer must be a str, int or float; got {type(answer).__name__} {answer!r}")
    text = sanitize_text(str(answer))
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    text = text.strip()
    if not text:
        raise gold_error(row, f"empty gold math answer {answer!r}")
    return text


def _judge(gold: str, pred: str, timeout_s: float | None, row: dict) -> ScoreResult:
    """Fast exact-number path, else screened math-verify under a deadline."""
    g_num, p_num = _as_number(gold), _as_number(pred)
    if g_num is not None and p_num is not None:
        if g_num == p_num:
            return ScoreResult(1.0, STATUS_OK)
        if _is_integer_literal(gold) and _is_integer_literal(pred):
            return ScoreResult(0.0, STATUS_OK)
    reason = screen_answer(pred)
    if reason is not None:
        return ScoreResult(0.0, STATUS_REJECTED, reason)
    try:
        with deadline(timeout_s):
            if not _parse(gold):
                raise gold_error(row, f"math-verify cannot parse the gold answer {gold!r}")
            if not _parse(pred):
                return ScoreResult(0.0, STATUS_NO_ANSWER)
            return ScoreResult(float(_equivalent(gold, pred)), STATUS_OK)
    except RewardTimeout:
        return ScoreResult(0.0, STATUS_TIMEOUT)
    except GoldAnswerError:
        raise
    except Exception as e:  # a crash in sympy/latex2sympy on model text: score 0, say why
        return ScoreResult(0.0, STATUS_ERROR, f"{type(e).__name__}: {str(e)[:200]}")


def math_score(
    completion: str, answer: str | int | float, *, timeout_s: float | None = DEFAULT_TIMEOUT_S, **row
) -> ScoreResult:
    """Score a math completion against the gold answer: 1.0 if equivalent, else 0.0.

    Args:
        completion: model output; its final answer is found by :func:`extract_answer`.
        answer: gold answer (GSM8K ``#### N`` field, LaTeX, ``"025"``, ``27.0`` …).
        timeout_s: wall-time budget for parsing + verification (module docstring for where it
            is enforced); None disables it.
        **row: the rest of the prompt row (``id`` is used in errors; other keys are ignored).

    Returns:
        ``ScoreResult`` with status ``ok``, ``no_answer``, ``timeout``, ``rejected`` or ``error``.

    Raises:
        GoldAnswerError: the gold answer is empty, of the wrong type, or unparsable.

    Example:
        >>> math_score("... so \\\\boxed{\\\\dfrac{14}{3}}", "\\\\frac{14}{3}", id="m1")
        ScoreResult(reward=1.0, status='ok')
        >>> math_score("The answer is 19.", "#### 18", id="g1")
        ScoreResult(reward=0.0, status='ok')
        >>> math_score("\\\\boxed{10^{10^{10^{10}}}}", "1", id="x")
        ScoreResult(reward=0.0, status='rejected', reason='nested exponent (power tower)')
        >>> math_score("I give up", "025", id="aime1")
        ScoreResult(reward=0.0, status='no_answer')
    """
    gold = gold_answer(answer, row)
    pred = extract_answer(completion)
    if pred is None:
        return ScoreResult(0.0, STATUS_NO_ANSWER)
    return _judge(gold, pred, timeout_s, row)


def math_answer_key(completion: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S, **row) -> str | None:
    """Canonical final answer of ``completion`` for majority voting, or None if it has none.

    Plain numbers become reduced fractions (``"1,234.0"`` → ``"1234"``, ``"0.5"`` → ``"1/2"``);
    other answers become the string of their math-verify/sympy parse (``\\dfrac{1}{2}`` →
    ``"1/2"``, so the two agree); answers that are unsafe or fail to parse in time fall back to
    the extracted text with whitespace removed. Two completions with equal keys are equivalent;
    equivalent answers in different forms (``x+1`` vs ``1+x`` parse alike, ``\\sqrt{4}`` vs ``2``
    may not) can get different keys.

    Example:
        >>> math_answer_key("\\\\boxed{0.5}"), math_answer_key("\\\\boxed{\\\\dfrac{1}{2}}")
        ('1/2', '1/2')
        >>> math_answer_key("#### 1,234"), math_answer_key("nothing") is None
        ('1234', True)
    """
    pred = extract_answer(completion)
    if pred is None:
        return None
    number = _as_number(pred)
    if number is not None:
        return str(number)
    fallback = "".join(pred.split())
    if screen_answer(pred) is not None:
        return fallback
    try:
        with deadline(timeout_s):
            parsed = _parse(pred)
            return str(parsed[0]) if parsed else fallback
    except RewardTimeout:
        return fallback
    except Exception:  # an unparsable answer still votes, as its text
        return fallback


register_reward("math", answer_key=math_answer_key)(math_score)
