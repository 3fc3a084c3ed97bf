"""``lit-rlvr report``: the Pass@k table, and curves over training from CSV, TensorBoard and MetricsWriter logs."""

from __future__ import annotations

import contextlib
import io
import json
import struct
from pathlib import Path

import pytest

from lit_rlvr.tools.report import curve_panels, load_logs, main, read_event_file

DATA = Path(__file__).parent / "data"
# Written by Lightning's TensorBoardLogger with tensorboard 2.21 (hparams, a text summary, then
# log_metrics: train/reward 0.25·step for steps 0–3, the val/a metrics at step 3); these are
# the scalars tensorboard's own EventAccumulator reads from it.
TB_FILE = DATA / "tensorboard_run" / "events.out.tfevents.lightning"
TB_SCALARS = {
    "hp_metric": {0: -1.0},
    "train/reward": {0: 0.0, 1: 0.25, 2: 0.5, 3: 0.75},
    "epoch": {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0},
    "val/a/pass@1": {3: 0.375},
    "val/a/pass@4": {3: 0.625},
    "val/a/zero_variance_groups": {3: 0.5},
}


def run_main(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(list(args))
    return out.getvalue()


def csv_run(root: Path, name: str, points: dict[int, dict[str, float]]) -> Path:
    """A metrics.csv written by Lightning's CSVLogger itself."""
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(root, name="", version=name)
    for step, metrics in points.items():
        logger.log_metrics(metrics, step=step)
    logger.save()
    return Path(logger.log_dir) / "metrics.csv"


def test_event_file_reader_gives_what_tensorboard_reads_from_a_file_lightning_wrote():
    assert read_event_file(TB_FILE) == TB_SCALARS  # the text summary (no simple_value) is skipped


def test_a_cut_event_file_reads_up_to_its_last_whole_record(tmp_path):
    cut = tmp_path / "events.out.tfevents.cut"
    cut.write_bytes(TB_FILE.read_bytes()[:-3])  # a run still writing its last record
    scalars = read_event_file(cut)
    assert scalars["train/reward"] == TB_SCALARS["train/reward"] and "val/a/zero_variance_groups" not in scalars


def test_event_file_reader_matches_tensorboard_on_a_fresh_file(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (the committed file covers the format)")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path, name="", version="r")
    for step in range(0, 50, 7):
        logger.log_metrics(
            {"train/loss": 1.0 / (step + 1), "val/s/pass@8": step / 49, "val/s/pass^8": step / 98}, step=step
        )
    logger.finalize("success")
    acc = EventAccumulator(logger.log_dir)
    acc.Reload()
    expected = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    (events,) = Path(logger.log_dir).glob("events.out.tfevents.*")
    assert read_event_file(events) == expected
    assert "val/s/pass^8" in expected  # pass^k's name is a TensorBoard tag as it is


def test_logs_of_every_kind_become_runs_named_after_their_folders(tmp_path):
    csv_run(tmp_path / "logs", "grpo", {9: {"train/reward": 0.5}, 19: {"train/reward": 0.75, "val/a/pass@1": 0.25}})
    csv_run(tmp_path / "logs", "dph_f", {19: {"val/a/pass@1": 0.5}})
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"step": 0, "label": "base", "val/a/pass@1": 0.3},
                {"step": 5, "label": "base", "val/a/pass@1": 0.35},
            ]
        )
        + "\n"
    )
    (tmp_path / "logs" / "prompts.csv").write_text("q,a\n1,2\n")  # in a folder only metrics.csv is a log
    runs = load_logs([tmp_path / "logs", TB_FILE.parent, jsonl])
    assert runs == {
        "dph_f": {"val/a/pass@1": {19: 0.5}},
        "grpo": {"train/reward": {9: 0.5, 19: 0.75}, "val/a/pass@1": {19: 0.25}},
        "tensorboard_run": TB_SCALARS,
        "base": {"val/a/pass@1": {0: 0.3, 5: 0.35}},
    }
    assert load_logs([tmp_path / "logs" / "grpo"]) == {"grpo": runs["grpo"]}  # the run folder itself
    assert load_logs([tmp_path / "logs" / "grpo" / "metrics.csv"]) == {"grpo": runs["grpo"]}


