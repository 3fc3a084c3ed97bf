"""Command-line flags that give a mapping merge into the configured mapping, as the dotted flags do.

jsonargparse replaces a dict option given whole on the command line (``--K='{a: 1}'``), while
``--K.a=1`` merges into it; ``lit-rlvr fit`` and ``lit-rlvr cache`` make both merge
(:func:`merge_mapping_flags`).
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

from jsonargparse import ArgumentParser


def mapping_flags(args: list[str], sections: tuple[str, ...]) -> dict[int, tuple[str, dict]]:
    """``{index: (key, mapping)}`` of the flags ``--<key>={...}`` starting with one of ``sections`` whose
    value is a non-empty mapping."""
    import yaml

    found = {}
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if eq and key.startswith(sections):
            with contextlib.suppress(yaml.YAMLError):
                if isinstance(mapping := yaml.safe_load(value), dict) and mapping:
                    found[i] = (key[2:], mapping)
    return found


def lookup(config: Any, key: str) -> Any:
    """The value at ``key`` (``model.loss.x`` or ``model.init_args.loss.x``) of a parsed config, through
    namespaces and dicts; None if absent."""
    first, _, rest = key.partition(".")
    for path in (key, f"{first}.init_args.{rest}"):
        node = config
        for part in path.split("."):
            node = node.get(part) if hasattr(node, "get") else None
        if node is not None:
            return node
    return None


def merged(base: dict, update: dict) -> dict:
    """``base`` updated with ``update``: nested mappings merged key by key, a ``None`` removes its key.

    Example:
        >>> merged({"a": 1, "sleep": True, "env": {"X": "1"}}, {"b": 2, "sleep": None, "env": {"Y": "2"}})
        {'a': 1, 'env': {'X': '1', 'Y': '2'}, 'b': 2}
    """
    out = dict(base)
    for key, value in update.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def merge_mapping_flags(parser: ArgumentParser, args: list[str], sections: tuple[str, ...] = ("--",)) -> list[str]:
    """``--K='{a: 1}'`` for a dict option ``K`` merges into K's value from the config files, as ``--K.a=1`` does.

    jsonargparse replaces a dict given whole on the command line:
    ``--rollout.init_args.engine_options='{kv_cache_memory_bytes: 1}'`` dropped the config's
    ``gpu_memory_utilization`` without a word. Each such flag becomes the value
    K has without it (the arguments parsed once without the mapping flags) updated with the flag's
    keys (:func:`merged`: ``a: null`` removes ``a``, so that the callee's default applies; the dotted
    ``--K.a=null`` reaches ``lit-rlvr fit`` here as ``--K={a: null}``). Option groups
    (``--model.loss={dual_clip: null}``) merge in jsonargparse already; ``{}`` still empties a dict.
    ``sections``: the prefixes of the flags considered (``lit-rlvr fit``: ``--model.``, ``--data.``,
    ``--rollout.``; by default every flag).
    """
    import yaml

    flags = mapping_flags(args, sections)
    if not flags:
        return args
    rest = [a for i, a in enumerate(args) if i not in flags and not a.startswith(("--print_config", "--help", "-h"))]
    try:  # an error here is the final parse's to report
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            base = parser.parse_args(rest)
    except (SystemExit, Exception):
        return args
    base = base.get(str(base.get("subcommand")), base)
    out = list(args)
    for i, (key, mapping) in flags.items():
        value = lookup(base, key)
        if value is None and "." in key and isinstance(lookup(base, key.rsplit(".", 1)[0]), dict):
            value = {}  # a key inside a dict option that the config does not set (engine_options.server_env)
        if isinstance(value, dict):
            text = yaml.safe_dump(merged(value, mapping), default_flow_style=True, sort_keys=False, width=float("inf"))
            out[i] = f"--{key}={text.strip()}"
    return out
