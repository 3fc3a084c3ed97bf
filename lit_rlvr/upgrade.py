"""What the flat 0.1 layout wrote, in today's option groups: checkpoints and configs.

lit_rlvr 0.1 took every option as a flat argument (``model.samples_per_prompt``,
``model.divergence_coef``, ``rollout.init_args.max_new_tokens``, …); since 0.2 each setting has
one owner in a typed group (:mod:`lit_rlvr.options`). :data:`MOVES` is the one table of where
each old key went; it upgrades

- checkpoints: :meth:`RLVRModule.on_load_checkpoint <lit_rlvr.module.RLVRModule.on_load_checkpoint>`
  calls :func:`upgrade_checkpoint` on every checkpoint it resumes or validates from, and
  ``RLVRModule.load_from_checkpoint`` reads a file with :func:`read_checkpoint` (verified,
  ``weights_only``) and upgrades it in memory, so 0.1 checkpoints load as they are;
  ``lit-rlvr upgrade checkpoint OLD.ckpt NEW.ckpt`` rewrites one;
- configs: ``lit-rlvr upgrade config OLD.yaml`` prints the same config in the new layout
  (:func:`upgrade_config`).

docs/configuration.md shows the table (a test keeps the two equal).
"""

from __future__ import annotations

import copy
import io
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lit_rlvr.checkpoint import verify_checkpoint

CHECKPOINT_FORMAT = 2  # checkpoint["lit_rlvr_format"]: absent in 0.1 checkpoints

# (section, old key, new key): dotted keys relative to the section's options (init_args).
# A new key of None means the option is gone; the note says why.
MOVES: tuple[tuple[str, str, str | None], ...] = (
    ("model", "model", "policy.path"),
    ("model", "dtype", "policy.dtype"),
    ("model", "attn_implementation", "policy.attn_implementation"),
    ("model", "gradient_checkpointing", "policy.gradient_checkpointing"),
    ("model", "lora", "policy.lora"),
    ("model", "samples_per_prompt", "sampling.n"),
    ("model", "max_new_tokens", "sampling.max_new_tokens"),
    ("model", "temperature", "sampling.temperature"),
    ("model", "advantage", "loss.advantage"),
    ("model", "advantage_options", "loss.advantage_options"),
    ("model", "loss_agg", "loss.aggregation"),
    ("model", "clip_low", "loss.clip_low"),
    ("model", "clip_high", "loss.clip_high"),
    ("model", "dual_clip", "loss.dual_clip"),
    ("model", "divergence", "anchor.divergence"),
    ("model", "divergence_coef", "anchor.coef"),
    ("model", "divergence_level", "anchor.level"),
    ("model", "divergence_options", "anchor.options"),
    ("model", "divergence_value_cap", "anchor.value_cap"),
    ("model", "kl_coef", "kl.coef"),
    ("model", "kl_estimator", "kl.estimator"),
    ("model", "kl_value_cap", "kl.value_cap"),
    ("model", "ppo_epochs", "batching.ppo_epochs"),
    ("model", "mini_batch_size", "batching.mini_batch_size"),
    ("model", "micro_batch_size", "batching.micro_batch_size"),
    ("model", "micro_batch_tokens", "batching.micro_batch_tokens"),
    ("model", "padding_free", "batching.padding_free"),
    ("model", "reward_workers", "scoring.workers"),
    ("model", "reward_timeout", "scoring.timeout_s"),
    ("model", "reward_options", "scoring.options"),
    ("model", "pass_k", "evaluation.pass_k"),
    ("model", "retention_reference", "evaluation.retention_reference"),
    ("rollout", "samples_per_prompt", "model:sampling.n"),
    ("rollout", "temperature", "model:sampling.temperature"),
    ("rollout", "top_p", "model:sampling.top_p"),
    ("rollout", "top_k", "model:sampling.top_k"),
    ("rollout", "max_new_tokens", "model:sampling.max_new_tokens"),
    ("rollout", "stop", "model:sampling.stop"),
    ("rollout", "seed", "model:sampling.seed"),
    ("rollout", "val_temperature", "model:evaluation.temperature"),
    ("rollout", "val_top_p", "model:evaluation.top_p"),
    ("rollout", "val_top_k", "model:evaluation.top_k"),
    ("rollout", "val_max_new_tokens", "model:evaluation.max_new_tokens"),
    ("rollout", "engine_kwargs", "engine_options"),
    ("rollout", "drift_micro_batch_size", None),
    ("data", "instruction", "prompt.instruction"),
    ("data", "system_prompt", "prompt.system_prompt"),
    ("data", "use_chat_template", "prompt.use_chat_template"),
    ("data", "plain_template", "prompt.plain_template"),
    ("data", "gold_check_workers", "gold_check.workers"),
    ("data", "gold_check_timeout_s", "gold_check.timeout_s"),
    ("data", "cache", "cache.path"),
    ("data", "perfect_threshold", "cache.perfect_threshold"),
    ("data", "anchor_samples", "cache.anchor_samples"),
    ("data", "anchor_batch_size", "cache.anchor_batch_size"),
    ("data", "train_split", "cache.train_split"),
    ("data", "cache_verify", "cache.verify"),
    ("cache", "model", "policy.path"),
    ("cache", "dtype", "policy.dtype"),
    ("cache", "n", "sampling.n"),
    ("cache", "temperature", "sampling.temperature"),
    ("cache", "top_p", "sampling.top_p"),
    ("cache", "top_k", "sampling.top_k"),
    ("cache", "max_new_tokens", "sampling.max_new_tokens"),
    ("cache", "stop", "sampling.stop"),
    ("cache", "seed", "sampling.seed"),
    ("cache", "out", "data:cache.path"),
    ("cache", "perfect_threshold", "data:cache.perfect_threshold"),
    ("cache", "num_workers", "scoring.workers"),
    ("cache", "timeout_s", "scoring.timeout_s"),
    ("cache", "logprob_batch_size", "batching.micro_batch_size"),
)
GONE_WHY = {
    "drift_micro_batch_size": "the drift pass uses the module's micro-batches (model.batching)",
}
# 0.1's cache tool defaults where today's (training's) differ: an upgraded cache config writes them out, so
# it builds the cache 0.1 built (the same engine, length cap and log π_ref passes)
CACHE_DEFAULTS_0_1: dict[str, Any] = {
    "engine": "hf",
    "sampling": {"max_new_tokens": 512},
    "batching": {"micro_batch_size": 16, "padding_free": False},
}
# a group that exists only when its switch is on in 0.1: (group, 0.1 key that turned it on, test)
_SWITCHES = {
    "anchor": (
        "divergence_coef",
        lambda old: old.get("divergence") is not None and (old.get("divergence_coef") or 0) > 0,
    ),
    "kl": ("kl_coef", lambda old: (old.get("kl_coef") or 0) > 0),
}
_LEGACY_STATE_KEY = re.compile(r"^RolloutCallback\{'samples_per_prompt': \d+, 'engine': ('[^']*')\}$")


