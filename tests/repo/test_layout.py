"""The package layout is the data flow: no import runs back up it (CONTRIBUTING.md, "Layers").

Every ``lit_rlvr`` import statement (module level or inside a function) is an edge between two
top-level parts of the package; each part may import only the parts listed here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "lit_rlvr"
CORE = {
    "registry",
    "plugins",
    "strategies",
    "flags",
    "atomic",
    "checkpoint",
    "functional",
    "policy",
    "rewards",
    "metrics",
    "envs",
    "rollout",
    "contracts",
    "options",
    "lockstep",
    "upgrade",
    "cache",
    "data",
    "ranks",
    "callbacks",
    "module",
}
ALLOWED = {
    "registry": set(),
    "plugins": set(),
    "vllm_plugin": set(),  # run inside vLLM's processes: imports nothing of lit_rlvr
    "strategies": set(),
    "flags": set(),  # command-line flags giving a mapping merge into the configured one (fit and cache)
    "atomic": set(),  # files written whole or not at all
    "checkpoint": {"atomic"},  # checkpoints carrying their checksum
    "functional": {"registry"},
    "policy": {"functional"},
    "rewards": {"registry", "plugins"},
    "metrics": {"functional"},
    "envs": {
        "registry",
        "plugins",
        "rewards",
    },  # environments answer model turns; the SQL one runs the rewards' sandbox, final answers are scored by rewards
    "rollout": {
        "policy",
        "registry",
        "vllm_plugin",
        "envs",
    },  # the server engine registers the weight-transfer backend trainer-side too; multi-turn rollouts step environments
    "contracts": {
        "rollout",
        "functional",
        "policy",
    },  # the batches, the step tensors and their splitter, what callbacks require of the module
    "options": {"functional", "policy", "rewards", "rollout"},  # the recipe's option groups
    "lockstep": {"functional"},
    "upgrade": {"options", "checkpoint"},  # the 0.1 layout, read into the option groups; checkpoints read safely
    "cache": {"atomic", "policy", "rollout", "contracts"},
    "data": {
        "registry",
        "plugins",
        "rewards",
        "cache",
        "contracts",
        "envs",
    },  # a TRL environment's tools are listed in its prompts
    "ranks": set(),  # rank-fault detection: an operation fails on every rank or on none (torch.distributed only)
    "callbacks": {"atomic", "policy", "rollout", "contracts", "ranks"},
    "module": {
        "checkpoint",
        "functional",
        "metrics",
        "policy",
        "rewards",
        "contracts",
        "lockstep",
        "options",
        "upgrade",
    },
    "demo": CORE,  # the demo plugs into lit_rlvr like a user's package
    "tools": CORE | {"demo"},
    "cli": CORE | {"demo", "tools"},
}


def part_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.name != "__init__.py" else "__init__"


def imported_parts(path: Path) -> set[str]:
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith("lit_rlvr.") or name == "lit_rlvr":
                bits = name.split(".")
                if len(bits) > 1:
                    parts.add(bits[1])
    return parts


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_data_flow(path):
    part = part_of(path)
    if part == "__init__":
        return
    assert part in ALLOWED, f"{part}: a new top-level part of lit_rlvr needs its place in the layout"
    back_edges = imported_parts(path) - ALLOWED[part] - {part}
    assert not back_edges, f"{path.relative_to(PACKAGE)} ({part}) imports {sorted(back_edges)}"
