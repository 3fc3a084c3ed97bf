"""Math reward: math-verify's answer extraction and equivalence, with bounded cost.

Extraction (option ``extraction``):

- ``"math_verify"`` (default): math-verify's own ``parse`` of the whole completion with its
  default LaTeX and expression extraction configs — ``\\boxed{}``, "final answer is",
  ``Answer: 9``, ``$9$``, ``\\( 9 \\)``, plain numbers, several boxes joined into a set — exactly
  as ``parse(completion)`` does. TRL's ``accuracy_reward`` calls the same function with a
  stricter config (LaTeX only, no anchor-free matches, first match); we keep the defaults so that
  the reward agrees with math-verify's own ``parse`` + ``verify`` (measured in
  ``tests/rewards/test_math_agreement.py``).
- ``"boxed"``: only an explicit final answer counts — the last ``\\boxed{…}``/``\\fbox{…}``, else the
  last ``#### N`` (GSM8K), else the last "the answer is …" (:func:`extract_answer`) — for recipes
  that reward the answer format too. The extracted answer is screened (below) before
  math-verify parses it.

Gold formats accepted: a GSM8K answer field (reasoning then ``#### 1,234``) or its bare number,
MATH LaTeX, AIME zero-padded strings (``"025"``) and AMC floats (``27.0``, ``"142.0"``); the gold
is parsed as ``parse("\\boxed{" + gold + "}")``, once per process.

Equivalence is math-verify's ``verify(gold, pred)`` (gold first — it is asymmetric), with its
options ``float_rounding``, ``numeric_precision``, ``strict`` and ``allow_set_relation_comp``
exposed as keyword options of :func:`math_score` (math-verify's defaults). Departures, all for
speed or safety:

- Integer literals (``42``, ``-7``, ``1,234``) handed to latex2sympy become ``Integer`` directly
  (what latex2sympy returns, without its ANTLR parse), and two parses made only of integers and
  strings are compared as ``verify`` would compare them, without sympy.
- In ``"boxed"`` mode, plain decimal numbers on both sides are compared exactly as fractions
  (``"1,234" == "1234.0"``, ``"025" == "25"``) before math-verify is asked.
- Every string math-verify is about to hand to latex2sympy or ``parse_expr`` for a completion is
  first screened (:func:`screen_answer`): it is refused when evaluating it could build an integer
  of more than ``MAX_DIGITS`` digits (a power, factorial or binomial coefficient, with sizes
  estimated from the operands' digits, so nesting that compounds is caught:
  ``((10^{999})^{999})^{999}``, ``10^{10^{10^{10}}}``), raise a non-numeric base to an exponent
  above ``MAX_SYMBOLIC_EXPONENT`` (expanded term by term), or when it is longer than
  ``MAX_ANSWER_CHARS`` or nested deeper than ``MAX_NESTING`` (latex2sympy's parser slows down
  steeply with nesting). Those big-integer operations run inside single C calls that no signal
  can interrupt. A refused completion scores 0 with status ``rejected`` and the reason.
  math-verify itself would hang on these; golds are not screened.

Deadline: parsing and verification run under :func:`~lit_rlvr.rewards.base.deadline`, which
interrupts pure-Python work (sympy, latex2sympy) in any thread; a single long C call finishes
first, which is what the screen bounds, and the ``BatchScorer`` kills a worker that overruns
anyway. Scanning a completion with math-verify's regexes is not screened: it takes ~1 ms per
1,000 characters of ordinary text but is quadratic on some degenerate text (a long list of
numbers separated by spaces, ``1+1+…+1x``, many unclosed ``\\[`` or ``\\boxed{``: seconds for
16,000 such characters). One regex search is a C call that checks for signals, so the deadline bounds it in
the main thread (and in ``BatchScorer`` workers) but not in other threads. math-verify's own ``signal.alarm`` timeouts are disabled
(``parsing_timeout=None``, ``timeout_seconds=None``): they fail off the main thread and only take
whole seconds.

Memoised per process: gold parses (4,096), latex2sympy results (16,384), completion parses and
verdicts (2,048 each, keyed by the whole completion), so a group of G completions pays for its
gold once and for each distinct answer once.
"""

