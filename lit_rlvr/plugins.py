"""Plug-ins: a user's own rewards, advantage estimators, f-divergences and dataset adapters.

A user's package registers its pieces with lit_rlvr's registries at import time::

    # myproj/rewards.py
    from lit_rlvr.rewards import register_reward

    @register_reward("exact")
    def exact(completion, answer, **row):
        return float(completion.strip() == answer)

and lit_rlvr imports it, so YAML can select it by name (``reward: exact`` in the data rows or the
adapter options, ``advantage: my_estimator``, ``divergence: my_f``, ``adapter: my_format``):

- listed in the config's top-level ``imports: [myproj.rewards]`` (or ``--imports+=myproj.rewards``)
  of ``lit-rlvr fit|validate|cache``, or
- declared once in the user's ``pyproject.toml`` as an entry point of the group
  ``lit_rlvr.plugins`` (``[project.entry-points."lit_rlvr.plugins"] myproj = "myproj.rewards"``),
  which every ``lit-rlvr`` command and every reward worker loads.

Reward workers are forked from a launcher that imported only lit_rlvr's rewards
(:mod:`lit_rlvr.rewards.launcher`): they import the same modules (:func:`loaded_modules`) before scoring, so a plug-in's rewards run in the killable workers like the built-in ones.
An entry point names a module, or a function that registers things (it is called once).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "lit_rlvr.plugins"
_LOADED: list[str] = []  # module names imported by load_plugins, in order (sent to reward workers)


def _import(name: str, where: str):
    try:
        return importlib.import_module(name)
    except Exception as err:  # ImportError, or the module itself failing
        raise ImportError(f"{where}: cannot import plug-in module {name!r}: {type(err).__name__}: {err}") from err


def load_plugins(modules: Iterable[str] = (), *, entry_point_group: str | None = ENTRY_POINT_GROUP) -> list[str]:
    """Import every ``lit_rlvr.plugins`` entry point and then ``modules``; idempotent.

    Args:
        modules: dotted module names (the config's ``imports``).
        entry_point_group: the entry-point group to load (None: none).

    Returns:
        Every module loaded so far in this process (what reward workers import).

    Raises:
        ImportError: a module or an entry point cannot be imported, naming it.

    Example:
        >>> "json" in load_plugins(["json"], entry_point_group=None)
        True
    """
    if entry_point_group is not None:
        for ep in entry_points(group=entry_point_group):
            if ep.module in _LOADED:
                continue
            try:
                obj = ep.load()
            except Exception as err:
                raise ImportError(
                    f"entry point {ep.name!r} = {ep.value!r} of group {entry_point_group!r}: {type(err).__name__}: {err}"
                ) from err
            if callable(obj) and not isinstance(obj, type(importlib)):
                obj()
            _LOADED.append(ep.module)
    for name in modules:
        if name not in _LOADED:
            _import(name, "imports")
            _LOADED.append(name)
    return list(_LOADED)


def loaded_modules() -> list[str]:
    """Plug-in modules imported so far by :func:`load_plugins` (reward workers import the same)."""
    return list(_LOADED)
