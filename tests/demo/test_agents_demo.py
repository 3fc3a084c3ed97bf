"""`make demo-agents` end to end, shrunk: the Makefile's own commands, each run in-process with a tiny
model, a few steps and the artifacts under tmp_path; the report's table has pass@k and the turns."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_WARMSTART = [
    "--steps",
    "2",
    "--hidden_size",
    "32",
    "--num_layers",
    "1",
    "--num_heads",
    "1",
    "--intermediate_size",
    "64",
    "--batch_size",
    "8",
    "--warmup_steps",
    "1",
    "--progress_bar",
    "false",
]


def recipe(target: str) -> list[list[str]]:
    """The ``lit-rlvr`` commands of a Makefile target, variables expanded and its ``for`` loop unrolled."""
    makefile = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^([A-Z_]+)\s*[?:]?=\s*(.*)$", makefile, re.MULTILINE))
    body = (
        re.search(rf"^{re.escape(target)}: install\n((?:\t.*\n)+)", makefile, re.MULTILINE)
        .group(1)
        .replace("\\\n", " ")
    )

    def expand(text: str) -> str:
        while (m := re.search(r"\$\(([A-Z_]+)\)", text)) is not None:
            text = text.replace(m.group(0), variables[m.group(1)])
        return text

    commands = []
    for line in body.splitlines():
        line = " ".join(expand(line).split())
        if line.startswith("for "):
            name, values, loop = re.fullmatch(r"for (\w+) in ([^;]+); do (.*); done", line).groups()
            steps = [step.strip().removesuffix("|| exit 1").strip() for step in loop.split(";") if "lit-rlvr" in step]
            commands += [shlex.split(step.replace(f"$${name}", value)) for value in values.split() for step in steps]
        elif "lit-rlvr" in line:
            commands.append(shlex.split(line))
    return [c[c.index(next(w for w in c if w.endswith("lit-rlvr"))) + 1 :] for c in commands]


def shrunk(args: list[str], tmp: Path, model_dir: Path) -> list[str]:
    """A demo command on tmp_path's artifacts, with the tiny sizes."""
    args = [
        a.replace("artifacts/", f"{tmp}/artifacts/") if not a.startswith("configs/") else str(ROOT / a) for a in args
    ]
    data = tmp / "artifacts/demo/data"
    agents = tmp / "artifacts/demo_agents"
    files = [f"--data.train.files={data / 'agents_train.jsonl'}"]
    val = f"--data.val=[{{name: countdown_val, files: {data / 'countdown_val.jsonl'}, options: {{extra_fields: [digits]}}, n_samples: 2}}]"
    if args[0] == "warmstart":
        return [*args, f"--out_dir={agents / 'base'}", *TINY_WARMSTART]
    if args[0] == "cache":
        return [
            *args,
            f"--policy.path={agents / 'base'}",
            *files,
            f"--data.cache.path={agents / 'ref_cache'}",
            "--sampling.n=2",
            "--data.cache.perfect_threshold=1",
            "--progress=false",
        ]
    if args[0] in ("fit", "validate"):
        policy = (
            [] if any(a.startswith("--model.policy.path") for a in args) else [f"--model.policy.path={agents / 'base'}"]
        )
        out = [
            *args,
            *policy,
            *files,
            val,
            "--model.sampling.n=2",
            "--trainer.limit_val_batches=1",
            "--data.val_batch_size=2",
            f"--trainer.default_root_dir={agents / 'runs'}",
            "--trainer.enable_progress_bar=false",
        ]
        if args[0] == "fit":
            method = Path(args[4]).stem
            out += [
                "--trainer.max_steps=2",
                "--trainer.val_check_interval=2",
                "--data.batch_size=2",
                f"--trainer.logger.init_args.save_dir={agents / 'runs'}",
                f"--export.dirpath={agents / 'runs' / method / 'hf'}",
            ]
            if method == "dph_f":
                out += [
                    f"--data.cache.path={agents / 'ref_cache'}",
                    "--data.cache.perfect_threshold=1",
                    "--data.cache.anchor_batch_size=4",
                ]
        return out
    return args


@pytest.mark.timeout(600)
def test_make_demo_agents_runs_shrunk_and_reports_pass_at_k_and_turns(tmp_path, tiny_model_dir):
    from lit_rlvr.cli import main

    commands = recipe("demo-agents")
    assert [c[0] for c in commands] == [
        "warmstart",
        "demo-data",
        "cache",
        "validate",
        "fit",
        "validate",
        "fit",
        "validate",
        "report",
    ]
    printed = io.StringIO()
    for args in commands:
        with contextlib.redirect_stdout(printed):
            main(shrunk(args, tmp_path, tiny_model_dir))
    agents = tmp_path / "artifacts/demo_agents"
    records = [json.loads(line) for line in (agents / "metrics.jsonl").read_text().splitlines()]
    assert [r["label"] for r in records] == ["base", "grpo", "dph_f"]
    assert all(
        {"val/countdown_val/pass@1", "val/countdown_val/pass@2", "val/countdown_val/turns"} <= set(r) for r in records
    )
    table = printed.getvalue().split("| set | run |", 1)[1]
    assert "pass@1 | pass@2 |" in table and "turns | single-turn |" in table
    assert re.search(r"\| countdown_val \| dph_f \| [0-9.]+ \| [0-9.]+ \| .* \| [0-9.]+ \| [0-9.]+ \|", table)
    manifest = json.loads((agents / "ref_cache/manifest.json").read_text())
    assert manifest["environment"]["environments"] == ["countdown@1"]
