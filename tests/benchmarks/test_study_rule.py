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
