"""What an environment step that spins past its deadline costs the rollouts after it.

    python benchmarks/env_timeout.py --threads 1     # P=4 × G=4, 3-turn rollouts, 5 rounds
    python benchmarks/env_timeout.py --quick         # 1 round: checks the script (seconds; --out or a temp folder)

A round times one multi-turn rollout (``TurnLoop.generate`` on the ``hf`` engine, an environment that
answers every turn; wall seconds and the process's CPU seconds) in a process that has just run a
rollout whose every environment step spins in Python (``while True: pass``) past ``step_timeout_s``
(the loop stops those threads at the deadline), against the same rollout after a rollout whose
first steps raise at once (the same engine work: one turn, then every trajectory ended; the
baseline); rounds alternate the two and medians are reported. The goal: the rollout after a
timed-out step within 10% of the baseline (issue 42: abandoned spinning threads made it 2.9 → 4.5 s
a step). Then, once, the same measurement after one trajectory (P=1, G=1) whose spinning thread is
abandoned instead of stopped (the loop before the fix, ``TurnLoop._stop`` replaced by one that stops
nothing), last, since that thread spins until the process exits. Also reported: environment threads
alive after each, and the process's CPU seconds over one second of sleep after it. The garbage of the
rollout before (both arms leave about 800 cyclic objects: frames, tracebacks of the failed calls) is
collected before the timed rollout: without that, which rollout pays for a collection of the whole
heap (torch's and transformers' objects, ~0.4 s) depends on the collector's allocation counts, not
on any thread (1.14× measured so, with no environment thread alive). Writes
``benchmarks/results/env_timeout.md``; the last line is
``env_timeout_after_over_baseline=<ratio> cpu=<ratio> abandoned=<ratio> abandoned_cpu=<ratio>`` (wall
seconds, then CPU seconds: on a loaded machine the CPU seconds are the steadier measure).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
from dataclasses import replace

import common  # benchmarks/common.py

from lit_rlvr.envs import EnvironmentBase, EnvSpec, Step


class Answers(EnvironmentBase):
    """Answers every turn at once and never ends the episode."""

    def step(self, action: str) -> Step:
        return Step("=ok\n", tool_call="x")


class Raises(EnvironmentBase):
    """A step that fails at once."""

    def step(self, action: str) -> Step:
        raise RuntimeError("gone")


class Spins(EnvironmentBase):
    """A step that never returns, spinning in Python."""

    def step(self, action: str) -> Step:
        while True:
            pass


def env_threads() -> int:
    return sum(t.name.startswith("lit-rlvr-env-") for t in threading.enumerate())


def idle_cpu_s() -> float:
    """CPU seconds the process uses over one second of sleep (≈0 when nothing runs in it)."""
    cpu = time.process_time()
    time.sleep(1.0)
    return time.process_time() - cpu


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="P=2 × G=2, 2 turns of 4 tokens, 1 round")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=0.5, help="step_timeout_s of the spinning rollout")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--out",
        help="file name under benchmarks/results/ (default env_timeout.md) or an absolute path (--quick: a temp folder)",
    )
    cfg = parser.parse_args(argv)
    if cfg.quick:
        cfg.prompts, cfg.samples, cfg.rounds, cfg.turns, cfg.turn_tokens = 2, 2, 1, 2, 4
    return cfg


def main(argv: list[str] | None = None) -> tuple[float, float]:
    cfg = parse_args(argv)
    load_before, _, model_dir = common.start_bench(argparse.Namespace(threads=cfg.threads))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlvr.rollout import build_engine
    from lit_rlvr.rollout.turns import TurnLoop, TurnOptions
    from lit_rlvr.rollout.types import SamplingParams

    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = build_engine("hf", model=AutoModelForCausalLM.from_pretrained(model_dir).eval(), tokenizer=tok)
    rows = common.countdown_rows(cfg.prompts)
    prompts = [tok(r["prompt"]).input_ids for r in rows]
    params = SamplingParams(n=cfg.samples, max_new_tokens=cfg.turn_tokens, seed=0)
    loop = TurnLoop(tok, TurnOptions(max_turns=cfg.turns, step_timeout_s=cfg.timeout))
    answers, raises, spins = (EnvSpec(n, {}, c, "1") for n, c in (("a", Answers), ("r", Raises), ("s", Spins)))

    def rollout(spec: EnvSpec, few: bool = False) -> tuple[float, float]:
        """Wall and CPU seconds of one rollout in ``spec`` (``few``: one prompt, one sample)."""
        t0, cpu = time.perf_counter(), time.process_time()
        out = loop.generate(
            engine,
            prompts[:1] if few else prompts,
            rows[:1] if few else rows,
            replace(params, n=1) if few else params,
            spec,
        )
        if spec is not answers:
            assert {e.status for e in out.episodes} == {"env_error" if spec is raises else "env_timeout"}, out.episodes
        return time.perf_counter() - t0, time.process_time() - cpu

    def after(spec: EnvSpec, few: bool = False) -> tuple[float, float, int]:
        """The answering rollout's wall and CPU seconds after a rollout in ``spec``, and the environment threads left."""
        rollout(spec, few)
        gc.collect()  # both arms leave ~800 cyclic objects (frames, tracebacks): not the collector's timing decides
        return (*rollout(answers), env_threads())

    try:
        rollout(answers)  # warm-up
        results: dict[str, list[tuple[float, float, int]]] = {"baseline": [], "stopped": []}
        for r in range(cfg.rounds):
            for name in ("baseline", "stopped")[r % 2 :] + ("baseline", "stopped")[: r % 2]:
                results[name].append(after(raises if name == "baseline" else spins))
                wall, cpu, _ = results[name][-1]
                print(f"  round {r + 1}/{cfg.rounds} {name}: {wall * 1e3:.0f} ms, {cpu * 1e3:.0f} ms CPU", flush=True)
        idle = {"baseline": idle_cpu_s()}
        rollout(spins)
        idle["stopped"] = idle_cpu_s()
        loop._stop = lambda calls: list(calls)  # the loop before the fix: nothing stopped, every thread abandoned
        results["abandoned"] = [after(spins, few=True)]
        idle["abandoned"] = idle_cpu_s()
        print(f"  abandoned: {results['abandoned'][0][0] * 1e3:.0f} ms", flush=True)
    finally:
        engine.close()
    base = statistics.median(r[0] for r in results["baseline"])
    cpu_base = statistics.median(r[1] for r in results["baseline"])
    lines = [
        "| rollout after | seconds (median) | / baseline | CPU seconds (median) | / baseline "
        "| environment threads alive after | CPU s over 1 s of sleep after |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    ratios, cpu_ratios = {}, {}
    for name, label in (
        ("baseline", "steps that raise at once"),
        ("stopped", "steps spinning past the deadline, stopped"),
        ("abandoned", "one step spinning past the deadline, abandoned (before the fix)"),
    ):
        seconds = statistics.median(r[0] for r in results[name])
        ratios[name] = seconds / base
        cpu_ratios[name] = statistics.median(r[1] for r in results[name]) / cpu_base
        lines.append(
            f"| {label} | {seconds:.3f} | {ratios[name]:.2f}× | {statistics.median(r[1] for r in results[name]):.3f} "
            f"| {cpu_ratios[name]:.2f}× "
            f"| {results[name][-1][2]} | {idle[name]:.2f} |"
        )
    header = [
        "# An environment step spinning past its deadline: the cost to the rollouts after it (benchmarks/env_timeout.py)",
        "",
        f"`python benchmarks/env_timeout.py {' '.join(sys.argv[1:] if argv is None else argv)}` at {common.git_rev()}; "
        f"{common.machine_line(cfg.threads)}; load average before {load_before}, after {common.load_average()}. "
        f"Engine `hf`, P={cfg.prompts} prompts × G={cfg.samples}, {cfg.turns} turns of {cfg.turn_tokens} tokens, "
        f"step_timeout_s {cfg.timeout:g}; median of {cfg.rounds} round(s) (the abandoned row: one run, last).",
        "",
    ]
    path = common.write_result(common.result_name(cfg.out, cfg.quick, "env_timeout.md"), header + lines)
    print("\n".join(lines))
    print(f"wrote {path}")
    print(
        f"env_timeout_after_over_baseline={ratios['stopped']:.3f} cpu={cpu_ratios['stopped']:.3f} "
        f"abandoned={ratios['abandoned']:.3f} abandoned_cpu={cpu_ratios['abandoned']:.3f}"
    )
    return ratios["stopped"], ratios["abandoned"]


if __name__ == "__main__":
    main()