def test_curve_panels_per_set_and_for_training():
    runs = {
        "grpo": {
            "val/a/pass@1": {10: 0.25, 20: 0.5},
            "val/a/pass@4": {10: 0.75, 20: 0.625},
            "val/a/pass@8": {10: 0.875, 20: 0.75},
            "val/a/distinct_correct_answers": {10: 2.0, 20: 1.0},
            "val/b/pass@1": {20: 0.5},
            "train/reward": {1: 0.1, 2: 0.2},
        },
        "dph_f": {"val/a/pass@1": {10: 0.25}, "val/a/pass@4": {10: 0.875}, "val/a/zero_variance_groups": {10: 0.5}},
    }
    rows = curve_panels(runs)
    assert [row[0].title for row in rows] == ["a: pass@1 (—), pass@4 (- -)", "b: pass@1", "training reward"]
    a = rows[0]
    assert a[0].lines["grpo"] == [("pass@1", {10: 0.25, 20: 0.5}), ("pass@4", {10: 0.75, 20: 0.625})]  # k both logged
    assert a[1].lines == {"grpo": [("gap", {10: 0.5, 20: 0.125})], "dph_f": [("gap", {10: 0.625})]}
    assert list(a[2].lines) == ["grpo"] and list(a[3].lines) == ["dph_f"]
    assert rows[1][0].lines == {"grpo": [("pass@1", {20: 0.5})]} and not rows[1][1].lines  # no gap with k = 1 only
    training = {panel.title: panel for panel in rows[2]}
    assert training["training reward"].lines == {"grpo": [("train/reward", {1: 0.1, 2: 0.2})]}
    assert (
        not training["mean token entropy"].lines and "per-step entropy logging" in training["mean token entropy"].absent
    )


def test_multi_turn_runs_get_their_behaviour_per_set_and_in_training():
    runs = {
        "grpo": {
            "val/a/pass@1": {10: 0.5},
            "val/a/turns": {10: 1.5, 20: 1.1},
            "val/a/single_turn": {10: 0.5, 20: 0.9},
            "train/turns": {1: 2.0, 2: 1.5},
            "train/distinct_tool_sequences": {1: 3.0, 2: 1.0},
        },
        "dph_f": {"val/a/pass@1": {10: 0.5}, "val/a/turns": {10: 2.0}, "val/a/tool_calls": {10: 1.0}},
        "single": {"val/a/pass@1": {10: 0.25}},
    }
    rows = curve_panels(runs)
    titles = [[panel.title for panel in row] for row in rows]
    assert titles[2] == [
        "a: turns per trajectory",
        "a: single-turn share",
        "a: tool calls per trajectory",
        "a: distinct tool-call sequences",
    ]
    assert titles[3][0] == "training turns per trajectory" and len(rows) == 4
    assert rows[2][0].lines == {"grpo": [("turns", {10: 1.5, 20: 1.1})], "dph_f": [("turns", {10: 2.0})]}
    assert rows[2][1].lines == {"grpo": [("single_turn", {10: 0.5, 20: 0.9})]} and list(rows[2][2].lines) == ["dph_f"]
    assert rows[3][3].lines == {"grpo": [("distinct_tool_sequences", {1: 3.0, 2: 1.0})]}
    assert len(curve_panels({"single": runs["single"]})) == 1  # a single-turn run draws no behaviour


def test_curves_cli_writes_one_png_and_says_what_is_not_logged(tmp_path):
    csv_run(
        tmp_path / "logs",
        "grpo",
        {9: {"train/reward": 0.5, "rollout/mean_len": 6.0}, 19: {"val/a/pass@1": 0.25, "val/a/pass@4": 0.5}},
    )
    out = tmp_path / "png" / "curves.png"
    printed = run_main("--curves", str(out), str(tmp_path / "logs"), str(TB_FILE))
    assert f"curves: {out}" in printed
    assert "curves: grpo: 4 metrics; train/entropy not logged" in printed
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", out.read_bytes()[16:24])
    assert (width, height) == (1680, 640)  # 4 panels × (one set + training) at 100 dpi


def test_table_mode_is_unchanged_and_the_modes_combine(tmp_path):
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"step": 0, "label": "base", "val/a/pass@1": 0.1},
                {"step": 0, "label": "base", "val/a/pass@1": 0.25, "val/a/pass@2": 0.5},
            ]
        )
    )
    printed = run_main(str(jsonl), "--out", str(tmp_path / "passk.png"))
    assert printed.splitlines()[:3] == [
        "| set | run | pass@1 | pass@2 | distinct correct | retention@max k |",
        "|---|---|---|---|---|---|",
        "| a | base | 0.250 | 0.500 | – | – |",
    ]  # each label's last record
    assert (tmp_path / "passk.png").is_file()
    both = run_main(str(jsonl), str(TB_FILE.parent), "--curves", str(tmp_path / "c.png"))
    assert "| a | base | 0.250 |" in both and (tmp_path / "c.png").is_file()


