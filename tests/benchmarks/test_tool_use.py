"""Study 5 (benchmarks/tool_use.py, benchmarks/results/study_tools_plan.md): its jobs, its commands and its report, on hand-made records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import study3  # noqa: E402
import tool_use as tu  # noqa: E402

AGENTS = Path(__file__).resolve().parents[2] / "configs" / "demo" / "agents"


def test_the_study_runs_four_methods_on_two_bases_by_three_seeds_in_block_order_on_the_agents_configs():
    jobs = tu.jobs()
    assert len({j.label for j in jobs}) == len(jobs) == 4 * 2 * 3 and all(j.steps == 120 for j in jobs)
    assert [j.label for j in jobs[:5]] == ["grpo/b0/s0", "dph_f/b0/s0", "passk/b0/s0", "max_rl/b0/s0", "grpo/b1/s0"]
    assert [(j.base_seed, j.seed) for j in jobs[::4]] == list(study3.STUDY3_BLOCKS)
    assert set(tu.METHODS) <= {p.stem for p in AGENTS.glob("*.yaml")}
    assert [j.label for j in tu.jobs(tu.SMOKE)] == ["grpo/b0/s0", "dph_f/b0/s0", "passk/b0/s0", "max_rl/b0/s0"]


def test_each_arm_reaches_its_estimator_and_the_environment_through_the_study_command(print_config, tmp_path):
    study = tu.ToolStudy(tmp_path, tu.TOOLS)
    configs = {j.method: print_config(*study.fit_args(j)) for j in tu.jobs()[:4]}
    models = {m: c["model"]["init_args"] for m, c in configs.items()}
    assert {m: model["loss"]["advantage"] for m, model in models.items()} == {
        "grpo": "grpo",
        "dph_f": "grpo",
        "passk": "passk",
        "max_rl": "max_rl",
    }
    assert models["passk"]["loss"]["advantage_options"] == {"k": 4}
    assert all(
        model["environment"]["name"] == "countdown" and model["environment"]["max_turns"] == 3
        for model in models.values()
    )
    assert models["dph_f"]["anchor"]["divergence"] == "forward_kl"
    cache = configs["dph_f"]["data"]["init_args"]["cache"]
    assert cache["path"] == str(tmp_path / "base" / "s0" / "ref_cache") and cache["perfect_threshold"] == 2
    for c in configs.values():
        assert c["trainer"]["max_steps"] == 120 and c["trainer"]["val_check_interval"] == 20
        assert c["trainer"]["logger"]["init_args"]["save_dir"].startswith(
            str(tmp_path / "runs")
        )  # the curves stay in the work folder
    assert configs["grpo"]["model"]["init_args"]["policy"]["path"] == str(tmp_path / "base" / "s0")


def record(label: str, p1: float, p8: float, tools: float, single: float, sequences: float = 3.0) -> dict:
    out = {
        "label": label,
        tu.key("turns"): 1 + tools,
        tu.key("single_turn"): single,
        tu.key("tool_calls"): tools,
        tu.key("tool_errors"): 0.01,
        tu.key("distinct_tool_sequences"): sequences,
    }
    return out | {tu.key(f"pass@{k}"): min(1.0, p1 + (p8 - p1) * (k - 1) / 7) for k in tu.LADDER}


def records() -> list[dict]:
    """GRPO collapses its tool use and gains pass@1; DPH-F keeps the tools; MaxRL = GRPO; Pass@k keeps a little more."""
    out = []
    for b, s in study3.STUDY3_BLOCKS:
        w = 0.002 * s  # pairs that differ a little
        out += [
            record(f"base/b{b}/s{s}", 0.10, 0.45, 0.55, 0.50),
            record(f"grpo/b{b}/s{s}", 0.30, 0.50, 0.10 + w, 0.90, 1.5),
        ]
        out += [
            record(f"dph_f/b{b}/s{s}", 0.25 + w, 0.60, 0.45, 0.55 - w, 2.8 + w),
            record(f"max_rl/b{b}/s{s}", 0.30, 0.50 + (w if b else -w), 0.10, 0.90, 1.5),
        ]
        out += [record(f"passk/b{b}/s{s}", 0.28 - w, 0.52, 0.20, 0.80, 1.5 + w)]
    return out


def test_the_report_judges_each_hypothesis_by_the_rule_names_its_misses_and_draws_the_curves(tmp_path):
    study = tu.ToolStudy(tmp_path / "work", tu.TOOLS)
    study.metrics.write_text("".join(json.dumps(r) + "\n" for r in records()))
    for j in tu.jobs():  # the runs' CSV logs: the training rollouts every 4 steps, the held-out validation every 20
        log = study.run_dir(j) / "logs" / "curves" / "metrics.csv"
        log.parent.mkdir(parents=True)
        rows = [f"{step},{0.1 + step / 1000},{0.5 - step / 1000},0.5,2.0,," for step in range(3, 120, 4)]
        rows += [f"{step},,,,,{0.1 + step / 1000},0.5" for step in range(19, 120, 20)]
        log.write_text(
            "step,train/reward,train/single_turn,train/tool_calls,train/distinct_tool_sequences,"
            f"val/{tu.VAL}/pass@1,val/{tu.VAL}/tool_calls\n" + "\n".join(rows) + "\n"
        )
    tu.write_report(study, tmp_path / "study_tools.md", tmp_path / "curves.png", tmp_path / "pareto.png")
    text = (tmp_path / "study_tools.md").read_text()
    assert (
        (tmp_path / "curves.png").stat().st_size > 0
        and (tmp_path / "pareto.png").stat().st_size > 0
        and "SMOKE" not in text
    )
    assert "(6 of 6)" in text and "planned runs not recorded: none" in text
    assert "**T1: HELD** — GRPO − its base" in text and "**T2: HELD** — DPH-F − GRPO" in text and "**T3: HELD**" in text
    assert "**T4: MISSED (pass@8 missed)** — MaxRL − GRPO" in text  # a miss is reported as a miss
    assert "- MaxRL − GRPO, pass@8: 0.000 ± 0.003 over 6 pairs (worst -0.004); expected +, seen =: MISS" in text
    assert "**T5: HELD** — Pass@k − GRPO" in text
    assert "- GRPO − its base, tool calls: -0.448 ± 0.002 over 6 pairs (worst -0.450); expected -, seen -: MET" in text
    assert (
        "- GRPO − its base, single-turn share: 0.400 ± 0.000 over 6 pairs (worst +0.400); expected +, seen +: MET"
        in text
    )
    assert "- MaxRL − DPH-F, tool calls: " in text and "(no direction pre-registered)" in text
    assert "| GRPO | 6 | 0.300 ± 0.000 (0.300) |" in text and "| base | 6 |" in text
    assert "![curves](curves.png)" in text and "| b1, s2 | 0.100 / 0.450 / 0.55 / 0.50 |" in text