from __future__ import annotations

import math
import re
from contextvars import ContextVar
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify import grader as _mv_grader
from math_verify import parser as _mv_parser
from sympy import Basic, Integer, Number

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
MAX_DIGITS = 100_000  # an integer this long takes ~4 ms to build; 10x longer, ~0.2 s per operation
MAX_SYMBOLIC_EXPONENT = 10_000
DEFAULT_TIMEOUT_S = 5.0
EXTRACTIONS = ("math_verify", "boxed")

_EXTRACTION = [LatexExtractionConfig(), ExprExtractionConfig()]  # math-verify's parse defaults
_ANSWER_IS = re.compile(r"answer\s+is\s*:?", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_LEADING_NUMBER = re.compile(r"^\\?\$?\s*([+-]?(?:\d[\d,]*)?\.?\d+)(?=\s+[A-Za-z]|\s*$)")
_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?$")
_INTEGER_LITERAL = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d{1,400})")
_BRACKETS = re.compile(r"[{}()\[\]]")


# ----------------------------------------------------------------------------------------------
# "boxed" extraction


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
    """The explicitly marked final answer in ``completion`` (``extraction="boxed"``), or None.

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
        >>> extract_answer("The answer: $9$") is None
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


# ----------------------------------------------------------------------------------------------
# Screening: bound what evaluating an answer can cost


class _Cost(NamedTuple):
    """Upper bounds for one subexpression: ``digits`` of the largest integer evaluating it may
    build (its value if ``numeric``, else its largest coefficient), and whether it is a number."""

    digits: float
    numeric: bool


class _Refused(Exception):
    """The answer is too costly to evaluate; ``args[0]`` says why."""


_TOKEN = re.compile(
    r"(?P<num>\d+(?:\.\d+)?|\.\d+)|(?P<pow>\*\*|\^)|(?P<cmd>\\[A-Za-z]+|\\.)|(?P<open>[{(\[])|(?P<close>[})\]])"
    r"|(?P<name>[A-Za-z])|(?P<space>\s+)|(?P<other>.)",
    re.DOTALL,
)
_FRACTIONS = {"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"}
_BINOMIALS = {"\\binom", "\\dbinom", "\\tbinom"}
_WRAPPERS = set(r"\text \textbf \textit \textrm \mathrm \mathbf \mathit \mbox \operatorname \mathbb \boxed".split())
_PRODUCT_OPS = set(r"* / \cdot \times \div \ast".split())
_SUM_OPS = set(r"+ - \pm \mp".split())
_SKIPPED = set(r"\left \right \big \Big \bigl \bigr \Bigl \Bigr \middle \, \; \: \! \quad \qquad ' ~".split()) | {"\\ "}
_SEPARATORS = set(  # relations, set operations, punctuation and matrix separators: no arithmetic
    r", ; = < > | & : . \\ \le \ge \leq \geq \ne \neq \lt \gt \approx \equiv \sim \cup \cap \setminus"
    r" \to \in \notin \subset \subseteq \land \lor \{ \} \langle \rangle \mid".split()
)
_ENDS_PRODUCT = _SUM_OPS | _SEPARATORS
_LOG10_2 = math.log10(2)


def _literal_digits(digits: str) -> float:
    """log10 of the integer spelled by ``digits`` (decimal point ignored): its size in digits."""
    d = digits.replace(".", "").lstrip("0")
    if not d:
        return 0.0
    head = d[:15]
    return math.log10(int(head)) + len(d) - len(head)


def _bound(digits: float) -> float:
    """Largest magnitude a number of ``digits`` digits can have (inf past float range)."""
    return 10.0**digits if digits < 300 else math.inf


class _Screen:
    """One pass of precedence climbing over ``answer``'s tokens, computing :class:`_Cost` bottom
    up and raising :class:`_Refused` at the first subexpression over a limit (linear time).

    Grammar (LaTeX and Python syntax alike, never failing on odd input)::

        expr    := product ((sum op | separator) product)*
        product := unary ((product op)? unary)*          # juxtaposition multiplies
        unary   := sign* postfix (power sign* postfix)*  # right-associative: a^(b^c)
        postfix := primary ('!' | '_' primary)*
        primary := number | letter | group | command with its arguments
    """

    def __init__(self, answer: str):
        self.tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(answer) if m.lastgroup != "space"]
        self.tokens = [(kind, text) for kind, text in self.tokens if text not in _SKIPPED]
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "")

    def take(self) -> tuple[str, str]:
        token = self.peek()
        self.i += 1
        return token

    def run(self) -> None:
        while self.peek()[0] != "end":
            self.expr()
            self.take()  # a stray closing bracket

    def expr(self) -> _Cost:
        cost = self.product()
        while (token := self.peek())[0] not in ("end", "close"):
            self.take()  # a sum operator or a separator: the only tokens a product stops at
            right = self.product()
            if token[1] in _SUM_OPS:
                cost = _Cost(max(cost.digits, right.digits) + _LOG10_2, cost.numeric and right.numeric)
            else:
                cost = _Cost(max(cost.digits, right.digits), False)
        return cost

    def product(self) -> _Cost:
        cost = self.unary()
        while (token := self.peek())[0] not in ("end", "close") and token[1] not in _ENDS_PRODUCT:
            if token[1] in _PRODUCT_OPS:
                self.take()
            right = self.unary()
            cost = _product(cost, right)
        return cost

    def unary(self) -> _Cost:
        operands = [self.signed_postfix()]
        while self.peek()[0] == "pow":
            self.take()
            operands.append(self.signed_postfix())
        cost = operands.pop()
        while operands:
            cost = _power(operands.pop(), cost)
        return cost

    def signed_postfix(self) -> _Cost:
        while self.peek()[1] in _SUM_OPS:
            self.take()
        cost = self.primary()
        while self.peek()[1] in ("!", "_"):
            if self.take()[1] == "!":
                if self.peek()[1] == "!":
                    self.take()  # a double factorial n!! is at most n!
                cost = _factorial(cost)
            else:
                self.primary()  # a subscript is part of a name, but is screened all the same
        return cost

    def primary(self) -> _Cost:
        if self.peek()[0] in ("end", "close"):
            return _Cost(0.0, False)  # an empty operand: "()", "x^", "\\frac{1}"
        kind, text = self.take()
        if kind == "num":
            return _Cost(_literal_digits(text), True)
        if kind == "open":
            cost = self.expr()
            self.take()
            return cost
        if text in _FRACTIONS or text in _BINOMIALS:
            top, bottom = self.primary(), self.primary()
            if text in _BINOMIALS:
                return _binomial(top, bottom)
            return _product(top, bottom)
        if text == "\\sqrt":
            if self.peek()[1] == "[":
                self.primary()
            return self.primary()
        if text in _WRAPPERS:
            return _Cost(self.primary().digits, False)
        return _Cost(0.0, False)  # a letter, constant, function name, unit or stray symbol


def _product(left: _Cost, right: _Cost) -> _Cost:
    """Cost of ``left * right`` (or a fraction): the digits add."""
    digits = left.digits + right.digits
    if digits > MAX_DIGITS:
        raise _Refused(f"a product with up to {digits:.3g} digits (> {MAX_DIGITS})")
    return _Cost(digits, left.numeric and right.numeric)


def _power(base: _Cost, exponent: _Cost) -> _Cost:
    """Cost of ``base ** exponent``: ``|exponent| <= 10^digits``, the result has ``digits * |e|``."""
    e = _bound(exponent.digits)
    if not base.numeric and e > MAX_SYMBOLIC_EXPONENT:
        raise _Refused(f"exponent up to {e:.3g} on a non-numeric base (> {MAX_SYMBOLIC_EXPONENT})")
    digits = base.digits * e if base.digits > 0 else 0.0
    if digits > MAX_DIGITS:
        raise _Refused(f"a power with up to {digits:.3g} digits (> {MAX_DIGITS})")
    return _Cost(digits, base.numeric and exponent.numeric)


def _factorial(operand: _Cost) -> _Cost:
    """Cost of ``n!`` for ``n <= 10^digits``: ``log10(n!)`` digits."""
    if not operand.numeric:
        return operand
    digits = math.lgamma(_bound(operand.digits) + 1) / math.log(10)
    if digits > MAX_DIGITS:
        raise _Refused(f"a factorial with up to {digits:.3g} digits (> {MAX_DIGITS})")
    return _Cost(digits, True)


def _binomial(n: _Cost, k: _Cost) -> _Cost:
    """Cost of ``C(n, k) <= min(n^k, 2^n)``."""
    if not (n.numeric and k.numeric):
        return _Cost(max(n.digits, k.digits), False)
    digits = min(_bound(k.digits) * n.digits, _bound(n.digits) * _LOG10_2)
    if digits > MAX_DIGITS:
        raise _Refused(f"a binomial coefficient with up to {digits:.3g} digits (> {MAX_DIGITS})")
    return _Cost(digits, True)


def screen_answer(answer: str) -> str | None:
    """Why evaluating ``answer`` (LaTeX or Python syntax) could cost too much, or None if it is
    cheap (module docstring): sizes are estimated from operands' digits, not from the shape.

    Example:
        >>> screen_answer("e^{-x^2}") is None, screen_answer("\\\\frac{10!}{5!}") is None
        (True, True)
        >>> screen_answer("10^{10^{10^{10}}}")
        'a power with up to 1e+10 digits (> 100000)'
        >>> screen_answer("((10^{999})^{999})^{999}")
        'a power with up to 9.98e+05 digits (> 100000)'
        >>> screen_answer("99999!")
        'a factorial with up to 4.57e+05 digits (> 100000)'
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return f"answer has {len(answer)} characters (> {MAX_ANSWER_CHARS})"
    depth = max_depth = 0
    for m in _BRACKETS.finditer(answer):
        depth = max(depth + (1 if m.group() in "{([" else -1), 0)
        max_depth = max(max_depth, depth)
    if max_depth > MAX_NESTING:
        return f"nesting depth {max_depth} (> {MAX_NESTING})"
    try:
        _Screen(answer).run()
    except _Refused as e:
        return e.args[0]
    except RecursionError:
        return "expression nested too deeply to screen"
    return None