def is_legacy_checkpoint(checkpoint: Mapping[str, Any]) -> bool:
    """Whether ``checkpoint`` was written by lit_rlvr 0.1 (flat module options)."""
    return "lit_rlvr_format" not in checkpoint and "samples_per_prompt" in checkpoint.get("hyper_parameters", {})


def upgrade_module_options(old: Mapping[str, Any]) -> dict[str, Any]:
    """0.1 ``RLVRModule`` arguments → today's, as the option-group objects ``RLVRModule`` takes.

    Example:
        >>> new = upgrade_module_options({"model": "m", "samples_per_prompt": 4, "advantage": "passk",
        ...                               "advantage_options": {"k": 2}, "divergence": None, "divergence_coef": 0.0})
        >>> new["policy"].path, new["sampling"].n, new["loss"].advantage, new["anchor"]
        ('m', 4, 'passk', None)
    """
    from lit_rlvr import options as groups

    nested = _moved("model", old)
    for group, (_, on) in _SWITCHES.items():
        if not on(old):
            nested.pop(group, None)
            nested[group] = None
    if nested.get("policy", {}).get("lora") is not None and not isinstance(
        nested["policy"]["lora"], groups.LoraOptions
    ):
        nested["policy"]["lora"] = groups.LoraOptions(**dict(nested["policy"]["lora"]))
    classes = {
        "policy": groups.PolicyOptions,
        "sampling": groups.SamplingParams,
        "loss": groups.LossOptions,
        "anchor": groups.AnchorOptions,
        "kl": groups.KLOptions,
        "batching": groups.BatchingOptions,
        "scoring": groups.ScoringOptions,
        "evaluation": groups.EvalOptions,
    }
    defaults = {"sampling": {"n": 8, "max_new_tokens": 512}}  # 0.1's module defaults
    for name, cls in classes.items():
        if name in nested and nested[name] is not None:
            values = {**defaults.get(name, {}), **nested[name]}
            values = {k: v for k, v in values.items() if not (v is None and k.endswith("options"))}  # 0.1: None = {}
            if name == "sampling" and "stop" in values:
                values["stop"] = tuple(values["stop"] or ())
            nested[name] = cls(**values)
    return nested


