"""The study's pre-registered selection rule (benchmarks/results/study_plan.md), on hand-made records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import diversity_collapse as dc  # noqa: E402

SELECT = f"val/{dc.SELECT}"


def study_with(tmp_path: Path, records: list[dict]) -> dc.Study:
    study = dc.Study(tmp_path)
    study.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    return study


def record(label: str, p1: float, p16: float) -> dict:
    return {"label": label, f"{SELECT}/pass@1": p1, f"{SELECT}/pass@16": p16}


def test_rule_picks_highest_pass16_among_configurations_that_raise_pass1_by_004(tmp_path):
    a, b, c = list(dc.ABLATION)[:3]
    study = study_with(tmp_path, [record("base/b0/s0", 0.40, 0.98), record(f"{a}/b0/s0", 0.45, 0.90),
                                  record(f"{b}/b0/s0", 0.44, 0.95), record(f"{c}/b0/s0", 0.43, 0.99)])  # fmt: skip
    name, flags, _ = dc.choose_dph(study)
    assert name == b and flags == dc.ABLATION[b]  # c has the highest pass@16 but raises pass@1 by 0.03 only


def test_rule_compares_with_the_base_validated_with_the_ablations_seeds_only(tmp_path):
    """Validations of base 0 with other seeds (the robust part adds them) do not move the threshold."""
    a, b = list(dc.ABLATION)[:2]
    records = [record("base/b0/s0", 0.41, 0.98), record(f"{a}/b0/s0", 0.46, 0.85), record(f"{b}/b0/s0", 0.445, 0.94)]
    before = dc.choose_dph(study_with(tmp_path, records))[0]
    after = dc.choose_dph(study_with(tmp_path, [*records, record("base/b0/s1", 0.39, 0.98), record("base/b0/s2", 0.39, 0.98)]))[0]
    assert before == after == a


def test_rule_without_a_qualifying_configuration_takes_the_best_sum(tmp_path):
    a, b = list(dc.ABLATION)[:2]
    study = study_with(tmp_path, [record("base/b0/s0", 0.50, 0.98), record(f"{a}/b0/s0", 0.45, 0.90), record(f"{b}/b0/s0", 0.40, 0.97)])
    name, _, why = dc.choose_dph(study)
    assert name == b and "no configuration reached" in why[0]
    assert dc.mean([0.1, 0.3]) == pytest.approx(0.2)


def test_methods_preset_runs_every_method_config_against_grpo_with_its_knob_swept():
    jobs = dc.methods_jobs()
    configs = {p.stem for p in (Path(__file__).resolve().parents[2] / "configs" / "demo").glob("*.yaml")}
    assert set(dc.METHODS) <= configs and set(dc.METHODS) == set(dc.EXPECTED)
    labels = {j.label for j in jobs}
    assert len(labels) == len(jobs)
    for method in ("grpo", *dc.METHODS):  # every method at its config's setting on 2 bases × 3 seeds
        assert {f"{method}/b{b}/s{s}" for b in (0, 1) for s in (0, 1, 2)} <= labels
    assert {"clip_cov_0.005/b0/s0", "clip_cov_0.05/b0/s1", "unlikeliness_0.5/b0/s1"} <= labels and "nsr_0.1/b0/s0" not in labels


@pytest.mark.parametrize("method", sorted(m for m, (flags, _) in dc.METHODS.items() if flags))
def test_each_knob_value_of_the_sweep_parses_and_reaches_its_option(method, print_config):
    root = Path(__file__).resolve().parents[2] / "configs" / "demo"
    flags, values = dc.METHODS[method]
    value = values[1]
    config = print_config("fit", "--config", str(root / "base.yaml"), "--config", str(root / f"{method}.yaml"), *flags(value))
    model = config["model"]["init_args"]
    options = {**model["loss"]["policy_loss_options"], **model["loss"]["token_mask_options"], **model["loss"]["advantage_options"],
               **((model.get("entropy") or {}).get("options") or {})}  # fmt: skip
    assert float(value) in {float(v) for v in options.values()}
    default = print_config("fit", "--config", str(root / "base.yaml"), "--config", str(root / f"{method}.yaml"), *flags(values[0]))
    assert default["model"] == print_config("fit", "--config", str(root / "base.yaml"), "--config", str(root / f"{method}.yaml"))["model"]


def test_expectations_are_checked_against_paired_differences_and_misses_said(tmp_path):
    held = f"val/{dc.HELD_OUT}"
    records = [{"label": f"grpo/b{b}/s{s}", f"{held}/pass@1": 0.40, f"{held}/pass@16": 0.70} for b in (0, 1) for s in (0, 1, 2)]
    records += [{"label": f"nsr/b{b}/s{s}", f"{held}/pass@1": 0.40 + 0.01 * (s - 1), f"{held}/pass@16": 0.80 + 0.01 * s}
                for b in (0, 1) for s in (0, 1, 2)]  # fmt: skip
    records += [{"label": f"psr/b{b}/s{s}", f"{held}/pass@1": 0.45 + 0.01 * s, f"{held}/pass@16": 0.70} for b in (0, 1) for s in (0, 1, 2)]
    by = dc.group(records)
    assert dc.expectation_check(by, "nsr", 16).endswith("expected +, seen +: MET")
    assert dc.expectation_check(by, "nsr", 1).endswith("expected =, seen =: MET")
    assert dc.expectation_check(by, "psr", 1).endswith("expected =, seen +: MISS")  # a miss is reported as a miss
    assert dc.expectation_check(by, "kl_cov", 1) == "- kl_cov pass@1: not run"


# ---------------------------------------------------------------------------- study 2: the demo's regime


def sel(label: str, p1: float, p16: float, held1: float = 0.0) -> dict:
    """A validation record: selection pass@1/16 (what the rule reads) and a held-out pass@1."""
    return {**record(label, p1, p16), f"val/{dc.HELD_OUT}/pass@1": held1}


def test_regime_rule_reads_the_selection_split_against_each_candidates_own_base(tmp_path):
    # "ws200" has the lower pass@1 but the larger gain over its own (200-step) base; held-out values point the other way
    records = [sel("base/b0/s0", 0.40, 0.95, 0.40), sel("base/b0/s1", 0.42, 0.95, 0.40),
               sel("base_ws200/b0/s0", 0.20, 0.85, 0.20), sel("base_ws200/b0/s1", 0.22, 0.85, 0.20),
               sel("ref/b0/s0", 0.45, 0.80, 0.90), sel("ref/b0/s1", 0.47, 0.80, 0.90),
               sel("ws200/b0/s0", 0.35, 0.70, 0.21), sel("ws200/b0/s1", 0.37, 0.70, 0.21)]  # fmt: skip
    name, why = dc.choose_regime(study_with(tmp_path, records))
    assert name == "ws200" and why[0].startswith("highest mean selection Δpass@1 (+0.150)")
    assert "| `ref` | 450 | 2e-04 | 120 | 2 | 0.050 ± 0.000 | +0.050 | -0.150 ± 0.000 | yes |" in why


def test_regime_rule_needs_pass16_to_fall_and_breaks_near_ties_by_the_cheaper_demo(tmp_path):
    records = [sel("base/b0/s0", 0.40, 0.95), sel("base_ws200/b0/s0", 0.20, 0.85),
               sel("lr1e-4/b0/s0", 0.55, 0.99),             # the largest gain, but pass@16 rose: no collapse to show
               sel("lr5e-5/b0/s0", 0.50, 0.90),             # +0.100
               sel("ws200_lr1e-4/b0/s0", 0.295, 0.80)]      # +0.095: within 0.01, fewer warm-start steps  # fmt: skip
    name, why = dc.choose_regime(study_with(tmp_path, records))
    assert name == "ws200_lr1e-4" and "within 0.01" in why[0] and "not confirmed" not in why[0]
    assert any(line.startswith("| `lr1e-4` |") and line.endswith("| no |") for line in why)


def test_regime_rule_below_the_bar_is_not_confirmed(tmp_path):
    name, why = dc.choose_regime(study_with(tmp_path, [sel("base/b0/s0", 0.40, 0.95), sel("ref/b0/s0", 0.43, 0.80)]))
    assert name == "ref" and "not confirmed" in why[0]
    assert dc.choose_regime(study_with(tmp_path, []))[0] is None


@pytest.mark.parametrize(("gains", "met"), [((0.10, 0.12, 0.09, 0.11, 0.10, 0.08), True),
                                           ((0.30, -0.10, 0.25, -0.05, 0.20, -0.12), False),  # mean +0.08, CI reaches below 0
                                           ((0.07, 0.07, 0.07, 0.06, 0.08, 0.07), False)])  # fmt: skip
def test_regime_criterion_needs_the_mean_gain_and_a_ci_above_zero(tmp_path, gains, met):
    records = []
    for i, g in enumerate(gains):
        b, s = divmod(i, 3)
        records += [sel(f"base_ws200/b{b}/s{s + 3}", 0.2, 0.9, 0.30), sel(f"confirm_ws200/b{b}/s{s + 3}", 0.2, 0.9, 0.30 + g)]
    ok, deltas, line = dc.regime_criterion(study_with(tmp_path, records), "ws200")
    assert ok is met and deltas == pytest.approx(list(gains)) and line.startswith("MET" if met else "NOT MET")


def test_regime_report_lists_every_run_the_choice_and_the_criterion(tmp_path):
    full = lambda label, x: {"label": label, **{f"val/{s}/pass@{k}": x for s in (dc.SELECT, dc.HELD_OUT, dc.OOD) for k in (1, 16, 32)},  # noqa: E731
                             f"val/{dc.HELD_OUT}/distinct_correct_answers": 2.0}  # fmt: skip
    records = [full(f"base_ws200/b0/s{s}", 0.2) for s in (0, 1)] + [full(f"ws200/b0/s{s}", 0.1) for s in (0, 1)]
    records[-1][f"val/{dc.SELECT}/pass@1"] = records[-2][f"val/{dc.SELECT}/pass@1"] = 0.35  # +0.15 on the selection split
    records += [full(f"base_ws200/b{b}/s{s}", 0.2) for b in (0, 1) for s in (3, 4, 5)]
    records += [full(f"confirm_ws200/b{b}/s{s}", 0.2 + 0.1 + 0.01 * s) for b in (0, 1) for s in (3, 4, 5)]
    study = study_with(tmp_path / "work", records)
    (study.work / "logs").mkdir()
    (study.work / "logs" / "ws200_b0_s0.log").write_text(f"\n$ lit-rlvr fit --config {dc.ROOT}/configs/demo/grpo.yaml --seed_everything=0\n")
    dc.write_regime_report(study, tmp_path / "report.md")
    text = (tmp_path / "report.md").read_text()
    assert "**Chosen: `ws200`**" in text and "**Acceptance criterion MET: held-out Δpass@1 0.140 ± " in text
    assert "| `confirm_ws200/b1/s5` | 0.200 → 0.350 (+0.150) |" in text and "| `ws200/b0/s1` | 0.200 → 0.350 (+0.150) |" in text
    assert "- `ws200/b0/s0`: `lit-rlvr fit --config configs/demo/grpo.yaml --seed_everything=0`" in text
