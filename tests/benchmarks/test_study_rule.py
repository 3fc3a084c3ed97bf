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
