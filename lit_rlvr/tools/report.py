"""``lit-rlvr report``: the Pass@k table of finished runs, and the curves of a run over training.

    lit-rlvr report artifacts/demo/metrics.jsonl --out artifacts/demo/passk.png     # table + pass@k, pass^k against k
    lit-rlvr report artifacts/demo/runs/logs                                       # table of each run's last validation
    lit-rlvr report --curves artifacts/demo/curves.png --base artifacts/demo/runs/logs/base \
        artifacts/demo/runs/logs/grpo artifacts/demo/runs/logs/dph_f               # curves over steps, from the base at 0

The logs read are Lightning's ``CSVLogger`` (``metrics.csv``), its ``TensorBoardLogger``
(``events.out.tfevents.*``, read here without tensorboard) and MetricsWriter files (``*.jsonl``).
A folder is searched for CSV and TensorBoard logs; each folder holding logs is one run, named
after its path below the folder given (or its own name); a MetricsWriter file holds one run per
label.

The table (and ``--out``, pass@k against k, with pass^k dashed where logged) has one row per run and validation set: a
MetricsWriter label's last record, or a log's last validation (e.g. ``base`` and ``dph_f``);
each validation set is one panel (in-domain and out-of-domain). With ``--curves`` the logs are
drawn instead, and the table is the MetricsWriter files'.

``--curves`` draws, per validation set, pass@1 and pass@k over steps (and pass^k where logged), the gap pass@k − pass@1
(what the diversity collapse closes), distinct correct answers and the zero-variance share, and
the training reward, the training forward's mean token entropy (logged every step) and the
rollouts' mean response length; for multi-turn runs also their behaviour (docs/agents.md), per
validation set and in training: turns per trajectory, the single-turn share, tool calls per
trajectory and distinct tool-call sequences per prompt (the collapse to single-turn answers). One PNG. The x axis is the step the loggers record (Lightning's:
training batches that stepped the optimizer; MetricsWriter writes ``trainer.global_step``, the
same unless a batch takes several optimizer steps). ``--base`` names the base policy's
validation (a log of ``lit-rlvr validate`` with the fit's validation sets, so with its samples per
prompt and seeds): every run's validation curves start from it at step 0.

A run has one colour in every figure, chosen from its name (the base is black).
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import struct
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

_PASS = re.compile(r"^val/(?P<set>[^/]+)/pass@(?P<k>\d+)$")
_PASS_HAT = re.compile(r"^val/(?P<set>[^/]+)/pass\^(?P<k>\d+)$")  # pass^k (docs/methods.md §4.5)
_EVENTS = "events.out.tfevents."

Series = dict[str, dict[int, float]]  # metric name → {step: value}
BASE = "base"  # the label of the base policy's validation (configs/demo/record.yaml's, the Makefile's)
BASE_COLOUR = "black"
# matplotlib's tab10 less its grey (too close to the base's black), in an order that draws the demo's
# GRPO (the collapse) red and DPH-F (the cure) blue
PALETTE = ("#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#1f77b4", "#d62728", "#bcbd22", "#17becf")


def run_colours(names) -> dict[str, str]:
    """A colour per run that follows from its name alone, so a method keeps it in every figure.

    The base (:data:`BASE`) is black; another name takes the :data:`PALETTE` entry its hash points to,
    or, when a name before it (in sorted order) has that one, the next free entry.

    Example:
        >>> colours = run_colours(["grpo", "base", "dph_f"])
        >>> colours["base"], colours["grpo"] == run_colours(["grpo"])["grpo"], colours["grpo"] != colours["dph_f"]
        ('black', True, True)
    """
    colours, taken = {}, set()
    for name in sorted(set(names)):
        if name == BASE:
            colours[name] = BASE_COLOUR
            continue
        start = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
        order = [PALETTE[(start + i) % len(PALETTE)] for i in range(len(PALETTE))]
        colours[name] = next((c for c in order if c not in taken), order[0])  # more runs than colours: some share
        taken.add(colours[name])
    return colours


def load_runs(path: str | Path) -> dict[str, dict[str, float]]:
    """``{label: metrics}``: each label's records merged in file order, a later value of a metric
    replacing an earlier one (one label may hold several validation sets, each run on its own, as
    the agents demo's ``base`` on the countdown checker and on the SQL agent).

    Example:
        >>> import tempfile, json
        >>> path = Path(tempfile.mkdtemp()) / "m.jsonl"
        >>> records = [{"val/a/pass@1": 0.1}, {"val/b/pass@1": 0.2}, {"val/a/pass@1": 0.3}]
        >>> _ = path.write_text("".join(json.dumps({"label": "base", **r}) + chr(10) for r in records))
        >>> load_runs(path)
        {'base': {'label': 'base', 'val/a/pass@1': 0.3, 'val/b/pass@1': 0.2}}
    """
    return {label: {k: v for r in records for k, v in r.items()} for label, records in _jsonl_records(path).items()}


def _jsonl_records(path: str | Path) -> dict[str, list[dict]]:
    """MetricsWriter records by label, in file order."""
    runs: dict[str, list[dict]] = {}
    for line_no, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{line_no}: not a JSON record ({err})") from err
        runs.setdefault(record.get("label", "run"), []).append(record)
    return runs


def pass_curves(metrics: dict[str, float], pattern: re.Pattern = _PASS) -> dict[str, dict[int, float]]:
    """``{set: {k: pass@k}}`` from one record (``pattern=_PASS_HAT``: ``{set: {k: pass^k}}``).

    Example:
        >>> pass_curves({"val/a/pass@1": 0.2, "val/a/pass@4": 0.5, "val/a/maj@4": 0.3, "val/a/pass^4": 0.1, "step": 3})
        {'a': {1: 0.2, 4: 0.5}}
        >>> pass_curves({"val/a/pass@4": 0.5, "val/a/pass^4": 0.1}, _PASS_HAT)
        {'a': {4: 0.1}}
    """
    curves: dict[str, dict[int, float]] = {}
    for key, value in metrics.items():
        m = pattern.match(key)
        if m:
            curves.setdefault(m["set"], {})[int(m["k"])] = float(value)
    return {s: dict(sorted(c.items())) for s, c in sorted(curves.items())}


def markdown_table(runs: dict[str, dict[str, float]]) -> str:
    """One row per (validation set, run), one column per k, plus distinct correct answers and retention,
    and for multi-turn runs their turns and tool calls per trajectory and single-turn share.

    Example:
        >>> print(markdown_table({"base": {"val/a/pass@1": 0.25, "val/a/pass@2": 0.5}}))
        | set | run | pass@1 | pass@2 | distinct correct | retention@max k |
        |---|---|---|---|---|---|
        | a | base | 0.250 | 0.500 | – | – |
        >>> print(markdown_table({"grpo": {"val/a/pass@1": 0.5, "val/a/turns": 1.25, "val/a/single_turn": 0.75}}))
        | set | run | pass@1 | distinct correct | retention@max k | turns | tool calls | single-turn |
        |---|---|---|---|---|---|---|---|
        | a | grpo | 0.500 | – | – | 1.25 | – | 0.750 |
    """
    curves = {label: pass_curves(m) for label, m in runs.items()}
    ks = sorted({k for c in curves.values() for s in c.values() for k in s})
    multi_turn = any(key.endswith("/turns") for m in runs.values() for key in m)
    head = "| set | run | " + " | ".join(f"pass@{k}" for k in ks) + " | distinct correct | retention@max k |"
    head += " turns | tool calls | single-turn |" if multi_turn else ""
    lines = [head, "|" + "---|" * (len(ks) + 4 + 3 * multi_turn)]
    sets = sorted({s for c in curves.values() for s in c})
    for s in sets:
        for label, c in curves.items():
            if s not in c:
                continue
            cells = [f"{c[s][k]:.3f}" if k in c[s] else "–" for k in ks]
            m = runs[label]
            distinct = m.get(f"val/{s}/distinct_correct_answers")
            retention = [v for key, v in m.items() if key.startswith(f"val/{s}/retention/pass@")]
            extra = [f"{distinct:.2f}" if distinct is not None else "–", f"{retention[-1]:.3f}" if retention else "–"]
            if multi_turn:
                turns, calls = m.get(f"val/{s}/turns"), m.get(f"val/{s}/tool_calls")
                single = m.get(f"val/{s}/single_turn")
                extra += [f"{x:.2f}" if x is not None else "–" for x in (turns, calls)]
                extra.append(f"{single:.3f}" if single is not None else "–")
            lines.append(f"| {s} | {label} | " + " | ".join(cells + extra) + " |")
    return "\n".join(lines)


def results_table(results: list[dict[str, float]]) -> str:
    """``trainer.validate``'s results (one dict per dataloader) as one table: a column per
    validation set, a row per metric, so each set's metrics appear once.

    Example:
        >>> print(results_table([{"val/a/pass@1": 0.25, "val_rollout/seconds/dataloader_idx_0": 2.0},
        ...                      {"val/b/pass@1": 0.5, "val/b/pass@4": 0.75}]))
        metric               a      b
        pass@1          0.2500 0.5000
        rollout/seconds 2.0000      –
        pass@4               – 0.7500
    """
    columns: dict[str, dict[str, float]] = {}
    for i, metrics in enumerate(results):
        names = {k.split("/")[1] for k in metrics if k.startswith("val/") and k.count("/") >= 2}
        name = names.pop() if len(names) == 1 else f"dataloader {i}"
        column = columns.setdefault(name, {})
        for key, value in metrics.items():
            key = re.sub(r"/dataloader_idx_\d+$", "", key)
            key = key.removeprefix(f"val/{name}/").removeprefix("val_")
            column[key] = float(value)
    rows = list(dict.fromkeys(k for c in columns.values() for k in c))
    cells = [["metric", *columns]] + [[r, *(f"{c[r]:.4f}" if r in c else "–" for c in columns.values())] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join(
        " ".join(v.ljust(widths[0]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(row)) for row in cells
    )


def plot(runs: dict[str, dict[str, float]], out: str | Path) -> Path:
    """pass@k against k (log scale), one panel per validation set, one line per run; pass^k (all k
    samples correct) dashed in the run's colour where it was logged."""
    plt = _pyplot()
    curves = {label: pass_curves(m) for label, m in runs.items()}
    hats = {label: pass_curves(m, _PASS_HAT) for label, m in runs.items()}
    sets = sorted({s for c in curves.values() for s in c})
    colours = run_colours(runs)
    fig, axes = plt.subplots(1, max(len(sets), 1), figsize=(5 * max(len(sets), 1), 4), squeeze=False)
    for ax, s in zip(axes[0], sets):
        for label, c in curves.items():
            if s in c:
                ax.plot(list(c[s]), list(c[s].values()), marker="o", label=label, color=colours[label])
            if s in hats[label]:
                hat = hats[label][s]
                ax.plot(list(hat), list(hat.values()), marker="o", linestyle="--", color=colours[label])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k")
        ax.set_ylabel("pass@k (—), pass^k (- -)" if any(s in h for h in hats.values()) else "pass@k")
        ax.set_title(s)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, out)


