"""Environments for multi-turn, tool-using rollouts (docs/agents.md).

- :class:`Environment` / :class:`Step` — the protocol, every member the loop calls:
  ``reset(row, max_turns)`` → text for the prompt or None; ``stop``; ``step_tokens(text, ids,
  prefix)`` (default: ``step(text)``) → observation (text or chat messages), reward, done, the tool
  call made and whether it failed; ``close()``; ``version``. :class:`EnvironmentBase` defaults all
  but ``step`` and keeps the episode's row and turn count (:mod:`~lit_rlvr.envs.base`).
- :data:`ENVIRONMENTS` — chosen by name from config like rewards: ``sql`` (text-to-SQL with
  execution feedback, :mod:`~lit_rlvr.envs.sql`), ``calculator`` (a safe calculator for math,
  :mod:`~lit_rlvr.envs.calculator`), ``skyrl`` and ``trl`` (adapters running a skyrl-gym
  ``BaseTextEnv`` or a TRL ``environment_factory`` class unchanged: :mod:`~lit_rlvr.envs.skyrl`,
  :mod:`~lit_rlvr.envs.trl`), the demo's ``countdown``, a plug-in's own
  (:func:`register_environment`), or an import path (:func:`resolve_environment`).

The multi-turn rollout loop that runs them on any engine is :mod:`lit_rlvr.rollout.turns`.
"""

from lit_rlvr.envs import calculator as calculator
from lit_rlvr.envs import skyrl as skyrl
from lit_rlvr.envs import sql as sql
from lit_rlvr.envs import trl as trl
from lit_rlvr.envs.base import (
    ENVIRONMENTS,
    Environment,
    EnvironmentBase,
    EnvSpec,
    ForeignEnvironment,
    Observation,
    Step,
    register_environment,
    resolve_environment,
)

__all__ = [
    "ENVIRONMENTS",
    "EnvSpec",
    "Environment",
    "EnvironmentBase",
    "ForeignEnvironment",
    "Observation",
    "Step",
    "calculator",
    "register_environment",
    "resolve_environment",
    "skyrl",
    "sql",
    "trl",
]