# ----------------------------------------------------------------------------------------------
# math-verify, screened and memoised
#
# math-verify's extraction calls ``parser.parse_latex_cached(latex)`` / ``parse_expr_cached(expr)``
# (module globals, looked up at call time) on each candidate answer, after normalising it. We
# replace both with wrappers that (a) screen the string when ``_SCREENING`` is set — only while
# we parse a completion — and (b) memoise with a larger cache and skip the ANTLR parse of integer
# literals. With ``_SCREENING`` unset they return what math-verify's own functions return.


class _AnswerRejected(BaseException):
    """Raised through math-verify's ``except Exception`` when a candidate fails the screen."""

    def __init__(self, reason: str, text: str):
        super().__init__(reason)
        self.reason, self.text = reason, text


_SCREENING: ContextVar[bool] = ContextVar("lit_rlvr_math_screening", default=False)
_MV_PARSE_LATEX = _mv_parser.parse_latex_cached
_MV_PARSE_EXPR = _mv_parser.parse_expr_cached


def _screen_candidate(text: str) -> None:
    if _SCREENING.get() and (reason := screen_answer(text)) is not None:
        raise _AnswerRejected(reason, text)


@lru_cache(maxsize=16384)
def _latex_to_sympy(latex: str):
    """latex2sympy as math-verify calls it, memoised; integer literals without the ANTLR parse."""
    if _INTEGER_LITERAL.fullmatch(latex):
        return Integer(int(latex.replace(",", "")))
    return _MV_PARSE_LATEX.__wrapped__(latex)


