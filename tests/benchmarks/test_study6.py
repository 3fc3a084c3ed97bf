"""Study 6 (benchmarks/study6.py, benchmarks/results/study6.md): its jobs, every arm's command, the claim's rule and
the report, on hand-made records. Nothing here runs a fit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import study3  # noqa: E402
import study4  # noqa: E402
import study6  # noqa: E402
import study_runner  # noqa: E402
import study_stats  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "demo"
HELD = f"val/{study_runner.HELD_OUT}"


def test_the_study_runs_six_arms_on_study4s_bases_and_seeds_in_block_order():
    jobs = study6.jobs()
    assert len({j.label for j in jobs}) == len(jobs) == 6 * 2 * 3
    assert all(j.steps == 160 and j.warm == "ws200" for j in jobs) and study6.STUDY6 == study4.STUDY4
    assert [j.variant for j in jobs[:6]] == [
        "grpo",
        "dph_f",
        "ucpo",
        "passk_combined",
        "dph_f_ucpo",
        "dph6_passk_combined",
    ]
    assert [(j.base_seed, j.seed) for j in jobs[::6]] == list(study3.STUDY3_BLOCKS)
    assert {j.method for j in jobs} <= {p.stem for p in CONFIGS.glob("*.yaml")}
    assert [j.label for j in study6.jobs(study6.SMOKE)] == [f"{v}/b0/s0" for v in study6.METHODS]
    assert {h.variant for h in study6.HYPOTHESES} <= set(study6.CURES) and set(study6.CURES) == set(study6.METHODS) - {
        "grpo"
    }


def test_every_arms_command_parses_and_reaches_its_estimator_anchors_and_coverage(print_config, tmp_path):
    """Each arm's `lit-rlvr fit` line, as the Study builds it, through the CLI's parser (one loop, six parses)."""
    study = study_runner.Study(tmp_path)
    want = {  # variant: (advantage, its options, anchored, perfect_threshold)
        "grpo": ("grpo", {"std": "population"}, False, None),
        "dph_f": ("grpo", {}, True, 4),
        "ucpo": ("ucpo", {"tau": 0.2}, False, None),
        "passk_combined": ("passk_combined", {"k": 4}, False, None),
        "dph_f_ucpo": ("ucpo", {"tau": 0.2}, True, 4),
        "dph6_passk_combined": ("passk_combined", {"k": 4}, True, 6),
    }
    assert set(want) == set(study6.METHODS)
    for job in study6.jobs()[:6]:
        config = print_config(*study.fit_args(job))
        model, data = config["model"]["init_args"], config["data"]["init_args"]
        advantage, options, anchored, threshold = want[job.variant]
        assert (model["loss"]["advantage"], model["loss"]["advantage_options"]) == (advantage, options), job.variant
        assert (model.get("anchor") is not None) == anchored, job.variant
        if anchored:
            assert model["anchor"]["divergence"] == "forward_kl" and model["anchor"]["coef"] == 1.0
            cache = data["cache"]
            assert cache["path"] == str(tmp_path / "base_ws200" / "s0" / "ref_cache"), job.variant
            assert (cache["perfect_threshold"], cache["train_split"], cache["anchor_samples"]) == (
                threshold,
                "exp",
                "all",
            )
        assert model["policy"]["path"] == str(tmp_path / "base_ws200" / "s0")
        assert config["trainer"]["max_steps"] == 160 and model["optimizer"]["init_args"]["lr"] == 1e-4
        assert [v["name"] for v in data["val"]] == ["countdown_select", "countdown_val", "addition_val"]
        assert config["trainer"]["callbacks"][-1]["class_path"] == "diversity_collapse.FitTimer"


def held(label: str, p1: float, p16: float) -> dict:
    out = {"label": label, f"val/{study_runner.OOD}/pass@1": 0.04, f"{HELD}/distinct_correct_answers": 2.0}
    for s in (study_runner.SELECT, study_runner.HELD_OUT):
        out |= {f"val/{s}/pass@1": p1, f"val/{s}/pass@16": p16, f"val/{s}/pass@32": min(1.0, p16 + 0.05)}
    return out


def records() -> list[dict]:
    """UCPO: GRPO's pass@1 and +0.03 pass@16 (holds); DPH-F −0.05 / +0.10 (misses pass@1); Pass@k combined
    −0.007 ± 0.002 pass@1 (its part met) but one pair's pass@16 below GRPO's (misses pass@16); DPH-F(6) + Pass@k
    combined −0.005 in every pair and +0.05 (holds); DPH-F + UCPO −0.04 / +0.11 (misses pass@1)."""
    out = []
    for b, s in study3.STUDY3_BLOCKS:
        w = 0.002 * s
        out += [held(f"base_ws200/b{b}/s{s}", 0.17, 0.84), held(f"grpo/b{b}/s{s}", 0.26, 0.74)]
        out += [held(f"ucpo/b{b}/s{s}", 0.258 + w, 0.77 + w), held(f"dph_f/b{b}/s{s}", 0.21 + w, 0.84)]
        out += [held(f"passk_combined/b{b}/s{s}", 0.254 - w + 0.002 * b, 0.76 - 0.04 * ((b, s) == (1, 2)))]
        out += [held(f"dph_f_ucpo/b{b}/s{s}", 0.22, 0.85 + w), held(f"dph6_passk_combined/b{b}/s{s}", 0.255, 0.79 + w)]
    return out


def test_the_claim_needs_both_lower_bounds_and_names_the_worst_pair():
    by = study_stats.group(records())
    held_, lines = study6.claim_check(by, "ucpo")
    assert held_ == "HELD" and lines[0].endswith("lower bound above -0.01: MET") and "over 6 pairs" in lines[0]
    assert study6.claim_check(by, "dph_f")[0] == "MISSED (pass@1 missed)"
    missed, lines = study6.claim_check(by, "passk_combined")
    assert missed == "MISSED (pass@16 missed)" and "worst pair b1/s2 -0.020" in lines[1]
    assert study6.claim_check(by, "dph6_passk_combined")[0] == "HELD"  # −0.005 in every pair: a CI of width 0
    assert study6.claim_check(by, "dph_f_ucpo")[0] == "MISSED (pass@1 missed)"
    one = study_stats.group([r for r in records() if r["label"].endswith("/b0/s0")])
    assert study6.claim_check(one, "ucpo") == (
        "MISSED (pass@1, pass@16 missed)",
        ["- UCPO pass@1 − GRPO: 1 pair(s), no interval: MISS", "- UCPO pass@16 − GRPO: 1 pair(s), no interval: MISS"],
    )


def test_the_report_gives_the_claim_the_directions_and_the_figure_from_the_work_folder(tmp_path):
    study = study_runner.Study(tmp_path / "work")
    study.metrics.write_text("".join(json.dumps(r) + "\n" for r in records()))
    study6.write_report(study, study6.STUDY6, tmp_path / "study6_results.md", tmp_path / "study6.png")
    text = (tmp_path / "study6_results.md").read_text()
    assert (tmp_path / "study6.png").stat().st_size > 0 and "SMOKE" not in text and "(6 of 6)" in text
    assert "**UCPO: the claim HELD**" in text and "**DPH-F: the claim MISSED (pass@1 missed)**" in text
    assert "**K1: HELD** — DPH-F − GRPO" in text and "**K3: HELD** — UCPO − GRPO" in text
    assert "**K4: HELD** — DPH-F + UCPO − DPH-F" in text
    assert "- DPH-F(6) + Pass@k combined pass@16 − Pass@k combined: " in text  # not judged, reported
    assert (
        "| base × seed | base | GRPO | DPH-F | UCPO | Pass@k combined | DPH-F + UCPO | DPH-F(6) + Pass@k combined |"
        in text
    )


def test_the_command_line_mirrors_the_other_studies(tmp_path):
    args = study6.parse_args(["--smoke", "--work", str(tmp_path), "--slots", "1", "--deadline", "2026-12-07T12:00"])
    assert args.smoke and args.work == tmp_path and args.slots == 1 and args.deadline.tzinfo is not None
    assert study6.parse_args(["--report-only"]).report_only and not study6.parse_args([]).smoke