def test_report_errors_name_the_path_and_what_is_accepted(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"notes.txt is not a log it reads; accepted: a CSVLogger metrics.csv"):
        load_logs([tmp_path / "notes.txt"])
    with pytest.raises(ValueError, match=r"no metrics.csv or events.out.tfevents.\* file under .*empty"):
        load_logs([tmp_path / "empty"])
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        load_logs([tmp_path / "missing"])
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SystemExit, match="no records in .*empty.jsonl"):
        main([str(tmp_path / "empty.jsonl")])
    csv_run(tmp_path / "logs", "trained", {3: {"train/reward": 0.5}})
    with pytest.raises(
        SystemExit, match=r"no records in .*logs.* \(a MetricsWriter record, or a log with val/<set>/pass@k\)"
    ):
        main([str(tmp_path / "logs")])  # a log without a validation
    with pytest.raises(SystemExit, match=r"--base gives the curves their step 0; draw them with --curves OUT.png"):
        main([str(TB_FILE.parent), "--base", str(TB_FILE.parent)])
    (
        csv_run(tmp_path / "two", "a", {0: {"val/s/pass@1": 0.5}}),
        csv_run(tmp_path / "two", "b", {0: {"val/s/pass@1": 0.5}}),
    )
    with pytest.raises(
        SystemExit, match=r"--base .*two holds 2 runs \(a, b\) and none named 'base'; give the base policy's own log"
    ):
        main([str(TB_FILE.parent), "--curves", str(tmp_path / "c.png"), "--base", str(tmp_path / "two")])
    with pytest.raises(SystemExit, match=r"--base .*trained holds no validation"):
        main([str(TB_FILE.parent), "--curves", str(tmp_path / "c.png"), "--base", str(tmp_path / "logs" / "trained")])


def test_the_table_reads_each_logs_last_validation_as_it_reads_metrics_writer_records(tmp_path):
    """``lit-rlvr report runs/logs``: a CSV (or TensorBoard) log's last validation is one row per set, as a MetricsWriter record."""
    csv_run(
        tmp_path / "logs",
        "grpo",
        {
            40: {"val/a/pass@1": 0.25, "val/a/pass@2": 0.5},
            79: {"train/reward": 0.9},
            80: {"val/a/pass@1": 0.125, "val/a/pass@2": 0.375, "val/a/distinct_correct_answers": 1.5},
        },
    )
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text(json.dumps({"step": 0, "label": "base", "val/a/pass@1": 0.5, "val/a/pass@2": 0.75}) + "\n")
    printed = run_main(str(jsonl), str(tmp_path / "logs"), str(TB_FILE), "--out", str(tmp_path / "passk.png"))
    assert printed.splitlines()[2:5] == [
        "| a | base | 0.500 | 0.750 | – | – | – |",
        "| a | grpo | 0.125 | 0.375 | – | 1.50 | – |",  # step 80's, not step 40's
        "| a | tensorboard_run | 0.375 | – | 0.625 | – | – |",
    ]
    assert (tmp_path / "passk.png").is_file()


def test_a_method_has_one_colour_in_every_figure_and_the_base_is_black(tmp_path, monkeypatch):
    """The demo's two figures: pass@k against k (base, grpo, dph_f) and the curves (grpo, dph_f)."""
    from lit_rlvr.tools import report

    figures = []

    def colours_of(fig, out):
        figures.append(
            {
                line.get_label(): line.get_color()
                for ax in fig.axes
                for line in ax.get_lines()
                if not line.get_label().startswith("_")
            }
        )
        return Path(out)

    monkeypatch.setattr(report, "_save", colours_of)
    record = {"val/a/pass@1": 0.25, "val/a/pass@4": 0.5}
    report.plot({"base": record, "grpo": record, "dph_f": record}, tmp_path / "passk.png")
    series = {"val/a/pass@1": {40: 0.25}, "val/a/pass@4": {40: 0.5}, "train/reward": {1: 0.5}}
    report.plot_curves({"grpo": series, "dph_f": series}, tmp_path / "curves.png")
    passk, curves = figures
    assert (
        passk["base"] == "black"
        and passk["grpo"] == curves["grpo"]
        and passk["dph_f"] == curves["dph_f"] != curves["grpo"]
    )
    assert (curves["grpo"], curves["dph_f"]) == (
        "#d62728",
        "#1f77b4",
    )  # the collapse red, the cure blue (report.PALETTE)
    many = report.run_colours([f"run{i}" for i in range(9)])
    assert len(set(many.values())) == 9 and "black" not in many.values()  # as many runs as colours: each its own