# ---------------------------------------------------------------------------------- run logs


def read_csv_log(path: str | Path) -> Series:
    """Every metric of a Lightning ``CSVLogger`` ``metrics.csv`` (one row per logging call, blanks elsewhere).

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "metrics.csv"
        >>> _ = f.write_text("epoch,step,train/reward,val/a/pass@1\\n0,9,0.5,\\n0,9,,0.25\\n0,19,0.75,\\n")
        >>> read_csv_log(f)
        {'train/reward': {9: 0.5, 19: 0.75}, 'val/a/pass@1': {9: 0.25}}
    """
    series: Series = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(float(row.pop("step")))
            row.pop("epoch", None)
            for key, value in row.items():
                if value not in ("", None):
                    series.setdefault(key, {})[step] = float(value)
    return series


def read_event_file(path: str | Path) -> Series:
    """The scalars (``simple_value``, as Lightning's TensorBoardLogger writes them) of a TensorBoard event file.

    The file is a sequence of TFRecords (length, CRC, an ``Event`` protobuf, CRC); the few
    protobuf fields a scalar needs are decoded here, so no tensorboard install is required. A
    record cut short (a run still writing) ends the read.
    """
    series: Series = {}
    data = Path(path).read_bytes()
    for event in _tfrecords(data):
        step, values = 0, []
        for field, value in _proto_fields(event):
            if field == 2:  # Event.step (int64)
                step = value
            elif field == 5:  # Event.summary
                values += [v for f, v in _proto_fields(value) if f == 1]  # Summary.value
        for raw in values:
            fields = dict(_proto_fields(raw))  # Summary.Value: tag = 1, simple_value = 2 (float)
            if 1 in fields and 2 in fields:
                series.setdefault(fields[1].decode(), {})[step] = struct.unpack("<f", fields[2])[0]
    return series


