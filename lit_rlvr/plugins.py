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

A config may also name one piece by its import path instead of a registered name (a reward
function in ``model.scoring.reward_funcs``, an environment class in ``model.environment.name``, a
TRL tool class in ``data.prompt.tools``): :func:`is_import_path` tells the two apart and
:func:`load_function` imports what the path names, once per process. Rewards, environments and data
import this one loader.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from pathlib import Path

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


def is_import_path(ref: str) -> bool:
    """Whether a config's reference is an import path (``pkg.mod.fn``, ``file.py:fn``) rather than a
    registered name (``math``, ``sql``): registered names hold neither ``.`` nor ``:``.

    Example:
        >>> is_import_path("math"), is_import_path("my_pkg.rewards.accuracy"), is_import_path("r.py:compute_score")
        (False, True, True)
    """
    return "." in ref or ":" in ref


_IMPORTED: dict[str, Callable] = {}  # import path -> function, once per process


def load_function(ref: str, what: str) -> Callable:
    """The function (or class) an import path names: ``pkg.mod.fn``, ``pkg.mod:fn`` or ``path/to/file.py:fn``.

    A ``.py`` file is imported by path (relative to the working directory), as verl's
    ``custom_reward_function.path`` is; every other form by module name (``imports``-style).
    ``what`` names it in errors (``"reward function"``, ``"environment"``, …).

    Raises:
        ImportError: the module cannot be imported or has no such attribute, naming ``ref``.
        TypeError: what it names is not callable.

    Example:
        >>> load_function("operator.add", "reward function")(2, 3)
        5
        >>> load_function("operator:nope", "environment")
        Traceback (most recent call last):
        ...
        ImportError: environment 'operator:nope': module 'operator' has no attribute 'nope'
    """
    if ref in _IMPORTED:
        return _IMPORTED[ref]
    module_ref, sep, attr = ref.rpartition(":") if ":" in ref else ref.rpartition(".")
    if not module_ref or not attr:
        raise ImportError(
            f"{what} {ref!r}: expected 'package.module.function', 'package.module:function' or 'file.py:function'"
        )
    try:
        module = _import_file(module_ref) if module_ref.endswith(".py") else importlib.import_module(module_ref)
    except ImportError as err:
        raise ImportError(f"{what} {ref!r}: {err}") from err
    except Exception as err:  # the module itself failing
        raise ImportError(f"{what} {ref!r}: importing {module_ref!r} raised {type(err).__name__}: {err}") from err
    if not hasattr(module, attr):
        raise ImportError(f"{what} {ref!r}: module {module_ref!r} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise TypeError(f"{what} {ref!r} is a {type(fn).__name__}, not a function")
    _IMPORTED[ref] = fn
    return fn


def _import_file(path: str):
    """Import a ``.py`` file as a module (once per resolved path), like verl's ``load_extern_object``."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ImportError(f"no file {str(file)!r}")
    name = f"lit_rlvr_user_reward_{hashlib.sha256(str(file).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, so its own functions pickle and dataclasses resolve
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
