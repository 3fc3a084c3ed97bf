"""The multi-turn countdown checker: the model may check an expression before it commits to one.

A turn is an expression ending with ``?`` (check it) or ``;`` (the answer). The checker answers a
check with what the expression evaluates to (``=38``), adding `` bad digits`` when it does not use
the row's three digits once each, or ``=?`` when it is not a ``d op d op d`` expression; the answer
ends the episode and is scored by the ``countdown`` reward. A trajectory reads, in characters::

    C375=026:3+7*4?=31 bad digits\\n3*7+5?=26\\n3*7+5;
    |prompt  |model ||environment      ||model||env||model|

Cheap enough for the CPU demo, and diverse: a target has several valid expressions, and a policy
may check none, one or several before answering, which is the tool-use behaviour whose collapse
the agents study measures (docs/agents.md).

A tiny model has to learn the protocol before RL can shape how it uses it (the issue's "small models
need a warm start"): :func:`checker_trajectory` draws the synthetic tool-using trajectories of the
demo's supervised warm start (``lit-rlvr warmstart`` with ``checker_share``), the checker's answers
made by the checker itself.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from lit_rlvr.demo.countdown import OPS, check_countdown_gold, countdown_prompt, countdown_reward, evaluate, solutions
from lit_rlvr.envs import EnvironmentBase, Step, register_environment

CHECKS = (0, 1, 2)  # how many checks a warm-start trajectory makes before it answers ...
CHECK_WEIGHTS = (0.4, 0.4, 0.2)  # ... with these probabilities: every behaviour is there to keep or lose

CHECK, ANSWER = "?", ";"


@register_environment("countdown", scores=True)
class CountdownChecker(EnvironmentBase):
    """One countdown episode (module docstring); the row needs ``digits`` and ``answer`` (the target).

    Example:
        >>> env = CountdownChecker()
        >>> env.reset({"id": "c1", "digits": "375", "answer": "26"}, max_turns=3)
        >>> env.step("3+7*5?")
        Step(observation='=38\\n', reward=0.0, done=False, tool_call='3+7*5', tool_error=False, info={})
        >>> env.step("3*7+5;").reward
        1.0
    """

    version = "1"
    stop = (CHECK, ANSWER)

    def check_row(self, row: Mapping[str, Any]) -> None:
        check_countdown_gold(row.get("answer"), **{k: v for k, v in row.items() if k != "answer"})

    def step(self, action: str) -> Step:
        last = self.next_turn()
        text = action.strip()
        if text.endswith(ANSWER):
            return Step(reward=countdown_reward(text, str(self.row["answer"]), **self.scoring_row), done=True)
        if last or not text.endswith(CHECK):
            return Step(reward=0.0, done=last, observation="" if last else "=?\n")
        expression = text[: -len(CHECK)]
        value = evaluate(expression)
        if value is None:
            return Step("=?\n", reward=0.0, tool_call=expression, tool_error=True)
        digits_ok = sorted(expression[::2]) == sorted(str(self.row["digits"]))
        return Step(f"={value}\n" if digits_ok else f"={value} bad digits\n", reward=0.0, tool_call=expression)


def checker_trajectory(
    rng: random.Random, pairs: list[tuple[str, int]], max_turns: int = 3
) -> tuple[dict, list[tuple[str, bool]]]:
    """A synthetic tool-using trajectory on a training pair: ``(row, [(text, is the model's), ...])``.

    The model checks 0, 1 or 2 expressions (:data:`CHECKS`; half of them valid, the others random
    arrangements of the digits), answers with the first check that hit the target, else with a
    random valid expression; the environment's turns are the checker's own answers.

    Example:
        >>> row, parts = checker_trajectory(random.Random(0), [("357", 26)])
        >>> row["prompt"], parts[:2]
        ('C537=026:', [('3-7*5?', True), ('=-32\\n', False)])
        >>> "".join(text for text, _ in parts)
        '3-7*5?=-32\\n3*7+5?=26\\n3*7+5;'
        >>> countdown_reward(parts[-1][0], row["answer"], digits=row["digits"])
        1.0
    """
    key, target = rng.choice(pairs)
    digits = "".join(rng.sample(key, 3))
    row = {"prompt": countdown_prompt(digits, target), "answer": str(target), "digits": digits}
    env = CountdownChecker()
    env.reset(row, max_turns)
    valid = solutions()[(key, target)]
    parts: list[tuple[str, bool]] = []
    answer = None
    for _ in range(min(rng.choices(CHECKS, CHECK_WEIGHTS)[0], max_turns - 1)):
        a, b, c = rng.sample(digits, 3)
        expression = rng.choice(valid) if rng.random() < 0.5 else f"{a}{rng.choice(OPS)}{b}{rng.choice(OPS)}{c}"
        parts += [(expression + CHECK, True), (env.step(expression + CHECK).observation, False)]
        if evaluate(expression) == target:
            answer = expression
            break
    parts.append(((answer or rng.choice(valid)) + ANSWER, True))
    return row, parts
