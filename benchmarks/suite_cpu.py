"""Where the test suite's CPU goes: every process it starts, and each test's share.

    python benchmarks/suite_cpu.py                                  # the suite as `make test` runs it
    python benchmarks/suite_cpu.py --out /tmp/s.md -- -n 1 tests/functional   # any pytest arguments
    python3 benchmarks/suite_cpu.py --ci --out /tmp/ci.md     # in a fresh clone: bash .ci/run, the install included

The environment is `make test`'s (one torch thread per test, bytecode written) unless yours sets it.

`make test`'s `--durations` gives each test's wall time, which on 2 busy cores is mostly waiting;
`/usr/bin/time` and ``getrusage`` miss the CPU of processes nobody reaps (a multiprocessing
forkserver's children, a killed `vllm serve`'s engine core). This runs pytest with a marker in its
environment and reads ``/proc`` twice a second: every process that carries the marker (all the
suite's descendants: pytest-xdist workers, `lit-rlvr` runs, DDP ranks, vLLM servers, benchmark
contenders, reward workers), its command, its CPU seconds and the test it was started under
(``PYTEST_CURRENT_TEST``, which pytest sets while a test runs and child processes inherit). A
pytest plugin (this module, loaded with ``-p suite_cpu``) adds each test's CPU inside the worker
that ran it. A process that lives less than the polling interval is missed, and one polled last
before it ended loses at most that interval of CPU. A test that builds its processes' environment
when its module is imported (a module-level copy of ``os.environ``) leaves them without a test's
name: they count in the totals and the kinds, not in a test's row.

The report: wall time, CPU seconds, how busy the cores were (CPU / (wall × cores)), CPU by kind
of process, the tests that cost most (their own CPU plus their processes') and the files.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

try:
    import pytest
except ImportError:  # `--ci` from a fresh clone's Python: the plugin runs in make test's pytest, not here
    pytest = None

ROOT = Path(__file__).resolve().parents[1]
MARK = "LIT_RLVR_SUITE_CPU"  # the marker's variable; its value names the run
OUT_DIR = "LIT_RLVR_SUITE_CPU_DIR"  # where the plugin writes each worker's per-test CPU
KINDS = (  # (kind, a piece of its command line), the first match wins
    ("pytest-xdist worker", "exec(eval(sys.stdin"),
    ("multiprocessing worker", "from multiprocessing."),  # before the modules a forkserver's preload names
    ("vllm serve", "vllm.entrypoints"),
    ("lit-rlvr", "lit_rlvr.cli"),
    ("torch inductor probe", "cdll.LoadLibrary"),
    ("reward launcher and its workers", "lit_rlvr.rewards.launcher"),
    ("benchmark script", "benchmarks/"),
    ("test script", "/tests/"),
    ("pytest", "-m pytest"),
    ("compiler", "cc1plus"),
    ("compiler", "g++"),
    ("python -c", "python -c"),
)


# ---------------------------------------------------------------------------------------------- the plugin


if pytest is not None:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """Times the test's own CPU in this process and appends it to the run's file."""
        folder = os.environ.get(OUT_DIR)
        before, start = resource.getrusage(resource.RUSAGE_SELF), _ticks()
        yield
        if folder:
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            row = {"test": item.nodeid, "cpu": cpu, "pid": os.getpid(), "start": start, "end": _ticks()}
            with open(Path(folder) / f"tests-{os.getpid()}.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")


def _ticks() -> float:
    """Now, in the clock ``/proc/PID/stat``'s start time counts in: clock ticks since boot."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------- the census


