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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lit_rlvr.demo.countdown import check_countdown_gold, countdown_reward, evaluate
from lit_rlvr.envs import EnvironmentBase, Step, register_environment

CHECK, ANSWER = "?", ";"


@register_environment("countdown")
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

    def __init__(self):
        self.row: dict[str, Any] = {}
        self.turn, self.max_turns = 0, 1

    def reset(self, row: Mapping[str, Any], max_turns: int) -> None:
        check_countdown_gold(row.get("answer"), **{k: v for k, v in row.items() if k != "answer"})
        self.row, self.turn, self.max_turns = dict(row), 0, max_turns
        return None

    def step(self, action: str) -> Step:
        self.turn += 1
        text = action.strip()
        if text.endswith(ANSWER):
            row = {k: v for k, v in self.row.items() if k != "answer"}
            return Step(reward=countdown_reward(text, str(self.row["answer"]), **row), done=True)
        if self.turn >= self.max_turns or not text.endswith(CHECK):
            return Step(reward=0.0, done=self.turn >= self.max_turns, observation="" if self.turn >= self.max_turns else "=?\n")
        expression = text[: -len(CHECK)]
        value = evaluate(expression)
        if value is None:
            return Step("=?\n", reward=0.0, tool_call=expression, tool_error=True)
        digits_ok = sorted(expression[::2]) == sorted(str(self.row["digits"]))
        return Step(f"={value}\n" if digits_ok else f"={value} bad digits\n", reward=0.0, tool_call=expression)