def _screened_parse_latex(latex: str):
    _screen_candidate(latex)
    return _latex_to_sympy(latex)


def _screened_parse_expr(expr: str):
    _screen_candidate(expr)
    return _MV_PARSE_EXPR(expr)


_mv_parser.parse_latex_cached = _screened_parse_latex
_mv_parser.parse_expr_cached = _screened_parse_expr


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    """math-verify parse of a bare gold answer (wrapped in ``\\boxed{}``, not screened); memoised."""
    return tuple(parse("\\boxed{" + gold + "}", extraction_config=_EXTRACTION, parsing_timeout=None))


@lru_cache(maxsize=2048)
def _parse_prediction(text: str, extraction: str) -> tuple:
    """Screened math-verify parse of a whole completion (``math_verify``) or of an extracted
    answer (``boxed``, wrapped in ``\\boxed{}``); raises :class:`_AnswerRejected`; memoised."""
    if extraction == "boxed":
        text = "\\boxed{" + text + "}"
    token = _SCREENING.set(True)
    try:
        return tuple(parse(text, extraction_config=_EXTRACTION, parsing_timeout=None))
    finally:
        _SCREENING.reset(token)


def _integer_verdict(gold: tuple, pred: tuple) -> bool | None:
    """``verify``'s verdict when both parses hold only integers and strings (None otherwise):
    integers compare by value, strings stripped and non-empty, an integer never equals a string."""
    if not all(isinstance(x, (Integer, str)) for x in gold + pred):
        return None
    return any(
        (g == p) if isinstance(g, Integer) else (g.strip() != "" and g.strip() == p.strip())
        for g in gold
        for p in pred
        if isinstance(g, Integer) == isinstance(p, Integer)
    )


