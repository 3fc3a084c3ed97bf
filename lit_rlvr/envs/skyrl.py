"""A skyrl-gym environment (``BaseTextEnv``) run unchanged as a lit_rlvr environment.

skyrl-gym (``pip install "lit_rlvr[agents]"``) environments are made per trajectory the way
SkyRL's generator makes them (``skyrl_gym/envs``; ``SkyRLGymGenerator.agent_loop``): constructed
with ``(env_config, extras=row)`` where ``extras["max_turns"]`` is the loop's turn limit, started
with ``init(prompt_messages)``, then ``step(text) -> {observations, reward, done, metadata,
postprocessed_action}``. Their observations are chat messages: with ``conversation: true`` they
are rendered as new turns with the chat template (SkyRL's ``use_conversation_multi_turn``, its
fixed-base tokenization), otherwise their contents are appended as text inside the model's one
assistant message (``use_conversation_multi_turn: false``, as SkyRL-SQL trains).

Where it departs from SkyRL's generator, and why:

- The reward of a trajectory is the sum of its steps' rewards (SkyRL places each at the end of its
  turn's tokens; the outcome estimators it feeds sum them).
- A ``postprocessed_action`` is not used: SkyRL re-tokenizes it, which would train on tokens the
  model did not sample (tokens in, tokens out: CONTRIBUTING.md, "Typed contracts"); a warning says so once.
- A turn skyrl-gym's environment rejects as an invalid action (its parser found no call:
  ``metadata.tool_input`` holds None, or ``tool_name`` is None) is a tool error, not a tool call
  (the behaviour metrics' ``tool_calls`` and ``tool_errors``).
- A row without ``reward_spec`` gets ``{"method": "rule", "ground_truth": row["answer"]}``, the form of
  SkyRL's datasets, so lit_rlvr rows (``prompt``, ``answer``) run as they are.
- ``init`` may only append messages to the prompt (they become environment tokens after it): the
  prompt's own tokens come from the DataModule.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from lit_rlvr.envs.base import EnvironmentBase, Observation, Step, declared_version, register_environment
from lit_rlvr.plugins import is_import_path, load_function


def skyrl_class(env: str) -> type:
    """The ``BaseTextEnv`` class ``env`` names: a skyrl-gym registry id (``text2sql``) or an import path."""
    try:
        import skyrl_gym  # noqa: F401
        from skyrl_gym.envs.base_text_env import BaseTextEnv
        from skyrl_gym.envs.registration import load_env_creator, registry
    except ImportError as err:
        raise ImportError(f"environment 'skyrl' needs skyrl-gym: pip install 'lit_rlvr[agents]' ({err})") from err
    if env in registry:
        entry = registry[env].entry_point
        cls = load_env_creator(entry) if isinstance(entry, str) else entry
    elif is_import_path(env):
        cls = load_function(env, "environment")
    else:
        raise ValueError(
            f"environment_options.env: {env!r} is neither a skyrl-gym environment id ({sorted(registry)}) nor an import path"
        )
    if not (isinstance(cls, type) and issubclass(cls, BaseTextEnv)):
        raise TypeError(f"environment_options.env: {env!r} is {cls!r}, not a skyrl-gym BaseTextEnv")
    return cls


def skyrl_version(*, env: str, env_config: Mapping[str, Any] | None = None, conversation: bool = False) -> str:
    """The adapted environment's identity: skyrl-gym's version, the id and the class's version."""
    from importlib.metadata import version

    return f"skyrl_gym-{version('skyrl-gym')}:{env}:{declared_version(skyrl_class(env))}"


def _check(env: str, env_config: Mapping[str, Any] | None, conversation: bool) -> None:
    skyrl_class(env)
    if env_config is not None and not isinstance(env_config, Mapping):
        raise ValueError(f"env_config must be a mapping (the environment's config); got {type(env_config).__name__}")


@register_environment("skyrl", check=_check, version=skyrl_version, scores=True)
class SkyRLEnvironment(EnvironmentBase):
    """One episode of a skyrl-gym ``BaseTextEnv`` (module docstring).

    Args:
        env: a skyrl-gym id (``text2sql``, ``gsm8k``, …) or the import path of a ``BaseTextEnv``.
        env_config: its ``env_config`` (SkyRL's ``skyrl_gym_cfg.<env>``, e.g. ``{db_path: ...}``).
        conversation: render observations as chat turns (SkyRL's ``use_conversation_multi_turn``).
    """

    _warned_postprocessed = False

    def __init__(self, *, env: str, env_config: Mapping[str, Any] | None = None, conversation: bool = False):
        from omegaconf import OmegaConf

        self.cls = skyrl_class(env)
        self.env_config = OmegaConf.create(dict(env_config or {}))
        self.conversation = conversation
        self.env: Any = None
        self.total = 0.0

    def reset(self, row: Mapping[str, Any], max_turns: int) -> Observation | None:
        extras = dict(row)
        extras["max_turns"] = max_turns
        if "reward_spec" not in extras and "answer" in row:
            extras["reward_spec"] = {"method": "rule", "ground_truth": row["answer"]}
        self.env = self.cls(self.env_config, extras=extras)
        prompt = row.get("prompt")
        messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        started, _ = self.env.init([dict(m) for m in messages])
        started = list(started)
        if started[: len(messages)] != messages:
            raise ValueError(
                f"{self.cls.__name__}.init changed the prompt's messages; lit_rlvr tokenizes prompts in the DataModule, "
                "so an environment may only append messages to them"
            )
        return self._observation(started[len(messages) :]) if len(started) > len(messages) else None

    def step(self, action: str) -> Step:
        out = self.env.step(action)
        if out.get("postprocessed_action") is not None and not SkyRLEnvironment._warned_postprocessed:
            SkyRLEnvironment._warned_postprocessed = True
            warnings.warn(
                f"{self.cls.__name__} returned a postprocessed_action; lit_rlvr keeps the model's own tokens "
                "(SkyRL would re-tokenize the edited text)",
                stacklevel=2,
            )
        self.total += float(out.get("reward") or 0.0)
        metadata = dict(out.get("metadata") or {})
        name, arguments = metadata.get("tool_name"), metadata.get("tool_input")
        arguments = list(arguments) if isinstance(arguments, (list, tuple)) else [arguments]
        # skyrl-gym's invalid action: its parser found no call (SQLEnv: tool_input (db_id, None, turns
        # left); SearchEnv: [None]) or raised (tool_name None): a tool error, not a call
        invalid = "tool_name" in metadata and (name is None or any(a is None for a in arguments))
        call = None if name is None or invalid else f"{name}({', '.join(map(repr, arguments))})"
        observation = self._observation(list(out.get("observations") or []))
        return Step(
            observation,
            reward=self.total,
            done=bool(out.get("done")),
            tool_call=call,
            tool_error=invalid or bool(metadata.get("error") or metadata.get("tool_error")),
            info=metadata,
        )

    def _observation(self, messages: list[Mapping[str, Any]]) -> Observation:
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
        return messages if self.conversation else "".join(m["content"] for m in messages)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
