"""The study's pre-registered selection rule (benchmarks/results/study_plan.md), on hand-made records."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from datetime import UTC

import diversity_collapse  # noqa: E402
import study1  # noqa: E402
import study2  # noqa: E402
import study3  # noqa: E402
import study4  # noqa: E402
import study_methods  # noqa: E402
import study_runner  # noqa: E402
import study_stats  # noqa: E402

SELECT = f"val/{study_runner.SELECT}"


def study_with(tmp_path: Path, records: list[dict]) -> study_runner.Study:
    study = study_runner.Study(tmp_path)
    study.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    return study


def record(label: str, p1: float, p16: float) -> dict:
    return {"label": label, f"{SELECT}/pass@1": p1, f"{SELECT}/pass@16": p16}


def test_rule_picks_highest_pass16_among_configurations_that_raise_pass1_by_004(tmp_path):
    a, b, c = list(study1.ABLATION)[:3]
    study = study_with(
        tmp_path,
        [
            record("base/b0/s0", 0.40, 0.98),
            record(f"{a}/b0/s0", 0.45, 0.90),
            record(f"{b}/b0/s0", 0.44, 0.95),
            record(f"{c}/b0/s0", 0.43, 0.99),
        ],
    )
    name, flags, _ = study1.choose_dph(study)
    assert name == b and flags == study1.ABLATION[b]  # c has the highest pass@16 but raises pass@1 by 0.03 only


def test_rule_compares_with_the_base_validated_with_the_ablations_seeds_only(tmp_path):
    """Validations of base 0 with other seeds (the robust part adds them) do not move the threshold."""
    a, b = list(study1.ABLATION)[:2]
    records = [record("base/b0/s0", 0.41, 0.98), record(f"{a}/b0/s0", 0.46, 0.85), record(f"{b}/b0/s0", 0.445, 0.94)]
    before = study1.choose_dph(study_with(tmp_path, records))[0]
    after = study1.choose_dph(
        study_with(tmp_path, [*records, record("base/b0/s1", 0.39, 0.98), record("base/b0/s2", 0.39, 0.98)])
    )[0]
    assert before == after == a


def test_rule_without_a_qualifying_configuration_takes_the_best_sum(tmp_path):
    a, b = list(study1.ABLATION)[:2]
    study = study_with(
        tmp_path, [record("base/b0/s0", 0.50, 0.98), record(f"{a}/b0/s0", 0.45, 0.90), record(f"{b}/b0/s0", 0.40, 0.97)]
    )
    name, _, why = study1.choose_dph(study)
    assert name == b and "no configuration reached" in why[0]
    assert study_stats.mean([0.1, 0.3]) == pytest.approx(0.2)


def test_methods_preset_runs_every_method_config_against_grpo_with_its_knob_swept():
    jobs = study1.methods_jobs()
    configs = {p.stem for p in (Path(__file__).resolve().parents[2] / "configs" / "demo").glob("*.yaml")}
    assert set(study_methods.METHODS) <= configs and set(study_methods.METHODS) <= set(
        study_methods.EXPECTED
    )  # EXPECTED also holds the baselines (study 3)
    labels = {j.label for j in jobs}
    assert len(labels) == len(jobs)
    for method in ("grpo", *study_methods.METHODS):  # every method at its config's setting on 2 bases × 3 seeds
        assert {f"{method}/b{b}/s{s}" for b in (0, 1) for s in (0, 1, 2)} <= labels
    assert {
        "clip_cov_0.005/b0/s0",
        "clip_cov_0.05/b0/s1",
        "unlikeliness_0.5/b0/s1",
    } <= labels and "nsr_0.1/b0/s0" not in labels


@pytest.mark.parametrize("method", sorted(m for m, (flags, _) in study_methods.METHODS.items() if flags))
def test_each_knob_value_of_the_sweep_parses_and_reaches_its_option(method, print_config):
    root = Path(__file__).resolve().parents[2] / "configs" / "demo"
    flags, values = study_methods.METHODS[method]
    value = values[1]
    config = print_config(
        "fit", "--config", str(root / "base.yaml"), "--config", str(root / f"{method}.yaml"), *flags(value)
    )
    model = config["model"]["init_args"]
    options = {
        **model["loss"]["policy_loss_options"],
        **model["loss"]["token_mask_options"],
        **model["loss"]["advantage_options"],
        **((model.get("entropy") or {}).get("options") or {}),
    }
    assert float(value) in {float(v) for v in options.values()}
    default = print_config(
        "fit", "--config", str(root / "base.yaml"), "--config", str(root / f"{method}.yaml"), *flags(values[0])
    )
    assert (
        default["model"]
        == print_config("fit", "--config", str(root / "base.yaml"), "--config", str(root / f"{method}.yaml"))["model"]
    )


def test_expectations_are_checked_against_paired_differences_and_misses_said(tmp_path):
    held = f"val/{study_runner.HELD_OUT}"
    records = [
        {"label": f"grpo/b{b}/s{s}", f"{held}/pass@1": 0.40, f"{held}/pass@16": 0.70} for b in (0, 1) for s in (0, 1, 2)
    ]
    records += [
        {"label": f"nsr/b{b}/s{s}", f"{held}/pass@1": 0.40 + 0.01 * (s - 1), f"{held}/pass@16": 0.80 + 0.01 * s}
        for b in (0, 1)
        for s in (0, 1, 2)
    ]
    records += [
        {"label": f"psr/b{b}/s{s}", f"{held}/pass@1": 0.45 + 0.01 * s, f"{held}/pass@16": 0.70}
        for b in (0, 1)
        for s in (0, 1, 2)
    ]
    by = study_stats.group(records)
    assert study_methods.expectation_check(by, "nsr", 16).endswith("expected +, seen +: MET")
    assert study_methods.expectation_check(by, "nsr", 1).endswith("expected =, seen =: MET")
    assert study_methods.expectation_check(by, "psr", 1).endswith(
        "expected =, seen +: MISS"
    )  # a miss is reported as a miss
    assert study_methods.expectation_check(by, "kl_cov", 1) == "- kl_cov pass@1: not run"


# ---------------------------------------------------------------------------- study 2: the demo's regime


def sel(label: str, p1: float, p16: float, held1: float = 0.0) -> dict:
    """A validation record: selection pass@1/16 (what the rule reads) and a held-out pass@1."""
    return {**record(label, p1, p16), f"val/{study_runner.HELD_OUT}/pass@1": held1}


def test_regime_rule_reads_the_selection_split_against_each_candidates_own_base(tmp_path):
    # "ws200" has the lower pass@1 but the larger gain over its own (200-step) base; held-out values point the other way
    records = [
        sel("base/b0/s0", 0.40, 0.95, 0.40),
        sel("base/b0/s1", 0.42, 0.95, 0.40),
        sel("base_ws200/b0/s0", 0.20, 0.85, 0.20),
        sel("base_ws200/b0/s1", 0.22, 0.85, 0.20),
        sel("ref/b0/s0", 0.45, 0.80, 0.90),
        sel("ref/b0/s1", 0.47, 0.80, 0.90),
        sel("ws200/b0/s0", 0.35, 0.70, 0.21),
        sel("ws200/b0/s1", 0.37, 0.70, 0.21),
    ]
    name, why = study2.choose_regime(study_with(tmp_path, records))
    assert name == "ws200" and why[0].startswith("highest mean selection Δpass@1 (+0.150)")
    assert "| `ref` | 450 | 2e-04 | 120 | 2 | 0.050 ± 0.000 | +0.050 | -0.150 ± 0.000 | yes |" in why


def test_regime_rule_needs_pass16_to_fall_and_breaks_near_ties_by_the_cheaper_demo(tmp_path):
    records = [
        sel("base/b0/s0", 0.40, 0.95),
        sel("base_ws200/b0/s0", 0.20, 0.85),
        sel("lr1e-4/b0/s0", 0.55, 0.99),  # the largest gain, but pass@16 rose: no collapse to show
        sel("lr5e-5/b0/s0", 0.50, 0.90),  # +0.100
        sel("ws200_lr1e-4/b0/s0", 0.295, 0.80),
    ]  # +0.095: within 0.01, fewer warm-start steps
    name, why = study2.choose_regime(study_with(tmp_path, records))
    assert name == "ws200_lr1e-4" and "within 0.01" in why[0] and "not confirmed" not in why[0]
    assert any(line.startswith("| `lr1e-4` |") and line.endswith("| no |") for line in why)


def test_regime_rule_below_the_bar_is_not_confirmed(tmp_path):
    name, why = study2.choose_regime(
        study_with(tmp_path, [sel("base/b0/s0", 0.40, 0.95), sel("ref/b0/s0", 0.43, 0.80)])
    )
    assert name == "ref" and "not confirmed" in why[0]
    assert study2.choose_regime(study_with(tmp_path, []))[0] is None


@pytest.mark.parametrize(
    ("gains", "met"),
    [
        ((0.10, 0.12, 0.09, 0.11, 0.10, 0.08), True),
        ((0.30, -0.10, 0.25, -0.05, 0.20, -0.12), False),  # mean +0.08, CI reaches below 0
        ((0.07, 0.07, 0.07, 0.06, 0.08, 0.07), False),
    ],
)
def test_regime_criterion_needs_the_mean_gain_and_a_ci_above_zero(tmp_path, gains, met):
    records = []
    for i, g in enumerate(gains):
        b, s = divmod(i, 3)
        records += [
            sel(f"base_ws200/b{b}/s{s + 3}", 0.2, 0.9, 0.30),
            sel(f"confirm_ws200/b{b}/s{s + 3}", 0.2, 0.9, 0.30 + g),
        ]
    ok, deltas, line = study2.regime_criterion(study_with(tmp_path, records), "ws200")
    assert ok is met and deltas == pytest.approx(list(gains)) and line.startswith("MET" if met else "NOT MET")


def test_regime_report_lists_every_run_the_choice_and_the_criterion(tmp_path):
    full = lambda label, x: {
        "label": label,
        **{
            f"val/{s}/pass@{k}": x
            for s in (study_runner.SELECT, study_runner.HELD_OUT, study_runner.OOD)
            for k in (1, 16, 32)
        },  # noqa: E731
        f"val/{study_runner.HELD_OUT}/distinct_correct_answers": 2.0,
    }
    records = [full(f"base_ws200/b0/s{s}", 0.2) for s in (0, 1)] + [full(f"ws200/b0/s{s}", 0.1) for s in (0, 1)]
    records[-1][f"val/{study_runner.SELECT}/pass@1"] = records[-2][f"val/{study_runner.SELECT}/pass@1"] = (
        0.35  # +0.15 on the selection split
    )
    records += [full(f"base_ws200/b{b}/s{s}", 0.2) for b in (0, 1) for s in (3, 4, 5)]
    records += [full(f"confirm_ws200/b{b}/s{s}", 0.2 + 0.1 + 0.01 * s) for b in (0, 1) for s in (3, 4, 5)]
    study = study_with(tmp_path / "work", records)
    (study.work / "logs").mkdir()
    (study.work / "logs" / "ws200_b0_s0.log").write_text(
        f"\n$ lit-rlvr fit --config {study_runner.ROOT}/configs/demo/grpo.yaml --seed_everything=0\n"
    )
    study2.write_regime_report(study, tmp_path / "report.md")
    text = (tmp_path / "report.md").read_text()
    assert "**Chosen: `ws200`**" in text and "**Acceptance criterion MET: held-out Δpass@1 0.140 ± " in text
    assert (
        "| `confirm_ws200/b1/s5` | 0.200 → 0.350 (+0.150) |" in text
        and "| `ws200/b0/s1` | 0.200 → 0.350 (+0.150) |" in text
    )
    assert "- `ws200/b0/s0`: `lit-rlvr fit --config configs/demo/grpo.yaml --seed_everything=0`" in text


# ---------------------------------------------------------------------------- study 3: every method in study 2's regime

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "demo"
CHOSEN = study3.COVERAGE["cov_thr4_exp_all"]


def test_study3_jobs_run_every_method_on_ws200_bases_for_160_steps_with_parts_a_b_c():
    coverage, robust, sweeps = (
        study3.coverage_jobs(),
        study3.study3_robust_jobs(CHOSEN),
        study3.study3_sweep_jobs(CHOSEN),
    )
    jobs = coverage + robust + sweeps
    assert all(j.warm == "ws200" and j.steps == 160 for j in jobs)
    assert len({j.label for j in jobs}) == len(jobs) == 4 * 2 + 17 * 6 + 15 * 2
    assert {j.label for j in coverage} == {f"{n}/b0/s{s}" for n in study3.COVERAGE for s in (0, 1)}
    assert {m for m in study3.STUDY3_METHODS} <= {p.stem for p in CONFIGS.glob("*.yaml")} and set(
        study3.STUDY3_METHODS[1:]
    ) <= set(study_methods.EXPECTED)
    assert {j.label for j in robust} == {
        f"{m}/b{b}/s{s}" for m in study3.STUDY3_METHODS for b in (0, 1) for s in (0, 1, 2)
    }
    assert [j.method for j in robust[:17]] == list(study3.STUDY3_METHODS) and robust[
        17
    ].seed == 1  # base, seed, method: methods interleaved
    flags = {j.method: j.overrides for j in robust}
    assert (
        flags["dph_f"] == CHOSEN and flags["dph_js"] == CHOSEN[:3] and flags["grpo"] == flags["nsr"] == []
    )  # JS keeps its own η
    assert all((j.base_seed, j.seed) == (0, 0) for j in sweeps) and {
        "grpo_5e-5",
        "passk_then_pass1_120",
        "unlikeliness_0.1",
    } <= {j.variant for j in sweeps}
    assert next(j for j in sweeps if j.variant == "dph_js_8.0").overrides == [*CHOSEN[:3], "--model.anchor.coef=8.0"]
    assert not any(j.variant.startswith(("psr", "nsr")) for j in sweeps)


@pytest.mark.parametrize("method", sorted(study_methods.BASELINE_KNOBS))
def test_each_baseline_knob_value_parses_and_reaches_its_option_through_the_study_command(
    method, print_config, tmp_path
):
    """The flags go through the Study's own fit command (the job's flags before its timer callback)."""
    study = study_runner.Study(tmp_path)
    flags, values = study_methods.KNOBS[method]

    def config(value: str | None) -> dict:
        args = study.fit_args(
            study_runner.Job(method, method, 0, 0, flags(value) if value else [], steps=160, warm="ws200")
        )
        return print_config(*args)

    swept, shipped, default = config(values[1]), config(values[0]), config(None)
    text = json.dumps(swept)
    assert values[1] in text or str(float(values[1])) in text
    assert shipped["model"] == default["model"] and shipped["trainer"]["callbacks"] == default["trainer"]["callbacks"]
    assert swept["trainer"]["callbacks"][-1]["class_path"] == "diversity_collapse.FitTimer"


def test_the_switch_step_of_passk_then_pass1_reaches_its_schedule(print_config, tmp_path):
    args = study_runner.Study(tmp_path).fit_args(
        study_runner.Job(
            "passk_then_pass1_40", "passk_then_pass1", 0, 0, study_methods.KNOBS["passk_then_pass1"][0]("40")
        )
    )
    schedule = print_config(*args)["trainer"]["callbacks"][0]
    assert schedule["class_path"] == "lit_rlvr.callbacks.AdvantageSchedule"
    assert [p["start_step"] for p in schedule["init_args"]["phases"]] == [0, 40]


def full(label: str, p1: float, p16: float, ood: float = 0.05, distinct: float = 2.0) -> dict:
    """A validation record on the three sets (selection = held-out here)."""
    out = {
        "label": label,
        f"val/{study_runner.OOD}/pass@1": ood,
        f"val/{study_runner.HELD_OUT}/distinct_correct_answers": distinct,
    }
    for s in (study_runner.SELECT, study_runner.HELD_OUT):
        out |= {f"val/{s}/pass@1": p1, f"val/{s}/pass@16": p16, f"val/{s}/pass@32": min(1.0, p16 + 0.05)}
    return out


def test_study3_coverage_rule_reads_the_ws200_base_validated_with_the_candidates_seeds(tmp_path):
    a, b, c, d = study3.COVERAGE
    records = [full(f"base_ws200/b0/s{s}", 0.16, 0.84) for s in (0, 1)] + [
        full("base_ws200/b0/s2", 0.50, 0.84)
    ]  # s2: part B's, ignored
    records += [full(f"{a}/b0/s{s}", 0.22, 0.80) for s in (0, 1)] + [full(f"{b}/b0/s{s}", 0.21, 0.83) for s in (0, 1)]
    records += [full(f"{c}/b0/s{s}", 0.19, 0.90) for s in (0, 1)] + [full(f"{d}/b0/s{s}", 0.20, 0.81) for s in (0, 1)]
    name, flags, why = study1.choose_dph(study_with(tmp_path, records), study3.COVERAGE, study3.STUDY3_BASE)
    assert name == b and flags == study3.COVERAGE[b]  # c has the best pass@16 but gains 0.03 only
    assert "base 0.160" in why[0]


def timings(study: study_runner.Study, seconds: dict[str, float], steps: int = 160) -> None:
    study.timings.write_text(
        "".join(json.dumps({"label": label, "train_seconds": t, "steps": steps}) + "\n" for label, t in seconds.items())
    )


def test_part_d_reruns_the_methods_slower_than_grpo_by_more_than_10_percent_at_grpos_median_seconds(tmp_path):
    study = study_runner.Study(tmp_path)
    timings(
        study,
        {
            **{f"grpo/b0/s{s}": t for s, t in enumerate((100.0, 120.0, 110.0))},
            "grpo/b1/s0": 900.0,
            **{f"rkl/b0/s{s}": t for s, t in enumerate((130.0, 125.0, 140.0))},  # median 130 > 1.1 × 110
            **{f"dph_f/b0/s{s}": t for s, t in enumerate((118.0, 121.0, 119.0))},  # 120 < 121: not rerun
            "dapo/b1/s0": 999.0,
        },
    )
    assert study3.slower_than_grpo(study) == ["rkl"]
    jobs = study1.wallclock_jobs(study, CHOSEN, methods=study3.slower_than_grpo(study), warm="ws200")
    assert [j.label for j in jobs] == [f"rkl_time110s/b0/s{s}" for s in (0, 1, 2)]
    assert all(
        j.warm == "ws200" and j.steps == 100_000 and j.overrides == ["--trainer.max_time=00:00:01:50"] for j in jobs
    )
    assert (
        study1.wallclock_jobs(study, CHOSEN, methods=("dph_f",))[0].overrides[:4] == CHOSEN
    )  # study 1's call is unchanged


def test_study3_report_tables_expectations_and_views_on_hand_made_records(tmp_path):
    records = [full(f"base_ws200/b{b}/s{s}", 0.15, 0.80) for b in (0, 1) for s in (0, 1, 2)]
    records += [full(f"{n}/b0/s{s}", 0.25, 0.80) for n in study3.COVERAGE for s in (0, 1)]
    for m in study3.STUDY3_METHODS:
        up = {"grpo": 0.0, "dph_f": 0.10, "psr": -0.05}.get(m, 0.0)
        records += [
            full(f"{m}/b{b}/s{s}", 0.25 + 0.01 * s, 0.70 + up + 0.01 * b, ood=0.04) for b in (0, 1) for s in (0, 1, 2)
        ]
    records += [
        full("grpo_5e-5/b0/s0", 0.20, 0.78),
        full("rkl_time110s/b0/s0", 0.24, 0.75),
        full("rkl_time110s/b0/s1", 0.25, 0.76),
    ]
    study = study_with(tmp_path / "work", records)
    timings(
        study,
        {r["label"]: 110.0 + 40 * r["label"].startswith("rkl") for r in records if not r["label"].startswith("base")},
    )
    study3.write_study3_report(study, tmp_path / "study3.md", tmp_path / "study3.png")
    text = (tmp_path / "study3.md").read_text()
    assert (tmp_path / "study3.png").stat().st_size > 0 and "Study 1 (`study_plan.md`" in text
    assert "**Chosen: `cov_thr6_exp_all`**" in text  # all candidates tie: the first, by the rule's order
    assert "| DPH-F | 6 | 0.260 ± 0.009 (0.250) | 0.805 ± 0.006 (0.800) |" in text
    assert "| DPH-F | 6 | +0.000 ± 0.000 (+0.000) | +0.100 ± 0.000 (+0.100) |" in text  # paired on base × seed
    assert "- dph_f pass@16 − GRPO: 0.100 ± 0.000 over 6 paired runs (worst +0.100); expected +, seen +: MET" in text
    assert "- psr pass@16 − GRPO: -0.050 ± 0.000 over 6 paired runs (worst -0.050); expected -, seen -: MET" in text
    assert "- rkl pass@1 − GRPO: 0.000 ± 0.000 over 6 paired runs (worst +0.000); expected -, seen =: MISS" in text
    assert "| RKL | 6 | 0.938 | 0.938 ± 0.000 | 1.36 | 1.36 | yes |" in text and "| GRPO | 6 | 0.688 |" in text
    assert (
        "| RKL at 110s | 2 | 150 ± 0 | 160 ± 0 | 0.245 ± 0.064 (0.240) |" in text
        and "| -0.010 ± 0.000 (-0.010) | +0.055 ± 0.064 (+0.050) |" in text
    )
    assert "| GRPO | lr | 5e-5 | 1 | 0.200 | 0.780 | 0.050 |" in text and "| GRPO | lr | 1e-4 (shipped) | 3 |" in text
    assert "GRPO's held-out Δpass@1 over its own base +0.110 ± 0.009 (+0.100)" in text


def test_the_coverage_table_counts_d_pef_anchor_samples_and_rl_prompts():
    lines = study3.coverage_sizes([0, 1, 2, 4, 6, 8, 3, 2], n=8)
    assert "| `cov_thr6_exp_all` | 6 | exp | 2 of 8 | 16 | 6 |" in lines
    assert (
        "| `cov_thr2_exp_all` | 2 | exp | 6 of 8 | 48 | 2 |" in lines
        and "| `cov_thr4_all_all` | 4 | all | 3 of 8 | 24 | 8 |" in lines
    )


def test_no_new_job_starts_while_the_pause_file_exists(tmp_path):
    pause, ran = tmp_path / "PAUSE", []
    pause.touch()
    study = study_runner.Study(tmp_path / "work", slots=1, pause=pause, poll=0.02)
    worker = threading.Thread(target=study.parallel, args=([lambda: ran.append(1)],))
    worker.start()
    time.sleep(0.2)
    assert ran == [] and worker.is_alive()
    pause.unlink()
    worker.join(timeout=5)
    assert ran == [1] and not worker.is_alive()


def test_no_job_starts_after_the_deadline_and_the_skipped_are_named(tmp_path):
    from datetime import datetime, timedelta

    ran = []
    study = study_runner.Study(tmp_path / "work", slots=1, deadline=datetime.now(UTC) + timedelta(hours=1))
    study.parallel([study_runner._labelled(lambda: ran.append("a"), "grpo/b0/s0")])
    study.deadline = datetime.now(UTC) - timedelta(seconds=1)
    study.parallel(
        [
            study_runner._labelled(lambda: ran.append("b"), "grpo/b1/s0"),
            study_runner._labelled(lambda: ran.append("c"), "dapo/b1/s0"),
        ]
    )
    assert ran == ["a"] and study.skipped == ["grpo/b1/s0", "dapo/b1/s0"]


def test_amendment_1_runs_part_b_block_by_block_and_the_report_reads_complete_blocks_only(tmp_path, monkeypatch):
    from datetime import datetime, timedelta

    records = [full(f"base_ws200/b{b}/s0", 0.15, 0.80) for b in (0, 1)]
    records += [full(f"{m}/b0/s0", 0.25, 0.70 + 0.1 * (m == "dph_f")) for m in study3.STUDY3_METHODS]
    records += [full("grpo/b1/s0", 0.99, 0.99), full("dapo/b1/s0", 0.99, 0.99)]  # a block the deadline cut
    study = study_with(tmp_path / "work", records)
    study.deadline = datetime.now(UTC) - timedelta(seconds=1)
    ran = []
    monkeypatch.setattr(study, "prepare", lambda **kw: ran.append("prepare"))
    monkeypatch.setattr(study, "run", lambda jobs: ran.append([j.label for j in jobs]))
    study3.run_study3_amended(study)
    assert ran == ["prepare"]  # past the deadline: no block starts
    assert len(study.skipped) == 6 * 17 - 17 - 2 and study.skipped[0] == "rkl/b1/s0"  # b0/s0 is done, b1/s0 half
    assert study3.complete_blocks(study_stats.group(study.records())) == [("b0", "s0")]
    timings(study, {r["label"]: 100.0 for r in records if not r["label"].startswith("base")})
    study3.write_study3_report(study, tmp_path / "study3.md", tmp_path / "study3.png")
    text = (tmp_path / "study3.md").read_text()
    assert "**Amendment 1" in text and "complete base × seed blocks: (b0, s0) (1)" in text
    assert "`base_ws200/b1/s0`, `dapo/b1/s0`, `grpo/b1/s0`" in text and "83 planned runs not started" in text
    assert "| GRPO | 1 | 0.250 |" in text and "0.990" not in text  # the cut block's runs are in no table
    assert "## A. DPH's coverage: not re-chosen (amendment 1)" in text and "Chosen:" not in text
    assert "- dph_f pass@16 − GRPO: 0.100 over 1 paired runs" in text


def test_a_method_equal_to_grpo_run_for_run_is_named_as_never_acting():
    by = study_stats.group(
        [
            full(f"{m}/b0/s{s}", 0.2 + 0.01 * s, 0.7 + 0.05 * (m == "dph_f"))
            for m in ("grpo", "dph_f", "entropy_adaptive")
            for s in (0, 1)
        ]
    )
    (line,) = study3.identical_to_grpo(by)
    assert line.startswith("\nadaptive entropy's runs equal GRPO's on every number above, run for run")


def test_the_full_plan_refuses_to_skip_dph_runs_recorded_at_another_coverage(tmp_path, monkeypatch):
    study = study_with(tmp_path / "work", [full("dph_js/b0/s0", 0.2, 0.8), full("grpo/b0/s0", 0.2, 0.7)])
    ran = []
    monkeypatch.setattr(study, "prepare", lambda **kw: None)
    monkeypatch.setattr(study, "run", lambda jobs: ran.append(len(jobs)))
    monkeypatch.setattr(
        study3, "choose_dph", lambda *a: ("cov_thr6_exp_all", study3.COVERAGE["cov_thr6_exp_all"], ["why"])
    )
    with pytest.raises(SystemExit, match="1 DPH runs of part B are recorded at their shipped coverage"):
        study3.run_study3(study)
    study.metrics.write_text(
        json.dumps(full("dph_f/b0/s0", 0.2, 0.8)) + "\n"
    )  # DPH-F at the shipped coverage, chosen again: kept
    monkeypatch.setattr(study3, "slower_than_grpo", lambda study: [])
    monkeypatch.setattr(study3, "wallclock_jobs", lambda *a, **k: [])
    study3.run_study3(study)
    assert ran[-3:] == [len(study3.STUDY3_METHODS) * 6, len(study3.study3_sweep_jobs([])), 0]


def test_amendment_2_completes_part_b_then_sweeps_method_by_method_dph_first_until_the_deadline(tmp_path, monkeypatch):
    from datetime import datetime, timedelta

    records = [full(f"base_ws200/b{b}/s{s}", 0.15, 0.80) for b in (0, 1) for s in (0, 1, 2)]
    records += [full(f"{m}/b{b}/s{s}", 0.25, 0.70) for m in study3.STUDY3_METHODS for b in (0, 1) for s in (0, 1, 2)]
    study = study_with(tmp_path / "work", records)
    study.deadline = datetime.now(UTC) + timedelta(hours=1)
    ran = []
    monkeypatch.setattr(study, "prepare", lambda **kw: None)

    def run(jobs):  # each group records its runs; the deadline passes after DPH-F's sweep
        ran.append([j.label for j in jobs])
        with study.metrics.open("a") as f:
            f.writelines(json.dumps(full(j.label, 0.2, 0.8)) + "\n" for j in jobs if j.variant != j.method)
        if len(ran) == len(study3.STUDY3_BLOCKS) + 1:
            study.deadline = datetime.now(UTC) - timedelta(seconds=1)

    monkeypatch.setattr(study, "run", run)
    study3.run_study3_amendment2(study)
    assert len(ran) == 7 and all(len(g) == 17 for g in ran[:6])  # part B's blocks first (the Study skips the recorded)
    assert ran[6] == ["dph_f_0.5/b0/s0", "dph_f_2.0/b0/s0"]
    assert study.skipped[:2] == ["dph_js_2.0/b0/s0", "dph_js_8.0/b0/s0"] and len(study.skipped) == 30 - 2
    assert all(
        not any(f.startswith("--data.cache") for f in j.overrides) for j in study3.study3_sweep_jobs([])
    )  # shipped coverage
    timings(study, {r["label"]: 100.0 for r in study.records() if not r["label"].startswith("base")})
    study3.write_study3_report(study, tmp_path / "study3.md", tmp_path / "study3.png")
    text = (tmp_path / "study3.md").read_text()
    assert (
        "**Amendments 1 and 2" in text
        and "2 of 30 sweep runs finished" in text
        and "28 planned runs not started: `dph_js_2.0/b0/s0`" in text
    )
    assert "(b0, s2), (b1, s2) (6)" in text and "| DPH-F | η | 0.5 | 1 | 0.200 | 0.800 |" in text


def test_a_swept_knob_that_gave_the_same_numbers_at_every_value_is_named_and_load_notes_are_shown(tmp_path):
    by = study_stats.group(
        [
            full("dapo/b0/s0", 0.25, 0.71),
            full("dapo_0.2/b0/s0", 0.25, 0.71),
            full("dapo_0.4/b0/s0", 0.25, 0.71),
            full("rkl/b0/s0", 0.25, 0.71),
            full("rkl_0.01/b0/s0", 0.26, 0.71),
            full("rkl_0.2/b0/s0", 0.25, 0.71),
            full("grpo/b0/s0", 0.2, 0.7),
            full("grpo_5e-5/b0/s0", 0.2, 0.7),
        ]
    )  # GRPO's 2e-4 missing: not named
    (line,) = study3.inert_knobs(by)
    assert (
        line
        == "\nDAPO's clip_high gave the same numbers at 0.28, 0.2, 0.4 (base 0, seed 0), run for run: the knob never acted in these runs."
    )
    study = study_runner.Study(tmp_path)
    assert study_runner.load_notes(study) == []
    (tmp_path / "load_notes.txt").write_text("from 14:15 the tests ran too\n\n")
    assert study_runner.load_notes(study) == ["", "Load: from 14:15 the tests ran too"]


def test_the_documented_study_commands_parse():
    import re
    import shlex

    results = (Path(__file__).resolve().parents[2] / "docs" / "results.md").read_text()
    commands = re.findall(r"`python benchmarks/diversity_collapse.py ([^`]*)`", results)
    assert any("--amendment 2" in c for c in commands) and any("--amendment 3" in c for c in commands), commands
    for command in commands:
        args = diversity_collapse.parse_args(shlex.split(command))
        assert args.preset in ("study3", "study4", "regime", "regime_confirm", "methods", "study", "budget") and (
            args.deadline is None or args.preset == "study3"
        )


def test_amendment_3_runs_part_a_then_the_last_sweeps_part_d_by_fastest_runs_then_dph_at_the_chosen_coverage(
    tmp_path, monkeypatch
):
    from datetime import datetime, timedelta

    records = [full(f"base_ws200/b{b}/s{s}", 0.15, 0.80) for b in (0, 1) for s in (0, 1, 2)]
    records += [
        full(f"{m}/b{b}/s{s}", 0.25, 0.70 + 0.05 * (m == "dph_f"))
        for m in study3.STUDY3_METHODS
        for b in (0, 1)
        for s in (0, 1, 2)
    ]
    study = study_with(tmp_path / "work", records)
    # PSR's median is 1.5× GRPO's (load), its fastest run 1.0×: not re-run; RKL's fastest is 1.2×: re-run
    seconds = {f"{m}/b{b}/s{s}": 100.0 for m in study3.STUDY3_METHODS for b in (0, 1) for s in (0, 1, 2)}
    seconds |= {f"psr/b{b}/s{s}": 150.0 for b in (0, 1) for s in (0, 1, 2)} | {"psr/b1/s2": 100.0}
    seconds |= {f"rkl/b{b}/s{s}": 120.0 for b in (0, 1) for s in (0, 1, 2)}
    timings(study, seconds)
    study.deadline = datetime.now(UTC) + timedelta(hours=1)
    ran = []
    monkeypatch.setattr(study, "prepare", lambda **kw: None)

    def run(
        jobs,
    ):  # part A's candidates: thr4 on all samples wins the selection pass@16; the deadline passes during DPH-F's runs
        ran.append([j.label for j in jobs])
        done = study.done_labels()  # as the Study: recorded runs are skipped
        with study.metrics.open("a") as f:
            f.writelines(
                json.dumps(full(j.label, 0.3, 0.9 if j.variant == "cov_thr4_all_all" else 0.8)) + "\n"
                for j in jobs
                if j.label not in done
            )
        if len(ran) == 4:
            study.deadline = datetime.now(UTC) - timedelta(seconds=1)

    monkeypatch.setattr(study, "run", run)
    study3.run_study3_amendment3(study)
    assert ran[0] == [j.label for j in study3.coverage_jobs()] and len(ran[0]) == 8
    assert ran[1] == ["unlikeliness_0.1/b0/s0", "unlikeliness_0.5/b0/s0"]
    assert ran[2] == ["rkl_time100s/b0/s0", "rkl_time100s/b0/s1", "rkl_time100s/b0/s2"]  # GRPO's median base-0 seconds
    assert ran[3] == [f"cov_thr4_all_all/b{b}/s{s}" for b, s in study3.STUDY3_BLOCKS]  # part A's two are skipped
    assert study.skipped == [f"dph_js_cov_thr4_all_all/b{b}/s{s}" for b, s in study3.STUDY3_BLOCKS]
    dph_js = study3.chosen_coverage_jobs("cov_thr4_all_all", study3.COVERAGE["cov_thr4_all_all"])[1]
    assert "--data.cache.anchor_samples=all" in dph_js[0].overrides and not any(
        "anchor.coef" in f for f in dph_js[0].overrides
    )
    assert (
        study3.chosen_coverage_jobs(study3.STUDY3_SHIPPED_COVERAGE, [])[0] == []
    )  # the shipped coverage: part B's DPH-F runs stand
    # the rule reads part A's blocks only, though the chosen candidate now has a run on every block
    assert study1.choose_dph(study, study3.COVERAGE, study3.STUDY3_BASE, study3.STUDY3_PART_A)[0] == "cov_thr4_all_all"
    assert (
        "| cov_thr4_all_all | 2 | 0.300 | 0.900 | yes |"
        in study1.choose_dph(study, study3.COVERAGE, study3.STUDY3_BASE, study3.STUDY3_PART_A)[2]
    )
    timings(study, {**seconds, **{label: 100.0 for g in ran for label in g}})
    study3.write_study3_report(study, tmp_path / "study3.md", tmp_path / "study3.png")
    text = (tmp_path / "study3.md").read_text()
    assert (
        "**Amendments 1, 2 and 3" in text
        and "6 runs of amendment 3 not started: `dph_js_cov_thr4_all_all/b0/s0`" in text
    )
    assert "**Chosen: `cov_thr4_all_all`**" in text and "0 of its 2 runs equal part B's DPH-F run" in text
    assert "| `cov_thr4_all_all` | 6 | 0.300 ± 0.000 (0.300) | 0.900 ± 0.000 (0.900) |" in text  # below part B's table
    assert "| cov_thr4_all_all | 6 | +0.050 ± 0.000 (+0.050) | +0.200 ± 0.000 (+0.200) |" in text  # paired against GRPO
    assert "| RKL at 100s | 3 |" in text
    assert (
        "- dph_f (cov_thr4_all_all) pass@16 − GRPO: 0.200 ± 0.000 over 6 paired runs (worst +0.200); expected +, seen +: MET"
        in text
    )
    assert (
        "| RKL | 6 | 0.750 | 0.750 ± 0.000 | 1.20 | 1.20 | yes |" in text
        and "| PSR | 6 | 0.938 | 0.885 ± 0.134 | 1.50 | 1.00 | no |" in text
    )


def test_the_shipped_coverage_candidate_is_checked_against_part_bs_dph_f_digit_for_digit():
    by = study_stats.group(
        [
            full("dph_f/b0/s0", 0.25, 0.75),
            full("dph_f/b0/s1", 0.25, 0.75),
            full(f"{study3.STUDY3_SHIPPED_COVERAGE}/b0/s0", 0.25, 0.75),
            full(f"{study3.STUDY3_SHIPPED_COVERAGE}/b0/s1", 0.25, 0.76),
        ]
    )
    (line,) = study3.reproduced(by)
    assert "1 of its 2 runs equal part B's DPH-F run on the same base × seed on every number above (b0/s0)" in line


# ---------------------------------------------------------------------------- study 4: MaxRL beside GRPO, DPH-F and Pass@k


def test_study4_runs_the_four_arms_on_both_ws200_bases_for_160_steps_in_study3s_block_order():
    jobs = study4.study4_jobs()
    assert len({j.label for j in jobs}) == len(jobs) == 4 * 2 * 3
    assert all(j.warm == "ws200" and j.steps == 160 for j in jobs) and set(study4.STUDY4_METHODS) <= {
        p.stem for p in CONFIGS.glob("*.yaml")
    }
    assert [j.label for j in jobs[:5]] == ["grpo/b0/s0", "dph_f/b0/s0", "passk/b0/s0", "max_rl/b0/s0", "grpo/b1/s0"]
    assert [(j.base_seed, j.seed) for j in jobs[::4]] == list(study3.STUDY3_BLOCKS)
    flags = {j.method: j.overrides for j in jobs}
    assert (
        flags["dph_f"] == CHOSEN and flags["grpo"] == flags["passk"] == flags["max_rl"] == []
    )  # study 3's chosen coverage, pinned
    smoke = study4.study4_jobs(study4.STUDY4_SMOKE)
    assert [j.label for j in smoke] == ["grpo/b0/s0", "dph_f/b0/s0", "passk/b0/s0", "max_rl/b0/s0"] and {
        j.warm for j in smoke
    } == {"smoke"}


def test_the_study4_arms_reach_their_estimators_through_the_study_command(print_config, tmp_path):
    study = study_runner.Study(tmp_path)
    configs = {j.method: print_config(*study.fit_args(j)) for j in study4.study4_jobs()[:4]}
    losses = {m: c["model"]["init_args"]["loss"] for m, c in configs.items()}
    assert {m: loss["advantage"] for m, loss in losses.items()} == {
        "grpo": "grpo",
        "dph_f": "grpo",
        "passk": "passk",
        "max_rl": "max_rl",
    }
    assert losses["passk"]["advantage_options"] == {"k": 4}
    cache = configs["dph_f"]["data"]["init_args"]["cache"]
    assert (cache["perfect_threshold"], cache["train_split"], cache["anchor_samples"]) == (4, "exp", "all")
    assert all(
        c["trainer"]["max_steps"] == 160 and c["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 1e-4
        for c in configs.values()
    )


def study4_records(maxrl_p16: float = 0.05, blocks=study3.STUDY3_BLOCKS) -> list[dict]:
    """Hand-made runs: MaxRL = GRPO in pass@1, above in pass@16; DPH-F below in pass@1 and above in pass@16; Pass@k = GRPO."""
    records = []
    for b, s in blocks:
        wobble = 0.002 * s  # pairs that differ a little, so the intervals are not 0
        records += [full(f"base_ws200/b{b}/s{s}", 0.15, 0.80), full(f"grpo/b{b}/s{s}", 0.25, 0.70)]
        records += [
            full(f"dph_f/b{b}/s{s}", 0.20 + wobble, 0.78 + wobble),
            full(f"passk/b{b}/s{s}", 0.25 + wobble - 0.002, 0.70),
        ]
        records += [full(f"max_rl/b{b}/s{s}", 0.25, 0.70 + maxrl_p16 + wobble)]
    return records


def test_study4_report_judges_each_hypothesis_by_study3s_rule_and_names_its_misses(tmp_path):
    study = study_with(tmp_path / "work", study4_records())
    timings(
        study,
        {
            r["label"]: 100.0 + 20 * r["label"].startswith("dph_f")
            for r in study.records()
            if not r["label"].startswith("base")
        },
    )
    record = {
        "time": "2026-12-04T16:00:00+00:00",
        "commit": "0123456789abcdef",
        "changed": False,
        "cpu": "Intel(R) Xeon(R) Processor",
        "flags": ["avx2", "avx512f"],
        "capability": "AVX512",
        "torch": "2.13.0+cpu",
        "python": "3.11.7",
        "slots": 2,
        "threads_per_job": 1,
        "argv": "--preset study4 --slots 2",
    }
    study4.claim_work(study.work, study4.STUDY4, record)
    (study.base_dir(0, warm="ws200")).mkdir(parents=True)
    (study.base_dir(0, warm="ws200") / "model.safetensors").write_bytes(b"not the weights")
    study4.write_study4_report(study, study4.STUDY4, tmp_path / "study4.md", tmp_path / "study4.png")
    text = (tmp_path / "study4.md").read_text()
    assert (tmp_path / "study4.png").stat().st_size > 0 and "SMOKE" not in text
    assert (
        "(b0, s0), (b1, s0), (b0, s1), (b1, s1), (b0, s2), (b1, s2) (6 of 6)" in text
        and "planned runs not recorded: none" in text
    )
    assert "| 2026-12-04T16:00:00+00:00 | `0123456789` | Intel(R) Xeon(R) Processor | 2.13.0+cpu (AVX512) |" in text
    assert (
        "- base 0: weights sha256 `" in text
        and "**not** the `8c3e23c9…` the plan expected" in text
        and "- base 1: weights sha256 `not made`" in text
    )
    assert "| MaxRL | 6 | 0.250 ± 0.000 (0.250) | 0.752 ± 0.002 (0.750) |" in text
    assert "| MaxRL | 6 | +0.000 ± 0.000 (+0.000) | +0.052 ± 0.002 (+0.050) |" in text  # − GRPO
    assert "| method − DPH-F | pairs |" in text and "| method − Pass@k | pairs |" in text
    assert "**H1: HELD** — MaxRL − GRPO" in text and "**H2: MISSED (pass@16 missed)** — MaxRL − GRPO" in text
    assert (
        "- MaxRL pass@1 − GRPO: 0.000 ± 0.000 over 6 paired runs (worst +0.000); expected + or =, seen =: MET" in text
    )
    assert "- MaxRL pass@16 − GRPO: 0.052 ± 0.002 over 6 paired runs (worst +0.050); expected =, seen +: MISS" in text
    assert "**H3a: HELD**" in text and "**H3b: MISSED (pass@1 missed)**" in text  # a miss is reported as a miss
    assert "- Pass@k pass@1 − GRPO: 0.000 ± 0.002 over 6 paired runs (worst -0.002); expected -, seen =: MISS" in text
    assert (
        "- MaxRL pass@16 − DPH-F: -0.030 ± 0.000 over 6 paired runs (worst -0.030); seen - (no direction pre-registered)"
        in text
    )
    assert "- MaxRL pass@32 − GRPO: " in text and "With 6 pairs the interval's t is 2.571" in text
    assert "| b1, s2 | 0.150 / 0.800 | 0.250 / 0.700 | 0.204 / 0.784 | 0.252 / 0.700 | 0.250 / 0.754 |" in text
    assert "| DPH-F | 6 | 0.750 ± 0.000 | 0.750 | 1.20 |" in text


def test_study4_report_reads_complete_blocks_only_and_names_the_rest(tmp_path):
    records = [r for r in study4_records() if r["label"] not in ("max_rl/b1/s2", "passk/b1/s2")]
    study = study_with(tmp_path / "work", records)
    study4.write_study4_report(study, study4.STUDY4, tmp_path / "study4.md", tmp_path / "study4.png")
    text = (tmp_path / "study4.md").read_text()
    assert "(b0, s2) (5 of 6)" in text and "`base_ws200/b1/s2`, `dph_f/b1/s2`, `grpo/b1/s2`" in text
    assert "planned runs not recorded: `passk/b1/s2`, `max_rl/b1/s2`" in text
    assert "| GRPO | 5 |" in text and "over 5 paired runs" in text and "t is 2.776" in text


def machine(**changes) -> dict:
    return {
        "cpu": "Intel(R) Xeon(R) Processor",
        "flags": ["avx2", "avx512f"],
        "torch": "2.13.0+cpu",
        "commit": "abc",
        **changes,
    }


def test_a_study4_work_folder_refuses_another_setting_and_another_machine_kind(tmp_path):
    study4.claim_work(tmp_path, study4.STUDY4, machine())
    study4.claim_work(
        tmp_path, study4.STUDY4, machine(commit="def")
    )  # a resume at a later commit is noted, not refused
    assert [json.loads(line)["commit"] for line in (tmp_path / "machine.jsonl").read_text().splitlines()] == [
        "abc",
        "def",
    ]
    with pytest.raises(SystemExit, match="flags differ"):
        study4.claim_work(tmp_path, study4.STUDY4, machine(flags=["avx2"]))
    with pytest.raises(SystemExit, match="torch differ: 2.13.0\\+cpu here 2.14.0"):
        study4.claim_work(tmp_path, study4.STUDY4, machine(torch="2.14.0"))
    with pytest.raises(SystemExit, match="the smoke check and the study must not share a work folder"):
        study4.claim_work(tmp_path, study4.STUDY4_SMOKE, None)  # --report-only checks the setting too
    assert len((tmp_path / "machine.jsonl").read_text().splitlines()) == 2


def test_a_rerun_of_study4_skips_the_recorded_runs(tmp_path, monkeypatch):
    study = study_with(
        tmp_path / "work",
        [full("base_ws200/b0/s0", 0.15, 0.8), full("grpo/b0/s0", 0.25, 0.7), full("dph_f/b0/s0", 0.2, 0.8)],
    )
    prepared, ran = [], []
    monkeypatch.setattr(study4, "machine_record", lambda slots: machine())
    monkeypatch.setattr(study, "prepare", lambda **kw: prepared.append(kw))
    monkeypatch.setattr(study, "validate", lambda label, *a: ran.append(label))  # the bases' validations
    monkeypatch.setattr(study, "run_job", lambda job: ran.append(job.label))
    study4.run_study4(study)
    assert prepared == [{"base_seeds": [0, 1], "sql_seeds": [], "warms": ("ws200",)}]
    assert ran[:5] == [
        "base_ws200/b0/s1",
        "base_ws200/b0/s2",
        "base_ws200/b1/s0",
        "base_ws200/b1/s1",
        "base_ws200/b1/s2",
    ]
    assert ran[5:] == [j.label for j in study4.study4_jobs()[2:]] and len(ran[5:]) == 22


def test_smoke_is_study4s_and_its_validations_are_smaller(tmp_path):
    with pytest.raises(SystemExit):
        diversity_collapse.parse_args(["--preset", "study3", "--smoke"])
    assert diversity_collapse.parse_args(["--preset", "study4", "--smoke"]).smoke
    study = study_runner.Study(tmp_path, validate_flags=study4.STUDY4_SMOKE.validate_flags)
    seen = []
    study.lit = lambda *args, log: seen.append(args)
    study.validate("grpo/b0/s0", tmp_path / "hf", 0, "countdown", None, tmp_path / "counts.json")
    assert seen[0][-2:] == ("--trainer.limit_val_batches=1", "--data.val_batch_size=8")


def test_each_invocations_wall_seconds_are_recorded_once_and_quoted_by_the_reports(tmp_path):
    """study_runner.record_seconds appends ``<invocation> <s>``; every study report quotes the lines through
    seconds_note (study 1 through seconds_of); a work folder without the file quotes nothing."""
    assert study_runner.seconds_of(tmp_path) == [] and study_runner.seconds_note(tmp_path) == ""
    study_runner.record_seconds(tmp_path, "study6 --smoke", time.perf_counter() - 12.4)
    study_runner.record_seconds(tmp_path, "study6", time.perf_counter() - 4800)
    assert study_runner.seconds_of(tmp_path) == ["study6 --smoke 12", "study6 4800"]
    assert (
        study_runner.seconds_note(tmp_path)
        == " (wall time of each invocation, seconds: study6 --smoke 12, study6 4800)"
    )
    assert study_runner.seconds_note(tmp_path, "the script").startswith(" (wall time of the script, seconds: ")
