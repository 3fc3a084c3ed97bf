"""How rollouts are generated: the rollout callback's settings, as typed groups that check themselves.

:class:`RolloutOptions` is what :class:`~lit_rlvr.callbacks.RolloutCallback` reads: the engine and
its options, the weight sync and its checks, the timeouts, and (:class:`AsyncOptions`) the bounds
of asynchronous rollouts. Users set them as the callback's keys (``rollout.init_args.engine``,
``rollout.init_args.max_staleness``, ...; documented on the callback and in
``docs/configuration.md``); the callback builds the groups from them, so a bad setting stops the
run at construction, naming the key, the value and what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from lit_rlvr.rollout.adapters import check_adapter_sync
from lit_rlvr.rollout.engine import ENGINE_INJECTED, ENGINES, SYNC_BUCKET_MB, RolloutEngine, resolve_engine

MAX_LANES = 8  # batches in generation ahead of the loop; the seed space keeps them apart (lane · 2**17)
ON_STALE = ("wait", "drop")


@dataclass(frozen=True)
class AsyncOptions:
    """Asynchronous rollouts: generated up to ``max_staleness`` weight versions ahead of training.

    Args:
        max_staleness: k in [0, ``MAX_LANES`` − 2] (0: the synchronous run, bit for bit).
        on_stale: ``wait`` (no batch is older than k) or ``drop`` (one batch further; an older
            batch is dropped and generated again).

    Example:
        >>> AsyncOptions(2).on_stale
        'wait'
        >>> AsyncOptions(1, on_stale="skip")
        Traceback (most recent call last):
        ...
        ValueError: rollout.on_stale must be 'wait' or 'drop', got 'skip'
    """

    max_staleness: int
    on_stale: str = "wait"

    def __post_init__(self):
        k = self.max_staleness
        if not isinstance(k, int) or not 0 <= k < MAX_LANES - 1:
            raise ValueError(f"rollout.max_staleness must be an integer in [0, {MAX_LANES - 2}] or null, got {k!r}")
        if self.on_stale not in ON_STALE:
            raise ValueError(f"rollout.on_stale must be 'wait' or 'drop', got {self.on_stale!r}")

    @property
    def ahead(self) -> int:
        """How many versions past the weights a batch may start (``drop`` runs one further)."""
        return self.max_staleness + (1 if self.on_stale == "drop" else 0)


@dataclass(frozen=True)
class RolloutOptions:
    """The rollout callback's settings, checked together (each field is the callback's key of the same
    name, documented there; ``asynchronous`` holds ``max_staleness`` and ``on_stale``).

    The checks: a registered engine name whose ``engine_options`` it takes (less those the
    callback sets itself, :data:`~lit_rlvr.rollout.engine.ENGINE_INJECTED`); at least one
    optimizer step per sync; a drift period ≥ 0; asynchronous rollouts only from an engine that
    generates apart from the trainer, synced after every step; ``adapter_sync`` auto, true or false,
    and true only for an engine that serves adapters itself; buckets of at least 1 MB.

    Example:
        >>> RolloutOptions(engine="hf", engine_options={"max_batch_rows": 8}).engine_kind
        'hf'
        >>> RolloutOptions(engine="hf", asynchronous=AsyncOptions(1))
        Traceback (most recent call last):
        ...
        ValueError: rollout.max_staleness=1 needs an engine that generates apart from the trainer ...
    """

    engine: str | RolloutEngine = "auto"
    engine_options: dict[str, Any] = field(default_factory=dict)
    model_path: str | None = None
    sync_every_n_steps: int = 1
    fingerprint: bool = True
    fingerprint_atol: float | None = None
    drift_every_n_steps: int = 10
    generate_timeout_s: float | None = None
    sync_timeout_s: float | None = None
    asynchronous: AsyncOptions | None = None
    adapter_sync: bool | Literal["auto"] = "auto"
    sync_bucket_mb: int = SYNC_BUCKET_MB

    @classmethod
    def from_keys(cls, keys: dict[str, Any]) -> RolloutOptions:
        """The options from the callback's keys (its arguments, by name; others are ignored):
        ``max_staleness`` and ``on_stale`` become :attr:`asynchronous` (None: synchronous rollouts).

        Example:
            >>> RolloutOptions.from_keys({"engine": "hf", "max_staleness": None, "on_stale": "wait"}).asynchronous is None
            True
        """
        given = {f.name: keys[f.name] for f in fields(cls) if f.name in keys}
        given["engine_options"] = dict(given.get("engine_options") or {})
        k = keys.get("max_staleness")
        given["asynchronous"] = None if k is None else AsyncOptions(k, keys.get("on_stale", "wait"))
        return cls(**given)

    def __post_init__(self):
        if self.sync_every_n_steps < 1:
            raise ValueError(f"rollout.sync_every_n_steps must be >= 1, got {self.sync_every_n_steps}")
        check_adapter_sync(self.adapter_sync)
        if not isinstance(self.sync_bucket_mb, int) or isinstance(self.sync_bucket_mb, bool) or self.sync_bucket_mb < 1:
            raise ValueError(f"rollout.sync_bucket_mb must be an integer >= 1 (megabytes), got {self.sync_bucket_mb!r}")
        if self.drift_every_n_steps < 0:
            raise ValueError(f"rollout.drift_every_n_steps must be >= 0 (0 = never), got {self.drift_every_n_steps}")
        if isinstance(self.engine, str):
            given = sorted(set(self.engine_options) & set(ENGINE_INJECTED))
            if given:
                raise ValueError(f"rollout.engine_options: {given} are set by the callback itself, not by options")
            ENGINES.get_checked(self.engine, "rollout.engine", self.engine_options, "rollout.engine_options")
        if self.asynchronous is not None:
            self._check_asynchronous()
        if self.adapter_sync is True and isinstance(self.engine, str) and "adapter_sync" not in self.sync_kwargs():
            raise ValueError(
                f"rollout.adapter_sync=true needs an engine that serves LoRA adapters itself (vllm, vllm_server); "
                f"{resolve_engine(self.engine)!r} does not. Use adapter_sync: auto or false."
            )

    def sync_kwargs(self) -> dict[str, Any]:
        """The weight-sync settings the engine's builder takes: ``adapter_sync`` for an engine that
        serves adapters itself (its class takes ``adapter``), ``sync_bucket_mb`` for one that copies
        in buckets; none for a ready engine or one that takes neither (``hf``).

        Example:
            >>> RolloutOptions(engine="hf").sync_kwargs()
            {}
        """
        if not isinstance(self.engine, str):
            return {}
        kind = resolve_engine(self.engine)
        takes = {
            "adapter_sync": ENGINES.declares(kind, "adapter"),
            "sync_bucket_mb": ENGINES.declares(kind, "sync_bucket_mb"),
        }
        return {key: getattr(self, key) for key, taken in takes.items() if taken}

    def engine_kwargs(self) -> dict[str, Any]:
        """What the engine's builder takes besides the model, tokenizer and path: the timeouts, the
        weight-sync settings (:meth:`sync_kwargs`) and ``engine_options``.

        Example:
            >>> RolloutOptions(engine="hf", engine_options={"max_batch_rows": 8}, sync_timeout_s=60).engine_kwargs()
            {'generate_timeout_s': None, 'sync_timeout_s': 60, 'max_batch_rows': 8}
        """
        timeouts = {"generate_timeout_s": self.generate_timeout_s, "sync_timeout_s": self.sync_timeout_s}
        return {**timeouts, **self.sync_kwargs(), **self.engine_options}

    def sync_limit_s(self, fingerprint: bool) -> float | None:
        """The time one weight sync may take on every rank: the sync, plus the probe's log-probs when
        the sync is fingerprinted (a generate call); None when either has no limit.

        Example:
            >>> RolloutOptions(engine="hf", sync_timeout_s=60, generate_timeout_s=10).sync_limit_s(True)
            70
        """
        parts = (self.sync_timeout_s, self.generate_timeout_s if fingerprint else 0.0)
        return None if any(s is None for s in parts) else sum(parts)

    def _check_asynchronous(self) -> None:
        engine = ENGINES.signature(resolve_engine(self.engine)) if isinstance(self.engine, str) else self.engine
        if not getattr(engine, "generates_apart", False):
            raise ValueError(
                f"rollout.max_staleness={self.asynchronous.max_staleness} needs an engine that generates apart from the "
                f"trainer (engine: vllm_server); {self.engine_kind!r} samples in the trainer's process. Use max_staleness: null."
            )
        if self.sync_every_n_steps != 1:
            raise ValueError(
                f"rollout.max_staleness bounds the lag itself: use sync_every_n_steps: 1 with it (got {self.sync_every_n_steps})"
            )

    @property
    def engine_kind(self) -> str:
        """The engine's name: the configured one, or a ready engine's ``name``."""
        return self.engine if isinstance(self.engine, str) else self.engine.name