def _processes(needle: bytes, seen: dict) -> None:
    """Adds or updates every marked process in ``seen`` (key: pid and start time)."""
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            key = f"{pid}:{fields[19]}"
            cpu = (int(fields[11]) + int(fields[12])) / tick
            if key not in seen:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                if needle not in env:
                    seen[key] = None
                    continue
                test = next((v[20:].decode(errors="replace") for v in env if v.startswith(b"PYTEST_CURRENT_TEST=")), "")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                seen[key] = {
                    "command": command[:300],
                    "test": test.rsplit(" (", 1)[0],
                    "cpu": cpu,
                    "pid": int(pid),
                    "ppid": int(fields[1]),
                    "start": int(fields[19]),
                }
            elif seen[key] is not None:
                seen[key]["cpu"] = max(seen[key]["cpu"], cpu)
        except (OSError, IndexError, ValueError):  # it ended between the listing and the read
            continue


def census(
    command: list[str], interval: float = 0.5, env: dict[str, str] | None = None, make_settings: bool = True
) -> tuple[int, float, list[dict], dict[str, float]]:
    """Runs ``command`` marked (``env`` over this process's environment, over make test's settings unless
    ``make_settings`` is False: make sets them itself); ``(exit code, wall seconds, processes, each test's CPU
    inside its worker)``. Each process is named by the test that ran in the worker it descends from when it
    started (:func:`attribute`), else by the test its environment names."""
    name = uuid.uuid4().hex
    folder = Path(tempfile.mkdtemp(prefix="lit_rlvr_suite_cpu_"))
    # make test's settings: one torch thread per test, bytecode written (the Makefile says why); not for make
    # itself, whose `nproc` would read OMP_NUM_THREADS as the number of cores
    settings = {"OMP_NUM_THREADS": "1", "LIT_RLVR_TEST_THREADS": "1"}  # defaults: a caller's own win
    env = {**(settings if make_settings else {}), **os.environ, **(env or {}), MARK: name, OUT_DIR: str(folder)}
    if make_settings:  # over the environment's, as make's `export PYTHONDONTWRITEBYTECODE :=` does
        env["PYTHONDONTWRITEBYTECODE"] = ""
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *filter(None, [env.get("PYTHONPATH")])])
    seen: dict = {}
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, cwd=ROOT)
    while proc.poll() is None:
        _processes(f"{MARK}={name}".encode(), seen)
        time.sleep(interval)
    wall = time.perf_counter() - start
    own: dict[str, float] = collections.Counter()
    runs: list[dict] = []
    for path in folder.glob("tests-*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            own[row["test"]] += row["cpu"]
            runs.append(row)
    processes = [p for p in seen.values() if p]
    attribute(processes, runs)
    return proc.returncode, wall, processes, dict(own)


def attribute(processes: list[dict], runs: list[dict]) -> None:
    """Names each process by the test that was running, when it started, in the pytest worker it descends from.

    A process forked without ``exec`` (the tests' warm launcher's runs, reward workers, vLLM's forked engine
    cores) keeps in ``/proc`` the environment of the process it was forked from, so its ``PYTEST_CURRENT_TEST``
    names the test under which that launcher started, not its own. ``runs``: the plugin's rows (the worker's
    pid, each test's start and end in clock ticks since boot). A process with no worker among its ancestors, or
    started between two tests, keeps its environment's name."""
    by_worker: dict[int, list[dict]] = collections.defaultdict(list)
    for run in runs:
        if "pid" in run:
            by_worker[run["pid"]].append(run)
    by_pid: dict[int, list[dict]] = collections.defaultdict(list)  # a pid the system reused: its every owner
    for p in processes:
        by_pid[p["pid"]].append(p)

    def parent(p: dict) -> dict | None:
        owners = [q for q in by_pid.get(p["ppid"], ()) if q["start"] <= p["start"]]
        return max(owners, key=lambda q: q["start"]) if owners else None

    for p in processes:
        ancestor, hops = parent(p), 0
        while ancestor is not None and ancestor["pid"] not in by_worker and hops < 64:
            ancestor, hops = parent(ancestor), hops + 1
        if ancestor is None or ancestor["pid"] not in by_worker:
            continue
        # /proc's start is whole ticks, rounded down: a process started in the tick a test began may read one less;
        # of the tests that match, the one that began last
        matching = [r for r in by_worker[ancestor["pid"]] if r["start"] - 1 < p["start"] <= r["end"]]
        if matching:
            p["test"] = max(matching, key=lambda r: r["start"])["test"]


def kind(command: str) -> str:
    return next((k for k, piece in KINDS if piece in command), "other")


def report(
    code: int, wall: float, processes: list[dict], own: dict[str, float], argv: list[str], top: int
) -> list[str]:
    """The markdown report (module docstring)."""
    cpu = sum(p["cpu"] for p in processes)
    cores = os.cpu_count() or 1
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for p in processes:
        by_kind[kind(p["command"])].append(p["cpu"])
    tests: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])  # own, processes', count
    for test, seconds in own.items():
        tests[test][0] += seconds
    for p in processes:
        if p["test"] and kind(p["command"]) != "pytest-xdist worker":
            tests[p["test"]][1] += p["cpu"]
            tests[p["test"]][2] += 1
    files: dict[str, float] = collections.Counter()
    for test, (mine, theirs, _) in tests.items():
        files[test.split("::")[0]] += mine + theirs
    ranked = sorted(tests.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    return [
        f"# Where the suite's CPU goes ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"`python benchmarks/suite_cpu.py {' '.join(argv)}`: the command exited {code}; {wall:.0f} s wall, "
        f"{cpu:.0f} s of CPU in {len(processes)} processes, the {cores} cores {cpu / (wall * cores):.0%} busy; "
        f"{sum(own.values()):.0f} s of it inside the tests' own workers, "
        f"{sum(t[1] for t in tests.values()):.0f} s in processes the tests started.",
        "",
        "| kind of process | processes | CPU s | share |",
        "|---|---:|---:|---:|",
        *(
            f"| {k} | {len(v)} | {sum(v):.0f} | {sum(v) / max(cpu, 1e-9):.0%} |"
            for k, v in sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))
        ),
        "",
        f"The {top} tests that cost most (their own CPU in the worker plus their processes'):",
        "",
        "| test | CPU s | own | processes (count) |",
        "|---|---:|---:|---:|",
        *(f"| `{t}` | {a + b:.1f} | {a:.1f} | {b:.1f} ({n}) |" for t, (a, b, n) in ranked[:top]),
        "",
        "| test file | CPU s |",
        "|---|---:|",
        *(f"| `{f}` | {c:.1f} |" for f, c in sorted(files.items(), key=lambda kv: -kv[1])[:top]),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="suite_cpu.md", help="file name under benchmarks/results/ or an absolute path")
    parser.add_argument("--top", type=int, default=40, help="tests and files listed")
    parser.add_argument(
        "--ci",
        action="store_true",
        help="run CI's entry point (bash .ci/run: install, lint, make test) instead of pytest",
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: make test's)")
    return parser.parse_args(argv)


def command_of(cfg: argparse.Namespace) -> tuple[list[str], dict[str, str], bool]:
    """What to run: ``(command, environment added, make test's settings added)``."""
    if cfg.ci:
        return ["bash", ".ci/run"], {"CI": "true", "PYTEST_ADDOPTS": "-p suite_cpu"}, False
    pytest_args = cfg.pytest_args or ["-n", str((os.cpu_count() or 1) + 1), "--dist", "worksteal"]
    return [sys.executable, "-m", "pytest", "-p", "suite_cpu", "-q", *pytest_args], {}, True


def main(argv: list[str] | None = None) -> None:
    given = sys.argv[1:] if argv is None else argv
    cfg = parse_args(given)
    command, env, make_settings = command_of(cfg)
    code, wall, processes, own = census(command, env=env, make_settings=make_settings)
    lines = report(code, wall, processes, own, given, cfg.top)
    out = Path(cfg.out) if Path(cfg.out).is_absolute() else ROOT / "benchmarks" / "results" / cfg.out
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))
    print(f"wrote {out}")
    sys.exit(code)


if __name__ == "__main__":
    main()
