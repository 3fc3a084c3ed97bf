"""Framework overhead (lit_rlvr step vs the raw work called directly) and DPH-RL's offline cache vs
an online reference model (RKL).

Part 1 — overhead. ``raw`` is the same work with no framework: the same ``HFEngine`` generate
call, the same reward scorer, GRPO advantages, the same micro-batches of the clipped surrogate
(length-sorted, cropped, packed where ``padding_free="auto"`` packs: :class:`lit_rlvr.policy.MicroBatching`,
:func:`lit_rlvr.policy.completion_logprobs`, :func:`lit_rlvr.functional.losses.policy_loss`),
gradient clipping and an AdamW step, in a plain Python loop. ``lit_rlvr`` is ``Trainer.fit``
with ``RLVRModule`` + ``RolloutCallback(engine="hf", drift_every_n_steps=0)`` (the drift check is
extra work, not overhead). Target: lit_rlvr / raw ≤ 1.05.

Part 2 (``short`` workload only: a cache of 256-token π_ref samples takes minutes to build) —
DPH-RL vs RKL, both lit_rlvr with the same P × G × T rollouts per step:
``DPH-F`` reads 16 cached π_ref samples of D_pef prompts per step (``anchor_batch_size``, the
DataModule default) from a reference cache built beforehand with ``build_cache`` and adds
η·forward-KL on them (forward + backward on the anchors, no reference model);
``RKL`` keeps a frozen reference copy and adds β·KL(π_θ‖π_ref) (one no-grad reference forward
over the B rollouts). Half the prompts are ``easy`` (always rewarded), so D_pef is about half
the data: DPH trains on D_exp only (the overhead part trains on the other half only). Reported:
per-step ratio, and the per-epoch ratio (steps per epoch × step time). Target: DPH / RKL ≤ 0.8.

    python benchmarks/overhead.py                      # short: P=4 G=8 T=32, 3 alternated rounds × 6 steps
    python benchmarks/overhead.py --workload ragged    # overhead only: ≈10M params, up to 256 tokens
    python benchmarks/overhead.py --quick              # < 1 minute

Besides the ratio of step medians, each contender times the calls both share (``common.SharedCalls``:
generate, log-prob forwards, backward, AdamW step); what a step spends outside them is the
contender's own, and ``accounted_overhead`` = (S + lit_rlvr's own) / (S + raw's own), with S the
median shared seconds, is the overhead without the shared work's process-to-process noise.

Last line: ``overhead_ratio=<lit/raw> accounted_overhead=<a> dph_vs_rkl_step=<x> dph_vs_rkl_epoch=<y>``
(ragged: the first two only).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import common  # benchmarks/common.py (run as a script from any directory)


def raw_run(
    model_dir: Path, prompts_file: str, cfg: common.Workload, shared: common.SharedCalls | None = None
) -> common.StepRun:
    """The work of one GRPO step called directly (no Trainer, no callback, no logging).

    The same prompts in the same order (the same ``PromptDataModule``), the same sampling seeds
    (the callback's :func:`~lit_rlvr.rollout.seeds.step_sampling`), so the same
    completions as lit_rlvr's. The same micro-batches as ``RLVRModule``'s defaults: length-sorted, cropped, packed where
    ``padding_free="auto"`` packs (sdpa on CPU), losses weighted by ``aggregation_weight``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlvr.data import PromptDataModule
    from lit_rlvr.data.datamodule import DatasetSpec
    from lit_rlvr.functional.advantages import ADVANTAGES
    from lit_rlvr.functional.batching import aggregation_weight, crop_padding
    from lit_rlvr.functional.losses import policy_loss
    from lit_rlvr.options import default_optimizer
    from lit_rlvr.policy import MicroBatching, completion_logprobs, packs_sequences
    from lit_rlvr.rewards import BatchScorer
    from lit_rlvr.rollout.hf import HFEngine
    from lit_rlvr.rollout.seeds import step_sampling
    from lit_rlvr.rollout.types import SamplingParams

    tok = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").train()
    engine = HFEngine(policy, tok)
    scorer = BatchScorer(workers=0, timeout_s=10.0)
    optimizer = default_optimizer(policy.parameters())  # the library's: AdamW at lr 1e-6, fused
    dm = PromptDataModule(
        tokenizer=str(model_dir), train=DatasetSpec(files=prompts_file, name="bench"), batch_size=cfg.prompts, seed=0
    )
    dm.setup("fit")
    batches = iter(dm.train_dataloader())
    batching = MicroBatching(padding_free="auto")
    packed = packs_sequences(policy, batching.padding_free)
    sampling = SamplingParams(n=cfg.samples, max_new_tokens=cfg.new_tokens, seed=0)  # lit_fit_times's
    clock = common.StepClock(shared)
    for step in range(1 + cfg.warmup + cfg.steps):
        batch = next(batches)
        batch_rows, batch_ids = batch.rows, batch.prompt_ids
        params = step_sampling(sampling, step)  # the callback's per-step seed
        rollouts = engine.generate(batch_ids, params)
        scored = scorer.score(rollouts.texts, [r for r in batch_rows for _ in range(cfg.samples)])
        rewards = torch.tensor([s.reward for s in scored])
        data = rollouts.to_padded(tok.pad_token_id)
        data["advantages"] = ADVANTAGES["grpo"](rewards, data["group_ids"])
        for rows_idx in batching.split(data["attention_mask"], data["response_mask"], packed):
            part = crop_padding({k: v[rows_idx] for k, v in data.items()})
            T = part["response_mask"].shape[1]
            logprobs, _ = completion_logprobs(
                policy, part["input_ids"], part["attention_mask"], T, 1.0, padding_free=packed
            )
            loss, _ = policy_loss(
                logprobs, part["old_logprobs"], part["advantages"], part["response_mask"], max_len=cfg.new_tokens
            )
            (loss * aggregation_weight(part["response_mask"], data["response_mask"], "token_mean")).backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        clock.tick([len(c) for c in rollouts.completion_ids])
    scorer.close()
    return clock.run(cfg.warmup)


def raw_setup(model_dir: Path, prompts_file: str, work: common.Workload):
    """The raw contender (in its worker process): one call = one run of the steps; shared calls timed."""
    shared = common.SharedCalls().__enter__()  # for the worker's lifetime
    return common.report_shared(lambda: raw_run(model_dir, prompts_file, work, shared), shared)


def lit_setup(model_dir: Path, prompts_file: str, shape: dict, options: dict):
    """A lit_rlvr contender: ``options`` are :func:`common.lit_fit_times` keyword arguments; shared calls timed."""
    shared = common.SharedCalls().__enter__()
    return common.report_shared(
        lambda: common.lit_fit_times(model_dir, prompts_file, **shape, **options, shared=shared), shared
    )


def accounted_overhead(raw: common.StepRun, lit: common.StepRun) -> tuple[float, float]:
    """``((S + lit_own) / (S + raw_own), S)``: medians of each contender's seconds outside the shared
    calls, ``S`` the median seconds inside them over both contenders' steps (the same work, measured twice)."""
    import statistics

    shared = statistics.median([t - o for run in (raw, lit) for t, o in zip(run.times, run.own)])
    return (shared + statistics.median(lit.own)) / (shared + statistics.median(raw.own)), shared


def build_reference_cache(model_dir: Path, prompts_file: str, out: Path, cfg: common.Workload) -> dict[str, int]:
    """``build_cache`` over the benchmark prompts (n = 8 π_ref samples each); returns split sizes."""
    from lit_rlvr.cache.reader import ReferenceCache
    from lit_rlvr.cache.split import split_by_pass_count
    from lit_rlvr.data import CacheOptions, PromptDataModule
    from lit_rlvr.data.datamodule import DatasetSpec
    from lit_rlvr.options import PolicyOptions, SamplingParams, ScoringOptions
    from lit_rlvr.tools.cache import build_cache

    dm = PromptDataModule(
        tokenizer=str(model_dir),
        train=DatasetSpec(files=prompts_file, name="bench"),
        batch_size=cfg.prompts,
        cache=CacheOptions(str(out)),
    )
    build_cache(
        dm,
        PolicyOptions(str(model_dir)),
        SamplingParams(n=8, max_new_tokens=cfg.new_tokens, seed=0),
        engine="hf",
        scoring=ScoringOptions(workers=0),
        progress=False,
        prompts_per_call=8,
    )
    cache = ReferenceCache(str(out))
    split = split_by_pass_count(cache.ids, cache.pass_counts, cache.n, None)
    return {"prompts": len(cache.ids), "pef": len(split.pef), "exp": len(split.exp)}


def main() -> None:
    parser = common.step_parser(__doc__.split("\n")[0], "small work, 2 rounds: < 1 minute", default_workload="short")
    parser.add_argument("--eta", type=float, default=0.02, help="DPH-F η (and RKL β)")
    parser.add_argument("--only", choices=["raw", "lit", "dph", "rkl"], help="run one contender (profiling)")
    cfg = parser.parse_args()
    work = common.resolve_workload(cfg)
    with_dph = work.name == "short"  # a cache of 256-token π_ref samples would take minutes to build
    suffix = "" if work.name == "short" else f"_{work.name}"
    cfg.out = cfg.out or f"overhead{suffix}{'_quick' if cfg.quick else ''}.md"
    load_before, dirs, model_dir = common.start_bench(cfg, work.model)
    steps_per_run = 1 + work.warmup + work.steps
    rows = common.countdown_rows(2 * work.prompts * steps_per_run, easy_every=2)  # half of them easy (D_pef)
    prompts_file = common.write_jsonl(dirs / "prompts.jsonl", rows)
    plain = [r for r in rows if r["answer"] != "easy"]
    plain_file = common.write_jsonl(dirs / "plain.jsonl", plain)
    shape = {
        "prompts": work.prompts,
        "samples": work.samples,
        "new_tokens": work.new_tokens,
        "steps": work.steps,
        "warmup": work.warmup,
    }
    no_drift = {"drift_every_n_steps": 0}

    runs = {
        "raw (direct calls)": (raw_setup, (model_dir, plain_file, work)),
        "lit_rlvr (Trainer + callback)": (lit_setup, (model_dir, plain_file, shape, {"callback_kwargs": no_drift})),
    }
    if with_dph:
        from lit_rlvr.data import CacheOptions
        from lit_rlvr.options import AnchorOptions, KLOptions

        t0 = time.perf_counter()
        split = build_reference_cache(model_dir, prompts_file, dirs / "cache", work)
        cache_seconds = time.perf_counter() - t0
        print(f"reference cache built in {cache_seconds:.1f} s: {split}", flush=True)
        dph = {
            "callback_kwargs": no_drift,
            "data_kwargs": {"cache": CacheOptions(str(dirs / "cache"))},
            "module_kwargs": {"anchor": AnchorOptions(divergence="forward_kl", coef=cfg.eta)},
        }
        runs |= {
            "DPH-F (offline cache)": (lit_setup, (model_dir, prompts_file, shape, dph)),
            "RKL (online reference)": (
                lit_setup,
                (
                    model_dir,
                    prompts_file,
                    shape,
                    {"callback_kwargs": no_drift, "module_kwargs": {"kl": KLOptions(coef=cfg.eta)}},
                ),
            ),
        }
    if cfg.only:  # in this process, for a profiler
        keep = {
            "raw": "raw (direct calls)",
            "lit": "lit_rlvr (Trainer + callback)",
            "dph": "DPH-F (offline cache)",
            "rkl": "RKL (online reference)",
        }[cfg.only]
        setup, args = runs[keep]
        pooled = common.alternate({keep: setup(*args)}, work.rounds)
    else:
        # RSS is not reported here: the contenders fork from one process that imported the library once
        pooled, _ = common.alternate_in_workers(
            runs, work.rounds, cfg.threads, preload=["common", "lit_rlvr.cli.lightning_cli"]
        )
    load_after = common.load_average()
    med = {name: common.median_ms(run.times) for name, run in pooled.items()}

    lines = [
        f"# Framework overhead{' and DPH-RL vs RKL' if with_dph else ''}, {work.name} workload "
        f"({'quick' if cfg.quick else 'full'}; {time.strftime('%Y-%m-%d %H:%M')}; commit {common.git_rev()})",
        "",
        f"Work per step: P={work.prompts} prompts × G={work.samples} samples × up to T={work.new_tokens} new tokens; "
        f"random Llama, {work.model.label()}; {work.rounds} alternated rounds × {work.steps} timed steps (first "
        f"{1 + work.warmup} of each run dropped); all contenders alternate in one rotation, each in a process of its own.",
        f"{common.machine_line(cfg.threads)}. Load average (1/5/15 min) before: {load_before}; after: {load_after}.",
        "",
        "| contender | median step (ms) | p25–p75 (ms) | steps | ratio | outside the shared calls (ms, median) | "
        "generated lengths: mean ± sd [min–max] |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    headline = []
    pairs = [
        ("lit_rlvr (Trainer + callback)", "raw (direct calls)", "overhead_ratio"),
        ("DPH-F (offline cache)", "RKL (online reference)", "dph_vs_rkl_step"),
    ]
    ratio_of = {}
    for a, b, key in pairs:
        if a in med and b in med:
            ratio_of[a] = f"{med[a] / med[b]:.2f}x of {b.split(' (')[0]}"
            headline.append(f"{key}={med[a] / med[b]:.3f}")
    for name, run in pooled.items():
        own = f"{common.median_ms(run.own):.1f}" if run.own else "n/a"
        lines.append(
            f"| {name} | {med[name]:.1f} | {common.iqr_ms(run.times)} | {len(run.times)} | "
            f"{ratio_of.get(name, '1.00x')} | {own} | {common.length_summary(run.lengths)} |"
        )
    raw, lit = pooled.get("raw (direct calls)"), pooled.get("lit_rlvr (Trainer + callback)")
    if raw is not None and lit is not None:
        same = "the same" if raw.lengths == lit.lengths else "**different**"
        accounted, shared = accounted_overhead(raw, lit)
        headline.insert(1, f"accounted_overhead={accounted:.3f}")  # after overhead_ratio
        lines += [
            "",
            f"Completions: raw and lit_rlvr generated {same} completion lengths in every timed step "
            f"({len(lit.lengths)} completions), so both did the same work.",
            "",
            f"Accounted overhead: {accounted:.3f}x = (S + lit_rlvr's time outside the shared calls) / (S + raw's), "
            f"S = {shared * 1e3:.1f} ms, the median "
            "time inside the shared calls (generate, log-prob forwards, backward, AdamW step; `common.SHARED_CALLS`) "
            "over both contenders' steps. The step-time ratio above also carries the run-to-run noise of the shared "
            "work itself (±5–10% between processes doing identical work here).",
        ]
    if "DPH-F (offline cache)" in med and "RKL (online reference)" in med:
        dph_steps, rkl_steps = math.ceil(split["exp"] / work.prompts), math.ceil(split["prompts"] / work.prompts)
        epoch = (dph_steps * med["DPH-F (offline cache)"]) / (rkl_steps * med["RKL (online reference)"])
        headline.append(f"dph_vs_rkl_epoch={epoch:.3f}")
        lines += [
            "",
            f"Reference cache: {split['prompts']} prompts × n=8, |D_pef|={split['pef']}, |D_exp|={split['exp']}; built once "
            f"in {cache_seconds:.1f} s (not in any step). An epoch is {dph_steps} DPH steps (D_exp only) vs {rkl_steps} RKL "
            f"steps (all prompts): epoch time DPH/RKL = {epoch:.2f}x.",
        ]
    print("\n".join(lines[5:]))
    path = common.write_result(cfg.out, lines)
    print(f"wrote {path}")
    if headline:
        print(" ".join(headline))


if __name__ == "__main__":
    main()