@lru_cache(maxsize=2048)
def _verdict(gold: str, text: str, extraction: str, options: tuple) -> bool:
    """math-verify ``verify(gold, pred, **options)`` on memoised parses (both must parse)."""
    gold_parsed, pred_parsed = _parse_gold(gold), _parse_prediction(text, extraction)
    fast = _integer_verdict(gold_parsed, pred_parsed)
    if fast is not None:
        return fast
    return verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None, **dict(options))


# ----------------------------------------------------------------------------------------------
# Options, gold, reward, answer key


def _check_options(extraction, float_rounding, numeric_precision, strict, allow_set_relation_comp) -> tuple:
    """Validate the keyword options of :func:`math_score`; return verify's as a hashable tuple."""
    if extraction not in EXTRACTIONS:
        raise ValueError(f"math reward option extraction={extraction!r} is not one of {list(EXTRACTIONS)}")
    for name, value, least in (("float_rounding", float_rounding, 0), ("numeric_precision", numeric_precision, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"math reward option {name}={value!r} must be an integer >= {least}")
    for name, value in (("strict", strict), ("allow_set_relation_comp", allow_set_relation_comp)):
        if not isinstance(value, bool):
            raise ValueError(f"math reward option {name}={value!r} must be true or false")
    return (
        ("float_rounding", float_rounding),
        ("numeric_precision", numeric_precision),
        ("strict", strict),
        ("allow_set_relation_comp", allow_set_relation_comp),
    )


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


def check_math_gold(answer: str | int | float, *, timeout_s: float | None = DEFAULT_TIMEOUT_S, **row) -> None:
    """Raise :class:`GoldAnswerError` unless ``answer`` is a usable gold: a supported format that
    math-verify parses within ``timeout_s`` (run once per row at start-up, in the reward workers).

    Example:
        >>> check_math_gold("\\\\frac{1}{2}", id="m1")
        >>> check_math_gold("\\\\boxed{}", id="m2")
        Traceback (most recent call last):
        ...
        lit_rlvr.rewards.base.GoldAnswerError: row id='m2': math-verify cannot parse the gold answer '\\\\boxed{}'
    """
    gold = gold_answer(answer, row)
    try:
        with deadline(timeout_s):
            parsed = _parse_gold(gold)
    except RewardTimeout:
        raise gold_error(row, f"parsing the gold answer {gold!r} took longer than {timeout_s} s") from None
    except Exception as e:  # latex2sympy / sympy failing on the gold itself
        raise gold_error(
            row, f"math-verify fails on the gold answer {gold!r}: {type(e).__name__}: {str(e)[:200]}"
        ) from e
    if not parsed:
        raise gold_error(row, f"math-verify cannot parse the gold answer {gold!r}")


def _judge(gold: str, text: str, extraction: str, options: tuple, timeout_s: float | None, row: dict) -> ScoreResult:
    """Screened, memoised math-verify parse + verify of ``text`` against ``gold`` under a deadline."""
    try:
        with deadline(timeout_s):
            if not _parse_gold(gold):
                raise gold_error(row, f"math-verify cannot parse the gold answer {gold!r}")
            if not _parse_prediction(text, extraction):
                return ScoreResult(0.0, STATUS_NO_ANSWER)
            return ScoreResult(float(_verdict(gold, text, extraction, options)), STATUS_OK)
    except _AnswerRejected as e:
        return ScoreResult(0.0, STATUS_REJECTED, e.reason)
    except RewardTimeout:
        return ScoreResult(0.0, STATUS_TIMEOUT)
    except GoldAnswerError:
        raise
    except Exception as e:  # a crash in sympy/latex2sympy on model text: score 0, say why
        return ScoreResult(0.0, STATUS_ERROR, f"{type(e).__name__}: {str(e)[:200]}")


def math_score(
    completion: str,
    answer: str | int | float,
    *,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    extraction: str = "math_verify",
    float_rounding: int = 6,
    numeric_precision: int = 15,
    strict: bool = True,
    allow_set_relation_comp: bool = False,
    **row,
) -> ScoreResult:
    """Score a math completion against the gold answer: 1.0 if equivalent, else 0.0.

    Args:
        completion: model output.
        answer: gold answer (GSM8K ``#### N`` field, LaTeX, ``"025"``, ``27.0`` …).
        timeout_s: wall-time budget for parsing + verification; None disables it.
        extraction: ``"math_verify"`` (math-verify's ``parse`` of the whole completion) or
            ``"boxed"`` (only ``\\boxed{}`` / ``####`` / "the answer is"; :func:`extract_answer`).
        float_rounding: decimal places floats are rounded to (math-verify ``verify``).
        numeric_precision: significant digits of numeric comparisons (``verify``).
        strict: variables matter and sets differ from tuples (``verify``).
        allow_set_relation_comp: a relation may equal a set, ``1 < x < 2`` vs ``(1, 2)``.
        **row: the rest of the prompt row (``id`` is used in errors; other keys are ignored).

    Returns:
        ``ScoreResult`` with status ``ok``, ``no_answer``, ``timeout``, ``rejected`` or ``error``.

    Raises:
        ValueError: an option is invalid (checked first, so a call with a dummy completion
            validates options).
        GoldAnswerError: the gold answer is empty, of the wrong type, or unparsable.

    Example:
        >>> math_score("So the largest $n$ is $34$.", "34", id="m1")
        ScoreResult(reward=1.0, status='ok')
        >>> math_score("So the largest $n$ is $34$.", "34", id="m1", extraction="boxed")
        ScoreResult(reward=0.0, status='no_answer')
        >>> math_score("... so \\\\boxed{\\\\dfrac{14}{3}}", "\\\\frac{14}{3}", id="m2")
        ScoreResult(reward=1.0, status='ok')
        >>> math_score("\\\\boxed{10^{10^{10^{10}}}}", "1", id="x")
        ScoreResult(reward=0.0, status='rejected', reason='a power with up to 1e+10 digits (> 100000)')
        >>> math_score("I give up", "025", id="aime1")
        ScoreResult(reward=0.0, status='no_answer')
        >>> math_score("$1$", "1", extraction="latex")
        Traceback (most recent call last):
        ...
        ValueError: math reward option extraction='latex' is not one of ['math_verify', 'boxed']
    """
    options = _check_options(extraction, float_rounding, numeric_precision, strict, allow_set_relation_comp)
    gold = gold_answer(answer, row)
    completion = sanitize_text(completion)
    if extraction == "math_verify":
        return _judge(gold, completion, extraction, options, timeout_s, row)
    pred = extract_answer(completion)
    if pred is None:
        return ScoreResult(0.0, STATUS_NO_ANSWER)
    g_num, p_num = _as_number(gold), _as_number(pred)
    if g_num is not None and p_num is not None:
        if g_num == p_num:
            return ScoreResult(1.0, STATUS_OK)
        if _is_integer_literal(gold) and _is_integer_literal(pred):
            return ScoreResult(0.0, STATUS_OK)
    if (reason := screen_answer(pred)) is not None:  # before math-verify's normalisation pays for it
        return ScoreResult(0.0, STATUS_REJECTED, reason)
    return _judge(gold, pred, extraction, options, timeout_s, row)


def _key_of(value) -> str:
    """Canonical text of one parsed answer: numbers as reduced fractions, else sympy's string."""
    if isinstance(value, Number) and value.is_finite:
        return str(Fraction(str(value)))
    return str(value) if isinstance(value, Basic) else "".join(str(value).split())


def math_answer_key(
    completion: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S, extraction: str = "math_verify", **row
) -> str | None:
    """Canonical final answer of ``completion`` for majority voting, or None if it has none.

    The answer is extracted as :func:`math_score` extracts it (same ``extraction``). Numbers
    become reduced fractions (``1,234.0`` → ``"1234"``, ``0.5`` → ``"1/2"``); other answers become
    the string of their math-verify/sympy parse (``\\dfrac{1}{2}`` → ``"1/2"``); answers refused by
    the screen, unparsable or out of time fall back to their text with whitespace removed. Two
    completions with equal keys are equivalent; equivalent answers in different forms (``x+1``
    vs ``1+x`` parse alike, ``\\sqrt{4}`` vs ``2`` may not) can get different keys.

    Example:
        >>> math_answer_key("\\\\boxed{0.5}"), math_answer_key("so it is $\\\\dfrac{1}{2}$")
        ('1/2', '1/2')
        >>> math_answer_key("#### 1,234"), math_answer_key("nothing") is None
        ('1234', True)
    """
    if extraction not in EXTRACTIONS:
        raise ValueError(f"math answer key option extraction={extraction!r} is not one of {list(EXTRACTIONS)}")
    completion = sanitize_text(completion)
    text = completion if extraction == "math_verify" else extract_answer(completion)
    if text is None:
        return None
    if extraction == "boxed" and (number := _as_number(text)) is not None:
        return str(number)
    if extraction == "boxed" and screen_answer(text) is not None:
        return "".join(text.split())
    try:
        with deadline(timeout_s):
            parsed = _parse_prediction(text, extraction)
            return _key_of(parsed[0]) if parsed else None
    except _AnswerRejected as e:
        return "".join(e.text.split())
    except RewardTimeout:
        return "".join(text.split())
    except Exception:  # an unparsable answer still votes, as its text
        return "".join(text.split())


register_reward(
    "math", answer_key=math_answer_key, check_gold=check_math_gold, check=_check_options, values=(0.0, 1.0)
)(math_score)
