"""The configuration reference of docs/configuration.md, generated from the code's signatures and docstrings.

Every key a ``lit-rlvr fit``/``validate``/``cache`` config may set, with its default and the
docstring's description, one table per section and option group. The tables in
docs/configuration.md are this module's output (a test compares them), so the reference cannot
drift from the code; after changing an option, regenerate them::

    python -m lit_rlvr.tools.reference --write docs/configuration.md
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- generated: python -m lit_rlvr.tools.reference -->", "<!-- end of generated reference -->"
_MISSING = inspect.Parameter.empty


@dataclasses.dataclass(frozen=True)
class Key:
    """One configurable key: its dotted path, its default (or required), its type and what it does."""

    path: str
    default: str
    type: str
    doc: str


def _docs(obj) -> dict[str, str]:
    """``{argument: description}`` from a Google-style docstring (of a class or its ``__init__``; an option
    group that extends another has its base's fields documented in the base)."""
    import docstring_parser

    out = {}
    groups = [c for c in obj.__mro__[1:] if dataclasses.is_dataclass(c)] if dataclasses.is_dataclass(obj) else []
    for source in (obj, getattr(obj, "__init__", None), *groups):
        text = inspect.getdoc(source) if source is not None else None
        if text:
            for p in docstring_parser.parse(text).params:
                for name in re.split(r"\s*/\s*", p.arg_name):  # "a / b: shared text"
                    out.setdefault(name, " ".join((p.description or "").split()))
    return out


def _rst_to_md(text: str) -> str:
    """Docstring markup as markdown: ``x`` → `x`, :class:`~a.b.C` → `C`."""
    text = re.sub(r":(?:class|func|meth|data|mod|attr):`~?([^`]+)`", lambda m: f"`{m.group(1).split('.')[-1]}`", text)
    text = text.replace("``", "`")
    return text.replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    text = re.sub(r"\b(?:lit_rlvr|lightning\.pytorch\.cli|typing)\.(?:\w+\.)*", "", text)
    return text.replace("|", "\\|")


def _default(value: Any) -> str:
    if value is _MISSING or value is dataclasses.MISSING:
        return "required"
    if dataclasses.is_dataclass(value):
        return "(group)"
    if callable(value) and not isinstance(value, type):
        return f"`{value.__module__}.{value.__qualname__}`" if hasattr(value, "__qualname__") else f"`{value!r}`"
    text = (
        {None: "null", True: "true", False: "false"}.get(value, value)
        if isinstance(value, (bool, type(None)))
        else value
    )
    if isinstance(text, tuple):
        text = list(text)
    return f"`{text!r}`" if isinstance(text, str) and text not in ("null", "true", "false") else f"`{text}`"


def _fields(cls) -> list[tuple[str, Any, Any]]:
    """``(name, annotation, default)`` of a dataclass's fields or a callable's parameters."""
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        out = []
        for f in sorted(dataclasses.fields(cls), key=lambda f: f.kw_only):  # in the order of __init__
            default = (
                f.default
                if f.default is not dataclasses.MISSING
                else (f.default_factory() if f.default_factory is not dataclasses.MISSING else _MISSING)
            )
            out.append((f.name, hints.get(f.name, f.type), default))
        return out
    target = cls.__init__ if isinstance(cls, type) else cls
    hints = typing.get_type_hints(target)
    params = [
        p for p in inspect.signature(target).parameters.values() if p.name != "self" and p.kind is not p.VAR_KEYWORD
    ]
    return [(p.name, hints.get(p.name, p.annotation), p.default) for p in params]


def keys(prefix: str, cls, skip: tuple[str, ...] = (), defaults: Any = None) -> list[Key]:
    """The keys of ``cls`` (a class, a dataclass group or a function) under ``prefix``; ``defaults``:
    the group instance its owner defaults to, when that is not the class's own defaults."""
    docs = _docs(cls)
    return [
        Key(
            f"{prefix}.{name}" if prefix else name,
            _default(getattr(defaults, name) if defaults is not None else default),
            _type_name(annotation),
            _rst_to_md(docs.get(name, "")),
        )
        for name, annotation, default in _fields(cls)
        if name not in skip
    ]


def sections() -> list[tuple[str, str, list[Key]]]:
    """``(title, what it is, keys)`` for every section and option group, in the order of the docs."""
    from lit_rlvr import options
    from lit_rlvr.callbacks import HFExport, PassCountsWriter, RolloutCallback
    from lit_rlvr.data.datamodule import CacheOptions, DatasetSpec, GoldCheck, PromptDataModule, ValSet
    from lit_rlvr.data.prompts import PromptFormat
    from lit_rlvr.data.readers import HFSource
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.tools.cache import build_cache

    groups = (
        "policy",
        "sampling",
        "loss",
        "entropy",
        "anchor",
        "kl",
        "batching",
        "scoring",
        "evaluation",
        "rollout_correction",
        "dynamic_sampling",
        "environment",
    )
    classes = {
        "policy": options.PolicyOptions,
        "sampling": options.SamplingParams,
        "loss": options.LossOptions,
        "entropy": options.EntropyOptions,
        "anchor": options.AnchorOptions,
        "kl": options.KLOptions,
        "batching": options.BatchingOptions,
        "scoring": options.ScoringOptions,
        "evaluation": options.EvalOptions,
        "rollout_correction": options.RolloutCorrection,
        "dynamic_sampling": options.DynamicSampling,
        "environment": options.EnvironmentOptions,
    }
    out = [
        (
            "`model:` (RLVRModule)",
            "the recipe: one option group per concept, then the module's own switches",
            keys("model", RLVRModule, skip=groups),
        )
    ]
    owner = inspect.signature(RLVRModule.__init__).parameters
    for name in groups:
        cls, default = classes[name], owner[name].default
        what = inspect.getdoc(cls).split("\n")[0]
        if name == "sampling":
            what = "the training rollouts, read by the rollout callback (`lit-rlvr cache` takes the same group, same defaults)"
        if name == "batching":
            what = what.rstrip(".") + "; `lit-rlvr cache` takes the same group, same defaults, for its log π_ref passes"
        instance = default if dataclasses.is_dataclass(default) else None
        out.append(
            (f"`model.{name}` ({cls.__name__})", _rst_to_md(what), keys(f"model.{name}", cls, defaults=instance))
        )
    out.append(
        (
            "`model.policy.lora` (LoraOptions)",
            "peft LoRA settings (None = full fine-tuning)",
            keys("model.policy.lora", options.LoraOptions),
        )
    )
    out.append(
        (
            "`rollout:` (RolloutCallback)",
            "how rollouts are generated: the engine, its weight sync and its checks",
            keys("rollout.init_args", RolloutCallback),
        )
    )
    out.append(
        (
            "`data:` (PromptDataModule)",
            "the prompts: datasets, formatting, order, start-up checks, the reference cache "
            "(`data.tokenizer` is linked to `model.policy.path`: never set it)",
            keys("data", PromptDataModule, skip=("tokenizer",)),
        )
    )
    out.append(
        (
            "`data.train` (DatasetSpec) and `data.val[i]` (ValSet)",
            "a dataset: local files or a Hugging Face split, read by an adapter",
            keys("data.train", DatasetSpec) + [k for k in keys("data.val[i]", ValSet) if k.path.endswith("n_samples")],
        )
    )
    out.append(
        (
            "`data.train.hf` (HFSource)",
            "a Hugging Face `datasets` split instead of files",
            keys("data.train.hf", HFSource),
        )
    )
    out.append(("`data.prompt` (PromptFormat)", "how a row becomes the prompt text", keys("data.prompt", PromptFormat)))
    out.append(
        (
            "`data.gold_check` (GoldCheck)",
            _rst_to_md(inspect.getdoc(GoldCheck).split("\n")[0]),
            keys("data.gold_check", GoldCheck),
        )
    )
    out.append(
        (
            "`data.cache` (CacheOptions)",
            _rst_to_md(inspect.getdoc(CacheOptions).split("\n")[0]),
            keys("data.cache", CacheOptions),
        )
    )
    out.append(
        (
            "`export:` (HFExport) and `pass_counts:` (PassCountsWriter)",
            "what a run writes besides its checkpoints",
            keys("export", HFExport) + keys("pass_counts", PassCountsWriter),
        )
    )
    out.append(
        (
            "`lit-rlvr cache`",
            "the reference cache tool: its own keys beside `data:` (the training run's DataModule), "
            "`policy:`, `sampling:`, `batching:`, `scoring:` and `environment:` (the same groups as `model.policy`, "
            "`model.sampling`, `model.batching`, `model.scoring`, `model.environment`, with the same defaults; `batching` sets "
            "the log π_ref passes)",
            keys(
                "",
                build_cache,
                skip=("data", "policy", "sampling", "batching", "scoring", "environment", "rank", "world_size"),
            ),
        )
    )
    return out


def moves_table() -> list[str]:
    """The 0.1 → 0.2 key table (:data:`lit_rlvr.upgrade.MOVES`) as markdown lines."""
    from lit_rlvr.upgrade import GONE_WHY, MOVES

    where = {"model": "model.", "rollout": "rollout.init_args.", "data": "data.", "cache": ""}
    lines = ["| 0.1 key | key now |", "|---|---|"]
    for section, old, new in MOVES:
        target, _, path = (new or "").rpartition(":")
        now = f"`{where[target or section]}{path}`" if new else f"removed: {GONE_WHY.get(old, 'no longer an option')}"
        lines.append(f"| `{where[section]}{old}`{' (`lit-rlvr cache`)' if section == 'cache' else ''} | {now} |")
    return lines


def generated() -> str:
    """The generated part of docs/configuration.md (between :data:`BEGIN` and :data:`END`)."""
    lines = [BEGIN, ""]
    for title, what, rows in sections():
        lines += [
            f"### {title}",
            "",
            what[0].upper() + what[1:] + ("" if what.endswith(".") else "."),
            "",
            "| key | default | type | what |",
            "|---|---|---|---|",
        ]
        lines += [f"| `{k.path}` | {k.default} | `{k.type}` | {k.doc} |" for k in rows]
        lines.append("")
    lines += [
        "### Upgrading a 0.1 config or checkpoint",
        "",
        "Where each key of the flat 0.1 layout went (`lit-rlvr upgrade config OLD.yaml` rewrites a config; 0.1 "
        "checkpoints load as they are):",
        "",
        *moves_table(),
        "",
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lit_rlvr.tools.reference", description=__doc__.split("\n")[0])
    parser.add_argument("--write", metavar="FILE", help="replace the generated part of FILE (docs/configuration.md)")
    args = parser.parse_args(argv)
    text = generated()
    if args.write is None:
        print(text)
        return
    path = Path(args.write)
    doc = path.read_text()
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    path.write_text(doc[:start] + text + doc[end:])


if __name__ == "__main__":
    main()
