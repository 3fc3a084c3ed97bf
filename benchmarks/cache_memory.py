"""Reference-cache streaming: peak RSS of reading a 10k- vs a 100k-sample cache, and samples/s.

Writes two synthetic caches with the real shard writer (random token ids and log-probs, n = 8
samples per prompt, completion lengths uniform in [16, 2·mean]), then, each in a fresh process
so peak RSS is clean, opens the cache (sha256 verification), streams every sample once
(``iter_samples``) and then reads anchor batches of 16 random samples (``anchor_batch``).
Reports peak RSS, its growth over the process's RSS before opening, and samples/s.

    python benchmarks/cache_memory.py            # mean completion 256 tokens
    python benchmarks/cache_memory.py --quick    # mean 64 tokens, < 1 minute

The last line is the headline: ``cache_rss_growth_10x_mb=<peak RSS(100k) - peak RSS(10k)>``
(target: under 50 MB).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

N = 8
PROMPTS_PER_SHARD = 256


def write_cache(out: Path, num_samples: int, mean_tokens: int, seed: int = 0) -> int:
    """A synthetic but format-exact cache of ``num_samples`` samples; returns its size in bytes."""
    from lit_rlvr.cache.builder import write_shard
    from lit_rlvr.cache.format import FORMAT_VERSION, MANIFEST, shard_name, write_json_atomic

    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    num_prompts = num_samples // N
    shards = []
    for s, lo in enumerate(range(0, num_prompts, PROMPTS_PER_SHARD)):
        hi = min(lo + PROMPTS_PER_SHARD, num_prompts)
        P = hi - lo
        lengths = rng.integers(16, 2 * mean_tokens - 16, size=P * N)
        completions = [rng.integers(4, 32000, size=t) for t in lengths]
        logprobs = [-rng.random(t, dtype=np.float32) * 5 for t in lengths]
        rewards = (rng.random(P * N) < 0.6).astype(np.float32)
        shards.append(
            write_shard(
                out / shard_name(s),
                [f"synthetic/{i}" for i in range(lo, hi)],
                [rng.integers(4, 32000, size=64) for _ in range(P)],
                completions,
                logprobs,
                rewards,
                [True] * (P * N),
                N,
                1.0,
            )
        )
    manifest = {
        "format_version": FORMAT_VERSION,
        "model": {"name_or_path": "synthetic", "weights_sha256": "0"},
        "tokenizer_sha256": "0",
        "sampling": {},
        "rewards": ["math"],
        "dataset_fingerprint": "0",
        "num_prompts": num_prompts,
        "n": N,
        "seed": seed,
        "prompts_per_shard": PROMPTS_PER_SHARD,
        "prompts_per_call": 1,
        "correct_threshold": 1.0,
        "logprob_temperature": 1.0,
        "complete": True,
        "shards": shards,
    }
    write_json_atomic(out / MANIFEST, manifest)
    return sum(e["bytes"] for e in shards)


def measure(path: str, anchor_batches: int) -> dict:
    """Run in a child process: stream the cache at ``path`` and report RSS and throughput."""
    from lit_rlvr.cache import ReferenceCache, split_by_pass_count

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    cache = ReferenceCache(path)
    t_open = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokens = 0
    for s in cache.iter_samples():
        tokens += len(s.completion_ids) + int(s.ref_logprobs.shape[0] > 0)
    t_stream = time.perf_counter() - t0
    split = split_by_pass_count(cache.ids, cache.pass_counts, cache.n, perfect_threshold=4)
    anchors = cache.sample_indices(split.pef, "correct")
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(anchor_batches):
        cache.anchor_batch(rng.choice(anchors, size=16), pad_id=0)
    t_anchor = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "samples": cache.num_samples,
        "tokens": tokens,
        "open_s": t_open,
        "stream_samples_per_s": cache.num_samples / t_stream,
        "anchor_samples_per_s": anchor_batches * 16 / t_anchor,
        "rss_before_mb": rss0,
        "peak_rss_mb": peak,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="mean completion 64 tokens (< 1 minute)")
    ap.add_argument("--mean-tokens", type=int, default=None)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--anchor-batches", type=int, default=500)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.anchor_batches)))
        return
    mean_tokens = args.mean_tokens or (64 if args.quick else 256)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for num in (10_000, 100_000):
            path = Path(tmp) / f"cache{num}"
            t0 = time.perf_counter()
            size = write_cache(path, num, mean_tokens)
            write_s = time.perf_counter() - t0
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(path), "--anchor-batches", str(args.anchor_batches)],
                check=True,
                capture_output=True,
                text=True,
            )
            results[num] = {
                **json.loads(out.stdout.strip().splitlines()[-1]),
                "size_mb": size / 2**20,
                "write_s": write_s,
            }
    print(
        "| samples | cache MB | peak RSS MB | RSS growth while reading MB | stream samples/s | anchor samples/s | open+sha256 s |"
    )
    print("|---|---|---|---|---|---|---|")
    for num, r in results.items():
        print(
            f"| {num:,} | {r['size_mb']:.0f} | {r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] - r['rss_before_mb']:.1f} | "
            f"{r['stream_samples_per_s']:,.0f} | {r['anchor_samples_per_s']:,.0f} | {r['open_s']:.2f} |"
        )
    growth = results[100_000]["peak_rss_mb"] - results[10_000]["peak_rss_mb"]
    print(f"cache_rss_growth_10x_mb={growth:.1f}")


if __name__ == "__main__":
    main()