def test_with_base_every_runs_validation_curves_start_at_step_0_from_the_bases_validation(tmp_path, monkeypatch):
    """``--base``: the base's last validation becomes step 0 of each val/ metric a run logged; its training curves are untouched."""
    from lit_rlvr.tools import report

    csv_run(tmp_path / "logs", "base", {0: {"val/a/pass@1": 0.5, "val/a/pass@4": 0.75, "val/b/pass@1": 0.25}})
    csv_run(tmp_path / "logs", "grpo", {1: {"train/reward": 0.5}, 40: {"val/a/pass@1": 0.625, "val/a/pass@4": 0.625}})
    drawn = {}
    monkeypatch.setattr(report, "plot_curves", lambda runs, out: drawn.update(runs) or Path(out))
    run_main(
        "--curves", str(tmp_path / "c.png"), "--base", str(tmp_path / "logs" / "base"), str(tmp_path / "logs" / "grpo")
    )
    assert drawn == {
        "grpo": {"train/reward": {1: 0.5}, "val/a/pass@1": {0: 0.5, 40: 0.625}, "val/a/pass@4": {0: 0.75, 40: 0.625}}
    }
    rows = curve_panels(drawn)
    assert rows[0][1].lines == {"grpo": [("gap", {0: 0.25, 40: 0.0})]}  # the gap closes from the base's


def test_one_label_over_two_environments_is_one_row_per_set_with_turns_and_tool_calls(tmp_path):
    """The agents demo: ``base`` validated on the countdown checker and, on its own, on the SQL agent
    (one file per lane): each set keeps its own record, later values of a metric replace earlier ones."""
    countdown, sql = tmp_path / "metrics_countdown.jsonl", tmp_path / "metrics_sql.jsonl"
    countdown.write_text(
        json.dumps({"label": "base", "val/c/pass@1": 0.1, "val/c/turns": 1.5, "val/c/tool_calls": 0.5}) + "\n"
    )
    sql.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"label": "base", "val/s/pass@1": 0.5, "val/s/turns": 2.0},
                {"label": "base", "val/s/pass@1": 0.75, "val/s/turns": 1.75, "val/s/tool_calls": 0.75},
            ]
        )
    )
    printed = run_main(str(countdown), str(sql))
    assert printed.splitlines() == [
        "| set | run | pass@1 | distinct correct | retention@max k | turns | tool calls | single-turn |",
        "|---|---|---|---|---|---|---|---|",
        "| c | base | 0.100 | – | – | 1.50 | 0.50 | – |",
        "| s | base | 0.750 | – | – | 1.75 | 0.75 | – |",
    ]


def test_pass_hat_k_is_drawn_beside_pass_at_k_and_leaves_the_table_as_it_was(tmp_path, monkeypatch):
    """``val/<set>/pass^k`` (docs/methods.md §4.5): dashed in the run's colour in --out, dotted in the
    curves' pass panel; the table keeps its pass@k columns only."""
    from lit_rlvr.tools import report

    record = {"val/a/pass@1": 0.5, "val/a/pass@2": 0.75, "val/a/pass^1": 0.5, "val/a/pass^2": 0.25}
    drawn = []
    monkeypatch.setattr(report, "_save", lambda fig, out: drawn.append(fig) or Path(out))
    report.plot({"grpo": record}, tmp_path / "passk.png")
    (ax,) = drawn[0].axes
    lines = {line.get_linestyle(): line.get_ydata().tolist() for line in ax.get_lines()}
    assert lines == {"-": [0.5, 0.75], "--": [0.5, 0.25]} and ax.get_ylabel() == "pass@k (—), pass^k (- -)"
    assert "pass^" not in report.markdown_table({"grpo": record})
    csv_run(tmp_path / "logs", "grpo", {10: record})  # Lightning's CSVLogger writes the name as it is
    runs = load_logs([tmp_path / "logs"]) | {"base": {"val/a/pass@1": {0: 0.25}, "val/a/pass@2": {0: 0.5}}}
    assert runs["grpo"] == {key: {10: value} for key, value in record.items()}
    (panels,) = curve_panels(runs)
    assert panels[0].title == "a: pass@1 (—), pass@2 (- -), pass^2 (···)"
    assert panels[0].lines["grpo"][2] == ("pass^2", {10: 0.25}) and len(panels[0].lines["base"]) == 2