def upgrade_checkpoint(checkpoint: dict[str, Any]) -> bool:
    """Rewrite a 0.1 checkpoint dict in place to today's layout; False if it needed nothing.

    The weights, optimizer state, loops, the DataModule's position and the RNG states are
    unchanged; the module's hyper-parameters become option groups and the rollout callback's
    state key loses the group size it no longer owns.
    """
    if not is_legacy_checkpoint(checkpoint):
        return False
    checkpoint["hyper_parameters"] = upgrade_module_options(checkpoint["hyper_parameters"])
    callbacks = checkpoint.get("callbacks", {})
    for key in list(callbacks):
        if m := _LEGACY_STATE_KEY.match(key):
            callbacks[f"RolloutCallback{{'engine': {m[1]}}}"] = callbacks.pop(key)
    checkpoint["lit_rlvr_format"] = CHECKPOINT_FORMAT
    return True


def upgrade_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A 0.1 ``lit-rlvr fit``/``validate`` or ``lit-rlvr cache`` config in today's layout, and notes.

    Sections are ``model`` / ``rollout`` / ``data`` (with or without ``init_args``) of a fit
    config, or the top level of a cache config (recognised by its ``out`` key). Keys move
    mechanically by :data:`MOVES`, so each file of a multi-file config upgrades on its own; the
    notes say what was dropped and what to check (0.1 switched the anchor and the KL term on
    with a coefficient > 0; now a group that is set is on, and ``null`` turns it off). A cache config
    gets 0.1's cache defaults where today's differ (:data:`CACHE_DEFAULTS_0_1`), so it builds the
    cache 0.1 built.

    Example:
        >>> new, notes = upgrade_config({"model": {"model": "m", "divergence": "js", "divergence_coef": 0.1},
        ...                              "rollout": {"init_args": {"samples_per_prompt": 8, "engine": "hf"}}})
        >>> new["model"], new["rollout"]
        ({'policy': {'path': 'm'}, 'anchor': {'divergence': 'js', 'coef': 0.1}, 'sampling': {'n': 8}}, {'init_args': {'engine': 'hf'}})
    """
    config = copy.deepcopy(dict(config))
    notes: list[str] = []
    if "out" in config:  # a cache config: its own keys at the top level, a DataModule's under data
        if isinstance(config.get("data"), Mapping):
            config["data"] = _moved("data", config["data"], notes)
        moved = _moved("cache", config, notes)
        _spill(moved, moved)
        if added := _fill_defaults(moved, CACHE_DEFAULTS_0_1):
            notes.append(f"{', '.join(added)}: 0.1's cache defaults, written out (today's defaults are training's)")
        _drop_linked_tokenizer(moved.get("data"), moved.get("policy", {}).get("path"), "policy.path", notes)
        return moved, notes
    out: dict[str, Any] = {}
    spilled: dict[str, Any] = {}
    for section, value in config.items():
        if section not in ("model", "rollout", "data") or not isinstance(value, Mapping):
            out[section] = value
            continue
        wrapped = "init_args" in value
        moved = _moved(section, dict(value.get("init_args", {}) if wrapped else value), notes)
        _spill(moved, spilled)
        out[section] = (
            {**{k: v for k, v in value.items() if k != "init_args"}, "init_args": moved} if wrapped else moved
        )
    for target, values in spilled.items():
        section = out.setdefault(target, {})
        _deep_update(section["init_args"] if "init_args" in section else section, values)
    model = out.get("model", {})
    model = model.get("init_args", model)
    data = out.get("data", {})
    _drop_linked_tokenizer(data.get("init_args", data), model.get("policy", {}).get("path"), "model.policy.path", notes)
    for group, (switch, on) in _SWITCHES.items():
        if isinstance(model.get(group), dict) and model[group].get("coef") == 0:
            notes.append(f"model.{group}: 0.1's {switch}: 0 meant off; now write model.{group}: null")
    return out, notes


def _drop_linked_tokenizer(data: dict | None, policy_path: str | None, source: str, notes: list[str]) -> None:
    """``data.tokenizer`` is linked to the policy's path now: drop a copy of it (keep, with a note, one that differs)."""
    if not isinstance(data, dict) or "tokenizer" not in data:
        return
    if policy_path is None or data["tokenizer"] == policy_path:
        data.pop("tokenizer")
        notes.append(f"data.tokenizer: removed (it is linked to {source} now)")
    else:
        notes.append(
            f"data.tokenizer: {data['tokenizer']!r} differs from {source} {policy_path!r}; the tokenizer is the policy's now"
        )


