"""A name → function registry that checks its entries' options: advantages, divergences, rewards, ….

Swappable pieces are chosen by name from config (CONTRIBUTING.md, "Registries"), each with keyword options
(``advantage: passk`` + ``{k: 4}``). A :class:`Registry` is a ``dict`` that makes every way of
getting that wrong a specific error at start-up, through one path (:meth:`Registry.get_checked`)
shared by every registry of the library and of its users:

- registering a name twice raises (two implementations cannot silently shadow each other);
- an unknown name lists the valid ones;
- an entry's options are its keyword-only parameters, less the arguments the library injects
  itself (declared once per registry, ``injected=``); an option it does not take, or a required
  one that is missing, is refused naming the key, the value and what is accepted;
- an entry may declare a ``check`` of its option *values* (``alpha`` in (0, 1), ``std`` one of
  three modes), called with the options over the defaults, so a refused value fails at start-up
  instead of at the first training step.

An entry that forwards ``**kwargs`` (an engine builder) names the callable whose keyword
parameters are its options with ``signature=`` (the engine class); without one it takes anything.
An entry made of several functions (a policy loss's token selection and its per-token loss)
gives the union of their parameters as an :class:`inspect.Signature`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

F = TypeVar("F")


@dataclass(frozen=True)
class _Meta:
    signature: Any  # the callable whose parameters define the options
    check: Callable[..., None] | None
    traits: Mapping[str, Any] = field(default_factory=dict)  # what the entry declares about itself


class Registry(dict):
    """A ``dict`` of named entries with strict registration and option checks.

    Args:
        kind: what the entries are, used in error messages (e.g. ``"advantage estimator"``).
        injected: keyword arguments the library passes to every entry itself (never options a
            config may set), e.g. ``("entropies", "generator")`` for advantage estimators.

    Example:
        >>> ACTIVATIONS = Registry("activation", injected=("device",))
        >>> def positive(factor):
        ...     if not factor > 0:
        ...         raise ValueError(f"factor must be > 0, got {factor}")
        >>> @ACTIVATIONS.register("scale", check=positive)
        ... def scale(x, *, factor: float, device=None):
        ...     return factor * x
        >>> ACTIVATIONS["scale"](3, factor=2)
        6
        >>> ACTIVATIONS.options("scale")
        ['factor']
        >>> ACTIVATIONS.get_checked("triple", "act")
        Traceback (most recent call last):
        ...
        ValueError: act: unknown activation 'triple'; valid names: ['scale']
        >>> ACTIVATIONS.get_checked("scale", "act", {"factr": 2}, "act_options")
        Traceback (most recent call last):
        ...
        ValueError: act_options: unknown option(s) ['factr'] of activation 'scale'; accepted: ['factor']
        >>> ACTIVATIONS.get_checked("scale", "act", {}, "act_options")
        Traceback (most recent call last):
        ...
        ValueError: act_options: activation 'scale' needs option(s) ['factor']
        >>> ACTIVATIONS.get_checked("scale", "act", {"factor": -1.0}, "act_options")
        Traceback (most recent call last):
        ...
        ValueError: act_options: factor must be > 0, got -1.0
    """

    #: whether an entry's ``**kwargs`` takes options (an engine builder forwarding them); a reward's
    #: ``**row`` takes the prompt row's fields instead, so rewards set this to False
    kwargs_are_options = True

    def __init__(self, kind: str, *, injected: Iterable[str] = ()):
        super().__init__()
        self.kind = kind
        self.injected = frozenset(injected)
        self._meta: dict[str, _Meta] = {}

    def register(
        self, name: str, *, check: Callable[..., None] | None = None, signature: Any = None, **traits: Any
    ) -> Callable[[F], F]:
        """Decorator that adds an entry under ``name``; raises ``ValueError`` if ``name`` is taken.

        Args:
            name: the name configs use.
            check: ``check(**options)`` raising ``ValueError`` (or ``TypeError``) for option values
                the entry refuses; called with every option, defaults filled in.
            signature: the callable whose keyword parameters are the options (default: the entry),
                or an :class:`inspect.Signature` of them.
            **traits: what the entry declares about itself for the library to read with
                :meth:`trait` (e.g. an advantage estimator's ``min_group_size``); a callable
                trait is a function of the options.
        """

        def decorator(entry: F) -> F:
            self._add(name, entry, _Meta(signature if signature is not None else entry, check, dict(traits)))
            return entry

        return decorator

    def _add(self, name: str, entry: Any, meta: _Meta) -> None:
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered (by {self[name]!r})")
        self[name] = entry
        self._meta[name] = meta

    def __missing__(self, name):
        raise KeyError(f"unknown {self.kind} {name!r}; valid names: {sorted(self)}")

    def __delitem__(self, name) -> None:
        super().__delitem__(name)
        self._meta.pop(name, None)

    def pop(self, name, *default):
        self._meta.pop(name, None)
        return super().pop(name, *default)

    def _parameters(self, name: str) -> list[inspect.Parameter]:
        target = self.signature(name)
        if isinstance(target, inspect.Signature):
            return list(target.parameters.values())
        try:
            return list(inspect.signature(target).parameters.values())
        except (TypeError, ValueError):  # a builtin without a signature: takes no options we can see
            return []

    def signature(self, name: str) -> Any:
        """What defines entry ``name``'s options (its ``signature=``, e.g. an engine class, or the entry itself)."""
        meta = self._meta.get(name)
        return meta.signature if meta is not None else self[name]

    def takes_any(self, name: str) -> bool:
        """Whether entry ``name`` takes every option: it forwards ``**kwargs`` (without a ``signature``)."""
        return self.kwargs_are_options and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in self._parameters(name))

    def options(self, name: str) -> list[str]:
        """The options of entry ``name``: its keyword-only parameters, less the injected ones, sorted."""
        return sorted(
            p.name
            for p in self._parameters(name)
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in self.injected
        )

    def defaults(self, name: str) -> dict[str, Any]:
        """The options of entry ``name`` that have defaults, with them."""
        options = self.options(name)
        return {p.name: p.default for p in self._parameters(name) if p.name in options and p.default is not p.empty}

    def trait(self, name: str, key: str, options: Mapping[str, Any] | None = None, default: Any = None) -> Any:
        """What entry ``name`` declared as ``key`` at registration (``default`` if nothing); a
        callable trait is called with ``options`` over the entry's defaults.

        Example:
            >>> LOSSES = Registry("loss")
            >>> @LOSSES.register("hinge", margin_needed=lambda margin: margin > 0)
            ... def hinge(x, *, margin: float = 1.0):
            ...     return max(0.0, margin - x)
            >>> LOSSES.trait("hinge", "margin_needed"), LOSSES.trait("hinge", "margin_needed", {"margin": 0.0})
            (True, False)
            >>> LOSSES.trait("hinge", "smooth", default=False)
            False
        """
        meta = self._meta.get(name)
        value = meta.traits.get(key, default) if meta is not None else default
        return value(**{**self.defaults(name), **(options or {})}) if callable(value) else value

    def declares(self, name: str, argument: str) -> bool:
        """Whether entry ``name`` takes ``argument`` (e.g. an injected ``entropies``)."""
        return any(p.name == argument for p in self._parameters(name))

    def get_checked(
        self, name: str, key: str, options: Mapping[str, Any] | None = None, options_key: str | None = None
    ):
        """The entry ``name`` for config key ``key``, after checking its ``options`` (when given).

        Args:
            name: the configured name.
            key: its config key, for errors (``model.loss.advantage``).
            options: the configured options; None skips the option checks.
            options_key: the options' config key, for errors (default ``key + "_options"``).

        Raises:
            ValueError: an unknown name (listing the valid ones); an option the entry does not
                take, or injects itself (listing the accepted ones); a missing required option;
                a value the entry's ``check`` refuses.
        """
        if name not in self:
            raise ValueError(f"{key}: unknown {self.kind} {name!r}; valid names: {sorted(self)}")
        if options is None:
            return self[name]
        options_key = options_key or f"{key}_options"
        accepted = self.options(name)
        if not self.takes_any(name):
            unknown = sorted(set(options) - set(accepted))
            if unknown:
                raise ValueError(
                    f"{options_key}: unknown option(s) {unknown} of {self.kind} {name!r}; accepted: {accepted}"
                )
        defaults = self.defaults(name)
        missing = sorted(set(accepted) - set(defaults) - set(options))
        if missing:
            raise ValueError(f"{options_key}: {self.kind} {name!r} needs option(s) {missing}")
        meta = self._meta.get(name)
        if meta is not None and meta.check is not None:
            try:
                meta.check(**{**defaults, **options})
            except (ValueError, TypeError) as err:
                raise ValueError(f"{options_key}: {err}") from err
        return self[name]

    def merged(self, other: Registry) -> Registry:
        """A new registry of this one's entries and ``other``'s (``other`` wins on a shared name)."""
        out = type(self)(self.kind, injected=self.injected)
        for source in (self, other):
            for name, entry in source.items():
                dict.__setitem__(out, name, entry)
                out._meta[name] = source._meta.get(name, _Meta(entry, None))
        return out
