"""The reference for the math reward: math-verify itself, with our screening/memo hooks removed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from math_verify import parse, verify
from math_verify import parser as mv_parser

from lit_rlvr.rewards import math as math_reward


@contextmanager
def unhooked_math_verify() -> Iterator[None]:
    """math-verify exactly as installed: its own ``parse_latex_cached``/``parse_expr_cached``."""
    hooks = mv_parser.parse_latex_cached, mv_parser.parse_expr_cached
    mv_parser.parse_latex_cached, mv_parser.parse_expr_cached = math_reward._MV_PARSE_LATEX, math_reward._MV_PARSE_EXPR
    try:
        yield
    finally:
        mv_parser.parse_latex_cached, mv_parser.parse_expr_cached = hooks


def reference_verdict(completion: str, gold: str, **verify_options) -> float:
    """math-verify's own ``verify(parse(gold), parse(completion))`` (gold first), timeouts off.

    The gold is parsed as the reward parses it, wrapped in ``\\boxed{}`` (a bare MATH gold such as
    ``\\left( 3, \\frac{\\pi}{2} \\right)`` has no delimiters for math-verify to find).
    """
    with unhooked_math_verify():
        gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=None)
        pred_parsed = parse(completion, parsing_timeout=None)
        return float(verify(gold_parsed, pred_parsed, timeout_seconds=None, **verify_options))


@pytest.fixture(scope="session")
def math_verify_reference() -> Callable[..., float]:
    """``reference(completion, gold, **verify_options) -> 0.0 | 1.0`` from math-verify alone."""
    return reference_verdict
