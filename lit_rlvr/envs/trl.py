"""A TRL ``environment_factory`` class run unchanged as a lit_rlvr environment.

TRL's ``GRPOTrainer(environment_factory=...)`` makes one environment per rollout; its public
methods are the tools, ``reset(**row)`` starts an episode (a returned string is added to the
prompt) and an optional ``get_reward()`` scores it. The model calls tools in its chat template's
tool-call format; TRL parses each turn with ``parse_response`` (the tokenizer's response schema,
``trl.chat_template_utils.add_response_schema`` for the templates TRL knows), runs every call,
appends the results as ``tool`` messages rendered with the chat template (token concatenation,
TRL #5224) and generates again, until a turn calls no tool or ``max_tool_calling_iterations``
is reached. This adapter does the same, one turn per :meth:`~TRLEnvironment.step`; a turn that
calls no tool ends the episode, and so does the last turn the loop allows (its calls are not run,
as TRL does not run the calls of the turn after its last iteration), so ``max_turns`` is TRL's
``max_tool_calling_iterations + 1``.

Where it departs from TRL, and why:

- ``reset``'s string follows the prompt's tokens as environment tokens (TRL appends it to the
  last user message before the chat template: here prompts are tokenized by the DataModule).
- ``get_reward()`` is read after every turn, so a trajectory the loop cuts (token budget) keeps
  the reward its state has earned; TRL reads it once per finished rollout.
- A tool's error is returned as its result ``{"error": ...}`` and counted as a tool error (as TRL).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from lit_rlvr.envs.base import EnvironmentBase, Observation, Step, declared_version, register_environment
from lit_rlvr.plugins import load_function


def tool_methods(env: Any) -> dict[str, Any]:
    """The public methods of a TRL environment that are its tools (all but ``reset`` and ``get_reward``), bound.

    Listed on the class, as TRL does (so properties are not evaluated).

    Example:
        >>> class Game:
        ...     def reset(self, **row): ...
        ...     def guess(self, word: str) -> str: ...
        ...     def _secret(self): ...
        >>> list(tool_methods(Game()))
        ['guess']
    """
    names = [
        n
        for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if not n.startswith("_") and n not in ("reset", "get_reward")
    ]
    return {n: getattr(env, n) for n in names}


def trl_version(*, factory: str, tokenizer: Any = None) -> str:
    """The adapted class's identity: its import path and declared version (or a digest of its source)."""
    return f"trl:{factory}:{declared_version(load_function(factory, 'environment'))}"


def trl_scores(*, factory: str, tokenizer: Any = None) -> bool:
    """Whether the class scores its episodes: it has ``get_reward`` (else the reward functions score them, as in TRL)."""
    return callable(getattr(load_function(factory, "environment"), "get_reward", None))


def _check(factory: str) -> None:
    cls = load_function(factory, "environment")
    if not callable(getattr(cls, "reset", None)):
        raise ValueError(
            f"factory {factory!r} makes {cls!r}, which has no reset method (TRL's environment_factory needs one)"
        )


@register_environment("trl", check=_check, version=trl_version, scores=trl_scores)
class TRLEnvironment(EnvironmentBase):
    """One episode of a TRL environment class (module docstring).

    Args:
        factory: the import path of the class (or of a function returning an instance), as TRL's
            ``environment_factory`` would be called.
        tokenizer: the policy's tokenizer (injected), whose chat template parses the tool calls.
    """

    def __init__(self, *, factory: str, tokenizer: Any = None):
        if tokenizer is None:
            raise ValueError("the trl environment needs the policy's tokenizer to parse tool calls")
        self.tokenizer = with_response_parser(tokenizer)
        self.env = load_function(factory, "environment")()
        self.tools = tool_methods(self.env)
        self.reward_fn = getattr(self.env, "get_reward", None)
        self.turn, self.max_turns = 0, 1

    def reset(self, row: Mapping[str, Any], max_turns: int) -> Observation | None:
        self.turn, self.max_turns = 0, max_turns
        text = self.env.reset(**dict(row))
        return text if text else None

    def step(self, action: str) -> Step:
        ids = self.tokenizer(action, add_special_tokens=False).input_ids
        return self.step_tokens(action, ids, [])

    def step_tokens(self, action: str, ids: list[int], prefix: list[int]) -> Step:
        """The turn parsed from its token ids after ``prefix`` (the trajectory so far), as TRL parses it."""
        from trl.chat_template_utils import parse_response

        self.turn += 1
        calls = (
            parse_response(self.tokenizer, list(ids), prefix=list(prefix), tools=list(self.tools.values())).get(
                "tool_calls"
            )
            or []
        )
        if not calls or self.turn >= self.max_turns:
            return Step(reward=self._reward(), done=True)
        messages, failed, shown = [], False, []
        for call in calls:
            name, result = self._call(call)
            failed |= isinstance(result, dict) and "error" in result
            messages.append({"role": "tool", "name": name, "content": str(result)})
            shown.append(f"{name}({call.get('function', {}).get('arguments', {})})")
        return Step(messages, reward=self._reward(), tool_call="; ".join(shown), tool_error=failed)

    def _call(self, call: Mapping[str, Any]) -> tuple[str, Any]:
        if call.get("type") != "function":
            return call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call.get('type')}"}
        function = call["function"]
        name = function["name"]
        try:
            if name not in self.tools:
                raise ValueError(f"Tool {name} not found.")
            return name, self.tools[name](**function["arguments"])
        except Exception as e:  # a tool's failure is its result, as in TRL
            return name, {"error": str(e)}

    def _reward(self) -> float | None:
        return None if self.reward_fn is None else float(self.reward_fn())


def with_response_parser(tokenizer: Any) -> Any:
    """``tokenizer`` able to parse tool calls: its own response template, or TRL's for a chat template TRL knows."""
    if (
        getattr(tokenizer, "response_template", None) is not None
        or getattr(tokenizer, "response_schema", None) is not None
    ):
        return tokenizer
    from trl.chat_template_utils import add_response_schema

    try:
        return add_response_schema(tokenizer)
    except ValueError as err:
        raise ValueError(f"the trl environment cannot parse this tokenizer's tool calls: {err}") from err
