"""A name → function registry shared by advantages, divergences, rewards and losses.

Swappable pieces are chosen by name from config (STYLE.md §3). A :class:`Registry` is a plain
``dict`` with two guarantees that make configuration errors specific:

- registering a name twice raises (two implementations cannot silently shadow each other);
- looking up an unknown name raises a ``KeyError`` that lists the valid names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


class Registry(dict):
    """A ``dict`` of named callables with strict registration and helpful lookup errors.

    Args:
        kind: what the entries are, used in error messages (e.g. ``"advantage estimator"``).

    Example:
        >>> ACTIVATIONS = Registry("activation")
        >>> @ACTIVATIONS.register("double")
        ... def double(x):
        ...     return 2 * x
        >>> ACTIVATIONS["double"](3)
        6
        >>> ACTIVATIONS["triple"]
        Traceback (most recent call last):
        ...
        KeyError: "unknown activation 'triple'; valid names: ['double']"
    """

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator that adds ``fn`` under ``name``; raises ``ValueError`` if ``name`` is taken."""

        def decorator(fn: F) -> F:
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is already registered (by {self[name]!r})")
            self[name] = fn
            return fn

        return decorator

    def __missing__(self, name):
        raise KeyError(f"unknown {self.kind} {name!r}; valid names: {sorted(self)}")

    def get_checked(self, name: str, key: str) -> Callable:
        """Look up ``name`` for the config key ``key``, with an error that names the key."""
        if name not in self:
            raise ValueError(f"{key}: unknown {self.kind} {name!r}; valid names: {sorted(self)}")
        return self[name]