def _tfrecords(data: bytes) -> Iterator[bytes]:
    """The payloads of TFRecord framing: uint64 length, uint32 CRC, payload, uint32 CRC (CRCs not checked)."""
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + length + 4
        if end > len(data):
            return
        yield data[pos + 12 : pos + 12 + length]
        pos = end


def _proto_fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """``(field number, value)`` of a protobuf message: varints as int, other wire types as bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = buf[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} (field {field})")
        yield field, value


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _jsonl_series(path: str | Path) -> dict[str, Series]:
    """MetricsWriter records as ``{label: series}`` (x = each record's ``step``)."""
    runs: dict[str, Series] = {}
    for label, records in _jsonl_records(path).items():
        series = runs.setdefault(label, {})
        for record in records:
            for key, value in record.items():
                if key not in ("step", "label"):
                    series.setdefault(key, {})[int(record.get("step", 0))] = float(value)
    return runs


def last_validation(series: Series) -> dict[str, float]:
    """A log's last validation as one record: its ``val/`` metrics at the last step with a pass@k ({} if none).

    Example:
        >>> last_validation({"val/a/pass@1": {10: 0.25, 20: 0.5}, "val/a/distinct_correct_answers": {20: 2.0},
        ...                  "val/a/zero_variance_groups": {10: 0.5}, "train/reward": {20: 0.1}})
        {'val/a/pass@1': 0.5, 'val/a/distinct_correct_answers': 2.0}
    """
    steps = [t for key, points in series.items() if _PASS.match(key) for t in points]
    if not steps:
        return {}
    step = max(steps)
    return {key: points[step] for key, points in series.items() if key.startswith("val/") and step in points}


def starting_from(runs: dict[str, Series], base: Series) -> dict[str, Series]:
    """``runs`` with the base's last validation as step 0 of each ``val/`` metric a run logged (unless it logged step 0).

    Example:
        >>> starting_from({"grpo": {"val/a/pass@1": {40: 0.5}, "train/reward": {1: 0.1}}},
        ...               {"val/a/pass@1": {0: 0.25}, "val/b/pass@1": {0: 0.75}})
        {'grpo': {'val/a/pass@1': {0: 0.25, 40: 0.5}, 'train/reward': {1: 0.1}}}
    """
    start = last_validation(base)
    return {
        name: {
            key: {0: start[key], **points} if key in start and 0 not in points else points
            for key, points in series.items()
        }
        for name, series in runs.items()
    }


def load_logs(paths: list[str | Path]) -> dict[str, Series]:
    """``{run: series}`` from log files and folders (searched for ``metrics.csv`` and event files)."""
    runs: dict[str, Series] = {}
    for given in map(Path, paths):
        if not given.exists():
            raise FileNotFoundError(f"lit-rlvr report: {given} does not exist")
        found_in = (f for f in given.rglob("*") if f.name == "metrics.csv" or _log_kind(f) == "events")
        files = sorted(found_in) if given.is_dir() else [given]
        if given.is_dir() and not files:
            raise ValueError(f"lit-rlvr report: no metrics.csv or {_EVENTS}* file under {given}")
        for f in files:
            kind = _log_kind(f)
            if kind == "jsonl":
                found = _jsonl_series(f)
            elif kind is None:
                raise ValueError(
                    f"lit-rlvr report: {f} is not a log it reads; accepted: a CSVLogger metrics.csv, a TensorBoard "
                    f"{_EVENTS}* file, a MetricsWriter .jsonl file, or a folder holding CSV/TensorBoard logs"
                )
            else:
                name = str(f.parent.relative_to(given)) if given.is_dir() and f.parent != given else f.parent.name
                found = {name: read_csv_log(f) if kind == "csv" else read_event_file(f)}
            for name, series in found.items():
                for key, points in series.items():
                    runs.setdefault(name, {}).setdefault(key, {}).update(points)
    return runs


def _log_kind(path: Path) -> str | None:
    if path.name.endswith(".csv") and path.is_file():
        return "csv"
    if path.name.startswith(_EVENTS) and path.is_file():
        return "events"
    return "jsonl" if path.suffix == ".jsonl" and path.is_file() else None


# ---------------------------------------------------------------------------------- curves


class Panel(NamedTuple):
    """One axes of the curves figure."""

    title: str
    lines: dict[
        str, list[tuple[str, dict[int, float]]]
    ]  # run → [(line, {step: value})]: the first solid, others dashed
    absent: str = "not logged"  # shown when no run has a line


_TRAIN_PANELS = (
    ("train/reward", "training reward", "not logged"),
    (
        "train/entropy",
        "mean token entropy",
        "not logged: runs of lit_rlvr before per-step entropy logging had it only "
        "with model.recompute_old_logprobs or an entropy-using advantage",
    ),
    ("rollout/mean_len", "response length (tokens)", "not logged"),
)
_BEHAVIOUR_PANELS = (
    ("turns", "turns per trajectory"),
    ("single_turn", "single-turn share"),
    ("tool_calls", "tool calls per trajectory"),
    ("distinct_tool_sequences", "distinct tool-call sequences"),
)  # the multi-turn runs' behaviour (lit_rlvr.metrics.behaviour)


def curve_panels(runs: dict[str, Series]) -> list[list[Panel]]:
    """The curves figure as rows of :class:`Panel`.

    One row per validation set (pass@1 and pass@k, and pass^k dotted where logged, their gap, distinct correct answers,
    zero-variance share; k is the largest budget every run logged for the set), then one row of
    training curves (reward, token entropy, response length) when any run logged ``train/``, and
    one row of multi-turn behaviour per validation set and for training where a run logged it
    (``val/<set>/turns``, ``train/turns``, …).

    Example:
        >>> runs = {"grpo": {"val/a/pass@1": {10: 0.4, 20: 0.5}, "val/a/pass@4": {10: 0.6, 20: 0.6}}}
        >>> [[panel.title for panel in row] for row in curve_panels(runs)]
        [['a: pass@1 (—), pass@4 (- -)', 'a: pass@4 − pass@1', 'a: distinct correct answers', 'a: zero-variance share']]
        >>> curve_panels(runs)[0][1].lines
        {'grpo': [('gap', {10: 0.2, 20: 0.1})]}
    """
    sets = sorted({m["set"] for series in runs.values() for key in series if (m := _PASS.match(key))})
    rows = []
    for s in sets:
        logged = [
            {int(m["k"]) for key in series if (m := _PASS.match(key)) and m["set"] == s} for series in runs.values()
        ]
        k = max(set.intersection(*[ks for ks in logged if ks]))
        passes, gap, distinct, zero_var = {}, {}, {}, {}
        for name, series in runs.items():
            p1, pk = series.get(f"val/{s}/pass@1"), series.get(f"val/{s}/pass@{k}")
            hat = series.get(f"val/{s}/pass^{k}") if k > 1 else None
            if p1:
                passes[name] = [("pass@1", p1)] + ([(f"pass@{k}", pk)] if pk and k > 1 else [])
                passes[name] += [(f"pass^{k}", hat)] if hat and len(passes[name]) == 2 else []
            if p1 and pk and k > 1:
                gap[name] = [("gap", {t: round(pk[t] - p1[t], 12) for t in sorted(p1.keys() & pk.keys())})]
            for lines, key in ((distinct, "distinct_correct_answers"), (zero_var, "zero_variance_groups")):
                if series.get(f"val/{s}/{key}"):
                    lines[name] = [(key, series[f"val/{s}/{key}"])]
        title = f"{s}: pass@1 (—), pass@{k} (- -)" if k > 1 else f"{s}: pass@1"
        title += f", pass^{k} (···)" if any(len(lines) == 3 for lines in passes.values()) else ""
        rows.append(
            [
                Panel(title, passes),
                Panel(f"{s}: pass@{k} − pass@1", gap, "no pass@k with k > 1 logged by every run"),
                Panel(f"{s}: distinct correct answers", distinct),
                Panel(f"{s}: zero-variance share", zero_var),
            ]
        )
    if any(key.startswith("train/") for series in runs.values() for key in series):
        rows.append(
            [
                Panel(title, {name: [(key, series[key])] for name, series in runs.items() if series.get(key)}, absent)
                for key, title, absent in _TRAIN_PANELS
            ]
        )
    for prefix, label in [*((f"val/{s}/", f"{s}: ") for s in sets), ("train/", "training ")]:
        if any(series.get(f"{prefix}turns") for series in runs.values()):
            rows.append(
                [
                    Panel(
                        label + title,
                        {
                            name: [(key, series[prefix + key])]
                            for name, series in runs.items()
                            if series.get(prefix + key)
                        },
                    )
                    for key, title in _BEHAVIOUR_PANELS
                ]
            )
    return rows


def plot_curves(runs: dict[str, Series], out: str | Path) -> Path:
    """Draw :func:`curve_panels` into one PNG, a colour per run."""
    plt = _pyplot()
    rows = curve_panels(runs)
    if not rows:
        raise ValueError("lit-rlvr report --curves: no val/<set>/pass@k and no train/ metric in the logs given")
    ncols = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), ncols, figsize=(4.2 * ncols, 3.2 * len(rows)), squeeze=False)
    colours = run_colours(runs)
    for row, ax_row in zip(rows, axes):
        for panel, ax in zip(row, ax_row):
            for name, lines in panel.lines.items():
                for i, (_, points) in enumerate(lines):
                    steps = sorted(points)
                    ax.plot(
                        steps,
                        [points[t] for t in steps],
                        marker="o",
                        ms=3,
                        color=colours[name],
                        linestyle=("-", "--", ":")[min(i, 2)],
                        label=name if i == 0 else None,
                    )
            if panel.lines:
                ax.legend(fontsize=7)
            else:
                ax.text(
                    0.5,
                    0.5,
                    textwrap.fill(panel.absent, 36),
                    ha="center",
                    va="center",
                    fontsize=8,
                    transform=ax.transAxes,
                )
            ax.set_title(panel.title, fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        for ax in ax_row[len(row) :]:
            ax.set_visible(False)
    return _save(fig, out)


def _base_series(path: str) -> Series:
    """The one run of the log at ``path`` (or its run labelled :data:`BASE`)."""
    found = load_logs([path])
    if len(found) != 1 and BASE not in found:
        raise SystemExit(
            f"lit-rlvr report: --base {path} holds {len(found)} runs ({', '.join(found)}) and none named "
            f"{BASE!r}; give the base policy's own log"
        )
    series = found[BASE] if BASE in found else next(iter(found.values()))
    if not last_validation(series):
        raise SystemExit(f"lit-rlvr report: --base {path} holds no validation (no val/<set>/pass@k)")
    return series


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> str:
    """Print the table of the runs given and write the PNGs (``--out``, ``--curves``)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="lit-rlvr report", description=__doc__)
    parser.add_argument(
        "paths", nargs="+", help="MetricsWriter .jsonl files, CSV/TensorBoard logs and folders holding them"
    )
    parser.add_argument("--out", type=str | None, default=None, help="PNG of pass@k against k (the table's runs)")
    parser.add_argument("--curves", type=str | None, default=None, help="PNG of the curves over training steps")
    parser.add_argument(
        "--base", type=str | None, default=None, help="the base policy's validation log: the curves' step 0"
    )
    args = parser.parse_args(argv)
    if args.base and not args.curves:
        raise SystemExit("lit-rlvr report: --base gives the curves their step 0; draw them with --curves OUT.png")
    jsonl = [p for p in args.paths if str(p).endswith(".jsonl")]
    runs: dict[str, dict[str, float]] = {}
    for path in jsonl:
        for label, record in load_runs(path).items():
            runs.setdefault(label, {}).update(record)
    if args.curves is None and (logs := [p for p in args.paths if p not in jsonl]):
        runs |= {name: record for name, series in load_logs(logs).items() if (record := last_validation(series))}
    if not runs and (args.curves is None or args.out):
        raise SystemExit(
            f"lit-rlvr report: no records in {', '.join(map(str, args.paths))} for the table/--out "
            "(a MetricsWriter record, or a log with val/<set>/pass@k)"
        )
    table = markdown_table(runs) if runs else ""
    if table:
        print(table)
    if args.out:
        print(f"plot: {plot(runs, args.out)}")
    if args.curves:
        logs = load_logs(args.paths)
        if args.base:
            logs = starting_from(logs, _base_series(args.base))
        for name, series in logs.items():
            trained = any(key.startswith("train/") for key in series)
            absent = [f"; {key} {note}" for key, _, note in _TRAIN_PANELS if trained and key not in series]
            print(f"curves: {name}: {len(series)} metrics" + "".join(absent))
        print(f"curves: {plot_curves(logs, args.curves)}")
    return table