def _fill_defaults(into: dict[str, Any], defaults: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Set each key of ``defaults`` that ``into`` lacks (nested dicts key by key); the dotted keys set."""
    added = []
    for key, value in defaults.items():
        if isinstance(value, Mapping) and isinstance(into.setdefault(key, {}), dict):
            added += _fill_defaults(into[key], value, f"{prefix}{key}.")
        elif key not in into:
            into[key] = value
            added.append(f"{prefix}{key}")
    return added


def _spill(moved: dict[str, Any], into: dict[str, Any]) -> None:
    """Move the values ``moved`` holds for other sections (``__spilled__``) into ``into``."""
    for target, values in moved.pop("__spilled__", {}).items():
        _deep_update(into.setdefault(target, {}), values)


def _moved(section: str, options: Mapping[str, Any], notes: list[str] | None = None) -> dict[str, Any]:
    """``options`` of ``section`` with every 0.1 key moved by :data:`MOVES` (unknown keys kept);
    keys that move to another section are under ``__spilled__``."""
    moves = {old: new for s, old, new in MOVES if s == section}
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key not in moves:
            _deep_update(out, {key: value})
            continue
        new = moves[key]
        if new is None:
            if notes is not None:
                notes.append(f"{section}.{key}: removed ({GONE_WHY.get(key, 'no longer an option')})")
            continue
        target, _, path = new.rpartition(":")
        if target:
            _deep_update(out.setdefault("__spilled__", {}).setdefault(target, {}), _nest(path, value))
        else:
            _deep_update(out, _nest(path, value))
    if section == "data" and isinstance(out.get("gold_check"), dict) and out["gold_check"].get("workers", 0) is None:
        out["gold_check"] = None  # 0.1's gold_check_workers: null skipped the check
    return out


def _nest(path: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def _deep_update(into: dict, values: Mapping) -> None:
    for key, value in values.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_update(into[key], value)
        else:
            into[key] = copy.deepcopy(value) if isinstance(value, Mapping) else value


class UnsafeCheckpointError(ValueError):
    """A checkpoint that holds objects other than tensors, plain data and lit_rlvr's option groups."""


def read_checkpoint(path: str | Path | io.BytesIO) -> dict[str, Any]:
    """A checkpoint file as a dict, loaded without running code from the file.

    A file's carried sha256 is checked first (:func:`~lit_rlvr.checkpoint.verify_checkpoint`);
    then ``torch.load(weights_only=True)`` reads only tensors, plain data and the classes
    registered as safe (the option groups, :mod:`lit_rlvr.options`), so a pickled object that
    would run code on load is refused instead of run. A 0.1 checkpoint reads too
    (:func:`upgrade_checkpoint` then brings it to today's layout).

    Raises:
        UnsafeCheckpointError: the file holds other objects (naming torch's reason); load only
            files you trust, and re-save them from the Python that wrote them without such objects.
    """
    import torch

    from lit_rlvr import options  # noqa: F401  (registers the option groups as safe globals)

    if isinstance(path, (str, Path)) and Path(path).is_file():
        verify_checkpoint(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpointError(
            f"checkpoint {path}: refused to load, it holds objects that torch.load(weights_only=True) does not "
            f"allow (only tensors, plain data and lit_rlvr's option groups are loaded, so that a checkpoint cannot "
            f"run code): {str(err).splitlines()[0]}"
        ) from err
    return checkpoint


def upgraded_checkpoint(path: str | Path | io.BytesIO) -> io.BytesIO:
    """A checkpoint read safely (:func:`read_checkpoint`: its sha256 verified, ``weights_only``, a file
    that would run code refused) and upgraded in memory from the 0.1 layout (:func:`upgrade_checkpoint`),
    as the stream Lightning's ``load_from_checkpoint`` reads (the file is not changed)."""
    import torch

    checkpoint = read_checkpoint(path)
    upgrade_checkpoint(checkpoint)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    return buffer
