"""`make demo-agents` end to end, shrunk: the Makefile's own commands (its two lanes, the countdown
checker's and the SQL agent's, one after the other), each run in-process with a tiny model, a few steps
and the artifacts under tmp_path; the report's table has both environments' pass@k, turns and tool calls."""

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
    """The ``lit-rlvr`` commands of a Makefile target, variables expanded, its ``for`` loop unrolled,
    a lane's log redirection dropped and ``$(MAKE) … TARGETS`` replaced by those targets' commands."""
    makefile = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^([A-Z_]+)\s*[?:]?=\s*(.*)$", makefile, re.MULTILINE))
    # a target's own variables (``agents-sql: LANE := sql``), and the rule it is built by: its own, or
    # one written for a list of targets naming it (``$(AGENTS_LANES): install``)
    variables |= dict(re.findall(rf"^{re.escape(target)}: ([A-Z_]+) :=[ \t]*(.*)$", makefile, re.MULTILINE))
    rules = [re.escape(target)] + [
        re.escape(f"$({name})") for name, value in variables.items() if target in value.split()
    ]
    body = (
        re.search(rf"^(?:{'|'.join(rules)}): install\n((?:\t.*\n)+)", makefile, re.MULTILINE)
        .group(1)
        .replace("\\\n", " ")
    )

    def expand(text: str) -> str:
        text = re.sub(
            r"\$\(addprefix ([^,]+),\$\(([A-Z_]+)\)\)",
            lambda m: " ".join(m[1] + v for v in variables[m[2]].split()),
            text,
        )
        while (m := re.search(r"\$\(([A-Z_]+)\)", text)) is not None:
            text = text.replace(m.group(0), variables[m.group(1)])
        return text

    def command(step: str) -> list[str]:
        return shlex.split(re.sub(r"\$\(call agents_log,[^)]*\)+", "", step))

    commands = []
    for line in body.splitlines():
        line = line.strip().removeprefix("@")
        if line.startswith("$(MAKE)"):
            commands += [[".venv/bin/lit-rlvr", *c] for lane in line.split()[4:] for c in recipe(lane)]
            continue
        line = " ".join(expand(line).split())
        if line.startswith("for "):
            name, values, loop = re.fullmatch(r"for (\w+) in ([^;]+); do (.*); done", line).groups()
            steps = [step for step in loop.split("; ") if "lit-rlvr" in step]
            commands += [command(step.replace(f"$${name}", value)) for value in values.split() for step in steps]
        elif "lit-rlvr" in line:  # one command, or several joined by the shell (`a & b && c || …`)
            commands += [command(step) for step in re.split(r" (?:&&|\|\||;|&) ", line) if "lit-rlvr" in step]
    return [c[c.index(next(w for w in c if w.endswith("lit-rlvr"))) + 1 :] for c in commands]


def shrunk(args: list[str], tmp: Path) -> list[str]:
    """A demo command on tmp_path's artifacts, with the tiny sizes (the SQL agent's lane where its configs are named)."""
    sql = any("configs/demo/sql_agent/" in a for a in args)
    args = [
        a.replace("artifacts/", f"{tmp}/artifacts/") if not a.startswith("configs/") else str(ROOT / a) for a in args
    ]
    data = tmp / "artifacts/demo/data"
    agents = tmp / "artifacts/demo_agents"
    base, cache, prefix = (
        (agents / "sql_base", agents / "sql_ref_cache", "sql_") if sql else (agents / "base", agents / "ref_cache", "")
    )
    if sql:
        files = [f"--data.train.files={data / 'sql_agent_train.jsonl'}"]
        val = f"--data.val=[{{name: sql_agent_val, files: {data / 'sql_agent_val.jsonl'}, n_samples: 2}}]"
    else:
        files = [f"--data.train.files={data / 'agents_train.jsonl'}"]
        val = f"--data.val=[{{name: countdown_val, files: {data / 'countdown_val.jsonl'}, options: {{extra_fields: [digits]}}, n_samples: 2}}]"
    if args[0] == "warmstart":
        return [*args, f"--out_dir={base}", *TINY_WARMSTART]
    if args[0] == "cache":
        return [
            *args,
            f"--policy.path={base}",
            *files,
            f"--data.cache.path={cache}",
            "--sampling.n=2",
            "--data.cache.perfect_threshold=1",
            "--progress=false",
        ]
    if args[0] in ("fit", "validate"):
        policy = [] if any(a.startswith("--model.policy.path") for a in args) else [f"--model.policy.path={base}"]
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
        if not any(a.startswith("--trainer.logger=") or "record.yaml" in a for a in args):
            out.append(f"--trainer.logger.init_args.save_dir={agents / 'runs'}")
        if args[0] == "fit":
            method = Path(args[4]).stem
            out += [
                "--trainer.max_steps=2",
                "--trainer.val_check_interval=2",
                "--data.batch_size=2",
                f"--export.dirpath={agents / 'runs' / (prefix + method) / 'hf'}",
            ]
            if method == "dph_f":
                out += [
                    f"--data.cache.path={cache}",
                    "--data.cache.perfect_threshold=1",
                    "--data.cache.anchor_batch_size=4",
                ]
        return out
    return args


@pytest.mark.timeout(900)
def test_make_demo_agents_runs_both_lanes_shrunk_and_reports_pass_at_k_turns_and_tool_calls(tmp_path):
    from lit_rlvr.cli import main

    commands = recipe("demo-agents")
    lane = ["warmstart", "cache", "validate", "validate", "fit", "validate", "fit", "validate"]
    assert [c[0] for c in commands] == ["demo-data", *lane, *lane, "report", "report", "report"]
    agents = tmp_path / "artifacts/demo_agents"
    printed = io.StringIO()
    for args in commands:
        if (
            args[0] == "report" and not (agents / "metrics.jsonl").exists()
        ):  # the Makefile's `cat` of the lanes' records
            lanes = [agents / "metrics_countdown.jsonl", agents / "metrics_sql.jsonl"]
            (agents / "metrics.jsonl").write_text("".join(p.read_text() for p in lanes))
        with contextlib.redirect_stdout(printed):
            main(shrunk(args, tmp_path))
    records = [json.loads(line) for line in (agents / "metrics.jsonl").read_text().splitlines()]
    assert [r["label"] for r in records] == ["base", "grpo", "dph_f"] * 2
    for r, name in zip(records, ["countdown_val"] * 3 + ["sql_agent_val"] * 3):
        assert {f"val/{name}/pass@1", f"val/{name}/pass@2", f"val/{name}/turns", f"val/{name}/tool_calls"} <= set(r)
    table = printed.getvalue().split("| set | run |", 1)[1]
    assert "pass@1 | pass@2 |" in table and "turns | tool calls | single-turn |" in table
    for name in ("countdown_val", "sql_agent_val"):
        assert re.search(
            rf"\| {name} \| dph_f \| [0-9.]+ \| [0-9.]+ \| .* \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|", table
        ), table
    for png in ("passk.png", "curves_countdown.png", "curves_sql.png"):
        assert (agents / png).stat().st_size > 0
    manifest = json.loads((agents / "ref_cache/manifest.json").read_text())
    assert manifest["environment"]["environments"] == ["countdown@1"]
    manifest = json.loads((agents / "sql_ref_cache/manifest.json").read_text())
    assert manifest["environment"]["environments"] == ["sql@1"]
