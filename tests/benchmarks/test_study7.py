"""Study 7 (benchmarks/study7.py, benchmarks/results/study7.md): its jobs, every arm's command in both environments,
the bases' commands and the report, on hand-made records. Nothing here runs a fit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import study3  # noqa: E402
import study7  # noqa: E402
import tool_use  # noqa: E402

from lit_rlvr.options import ScoringOptions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_study_runs_three_arms_in_two_environments_on_two_bases_by_three_seeds_in_block_order():
    jobs = study7.jobs()
    assert len({j.label for j in jobs}) == len(jobs) == 2 * 3 * 2 * 3 and all(j.steps == 120 for j in jobs)
    assert [j.label for j in jobs[:6]] == [
        f"{e}_{a}/b0/s0" for e in ("countdown", "sql") for a in ("grpo", "dph_f", "tool_call")
    ]
    assert [(j.base_seed, j.seed) for j in jobs[::6]] == list(study3.STUDY3_BLOCKS)
    for env in study7.ENVS.values():
        assert {f"{j.method}.yaml" for j in jobs} | {"base.yaml", "record.yaml", "cache.yaml", "warmstart.yaml"} <= {
            p.name for p in (ROOT / env.configs).glob("*.yaml")
        }
    assert len(study7.jobs(study7.SMOKE)) == 6 and study7.SMOKE.warm("sql") == 5 and study7.STUDY7.warm("sql") == 300
    assert all(study7.env_of(h.variant) == study7.env_of(h.against) for h in study7.HYPOTHESES)


def test_every_arms_command_parses_and_reaches_its_environment_estimator_anchors_and_bonus(print_config, tmp_path):
    """Each arm's `lit-rlvr fit` line in both environments, as the study builds it, through the CLI's parser."""
    study = study7.AgentStudy(tmp_path, study7.STUDY7)
    environments = {"countdown": "countdown", "sql": "sql"}
    for job in study7.jobs()[:6]:
        env, arm = study7.env_of(job.variant), job.variant.split("_", 1)[1]
        config = print_config(*study.fit_args(job))
        model, data = config["model"]["init_args"], config["data"]["init_args"]
        base = tmp_path / f"base_{env}" / "s0"
        assert model["environment"]["name"] == environments[env] and model["policy"]["path"] == str(base), job.label
        assert model["loss"]["advantage"] == "grpo" and model["loss"]["advantage_options"] == {"std": "population"}
        assert data["val"][0]["name"] == study7.ENVS[env].val
        assert (model.get("anchor") is not None) == (arm == "dph_f"), job.label
        if arm == "dph_f":
            assert model["anchor"]["divergence"] == "forward_kl" and data["cache"]["path"] == str(base / "ref_cache")
        mix = ScoringOptions(**model["scoring"]).mix()
        if arm == "tool_call":
            assert mix.names == ["row", "tool_call"] and mix.weights == [1.0, 0.1] and mix.trajectory_terms == [1]
            assert mix.correctness == "row"
        else:
            assert mix.trajectory_terms == []
        assert config["trainer"]["max_steps"] == 120 and config["trainer"]["val_check_interval"] == 20
        assert config["trainer"]["logger"]["init_args"]["save_dir"] == str(study.run_dir(job))
        assert config["trainer"]["callbacks"][-1]["class_path"] == "diversity_collapse.FitTimer"


def test_each_environments_bases_and_validations_use_its_own_configs(print_config, tmp_path):
    from lit_rlvr.demo.warmstart import build_parser

    study = study7.AgentStudy(tmp_path, study7.STUDY7)
    seen = []
    study.lit = lambda *args, log: seen.append(args)
    study.prepare()
    warm = {a[a.index("--config") + 1]: a for a in seen if a[0] == "warmstart"}
    assert set(warm) == {f"{e.configs}/warmstart.yaml" for e in study7.ENVS.values()} and len(seen) == 1 + 4 * 2
    sql = build_parser().parse_args(list(warm["configs/demo/sql_agent/warmstart.yaml"][1:]))
    assert (sql.steps, sql.max_seconds, sql.threads, sql.vocab_size) == (300, None, 1, 192)
    assert sql.out_dir == str(tmp_path / "base_sql" / "s0") or sql.out_dir == str(tmp_path / "base_sql" / "s1")
    caches = [a for a in seen if a[0] == "cache"]
    assert {a[2] for a in caches} == {f"{e.configs}/cache.yaml" for e in study7.ENVS.values()}
    seen.clear()
    study.validate("sql_base/b0/s1", tmp_path / "base_sql" / "s0", 1, "sql", None, None)
    config = print_config(*seen[0])
    assert config["model"]["init_args"]["environment"]["name"] == "sql" and config["trainer"]["limit_val_batches"] == 4
    assert config["model"]["init_args"]["sampling"]["seed"] == 1001
    assert config["trainer"]["callbacks"][0]["init_args"]["label"] == "sql_base/b0/s1"


def behaviour(label: str, p1: float, tools: float, single: float, sequences: float) -> dict:
    env = study7.ENVS[study7.env_of(label.split("/")[0])].val
    out = {"label": label, f"val/{env}/turns": 1 + tools, f"val/{env}/single_turn": single}
    out |= {
        f"val/{env}/tool_calls": tools,
        f"val/{env}/tool_errors": 0.0,
        f"val/{env}/distinct_tool_sequences": sequences,
    }
    return out | {f"val/{env}/pass@{k}": min(1.0, p1 * k) for k in tool_use.LADDER}


def records() -> list[dict]:
    """Countdown: GRPO drops the checks, DPH-F keeps them, the bonus keeps the calls but not their diversity. SQL: GRPO
    keeps querying with fewer distinct sequences; DPH-F keeps more; the bonus as GRPO."""
    out = []
    for b, s in study3.STUDY3_BLOCKS:
        w = 0.01 * s
        out += [
            behaviour(f"countdown_base/b{b}/s{s}", 0.10, 0.63, 0.43, 5.3),
            behaviour(f"countdown_grpo/b{b}/s{s}", 0.12, 0.24 + w, 0.77, 2.7 + w),
            behaviour(f"countdown_dph_f/b{b}/s{s}", 0.11, 0.61, 0.45 - w, 5.1 + w),
            behaviour(f"countdown_tool_call/b{b}/s{s}", 0.12, 0.95 + w, 0.05, 2.0 + w),
            behaviour(f"sql_base/b{b}/s{s}", 0.79, 0.79, 0.22, 1.8),
            behaviour(f"sql_grpo/b{b}/s{s}", 0.86, 0.87 + w, 0.13, 1.4 + w),
            behaviour(f"sql_dph_f/b{b}/s{s}", 0.85, 0.86, 0.14, 1.7 + w),
            behaviour(f"sql_tool_call/b{b}/s{s}", 0.86, 0.87 + w, 0.13, 1.4 + w),
        ]
    return out


def test_the_report_judges_each_hypothesis_per_environment_and_draws_its_figures(tmp_path):
    study = study7.AgentStudy(tmp_path / "work", study7.STUDY7)
    study.metrics.write_text("".join(json.dumps(r) + "\n" for r in records()))
    for j in study7.jobs():  # the runs' CSV logs: the training rollouts every 4 steps
        log = study.run_dir(j) / "logs" / "curves" / "metrics.csv"
        log.parent.mkdir(parents=True)
        rows = [f"{step},0.5,0.5,0.5,2.0" for step in range(3, 120, 4)]
        log.write_text(
            "step,train/reward,train/tool_calls,train/single_turn,train/distinct_tool_sequences\n" + "\n".join(rows)
        )
    study7.write_report(study, tmp_path / "study7_results.md", tmp_path / "curves.png", tmp_path / "behaviour.png")
    text = (tmp_path / "study7_results.md").read_text()
    assert (tmp_path / "curves.png").stat().st_size > 0 and (tmp_path / "behaviour.png").stat().st_size > 0
    assert "(6 of 6)" in text and "Planned runs not recorded: none" in text and "SMOKE" not in text
    for held in ("A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8"):
        assert f"**{held}: HELD**" in text, held
    assert (
        "- SQL toy (tool needed): GRPO − its base, distinct tool sequences: -0.390 ± 0.009 over 6 pairs (worst -0.400); "
        "expected -, seen -: MET" in text
    )
    assert "## countdown checker (tool optional): at the end" in text and "| GRPO + tool-call bonus | 6 |" in text
    assert "(no direction pre-registered)" in text


def test_the_command_line_mirrors_the_other_studies(tmp_path):
    args = study7.parse_args(["--smoke", "--work", str(tmp_path), "--slots", "1", "--deadline", "2026-12-07T12:00"])
    assert args.smoke and args.work == tmp_path and args.slots == 1 and args.deadline.tzinfo is not None
    assert study7.parse_args(["--report-only"]).report_only
