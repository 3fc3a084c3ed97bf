"""What a run prints: the demo's fit and a plain ``lit-rlvr fit`` carry no deprecation, tip or misleading warning.

Each run is a fresh ``python -W default`` process, so the warnings Python hides by default (a
DeprecationWarning outside ``__main__``) are printed too, as a user's ``-W`` flag or
``PYTHONWARNINGS`` would print them, and lit_rlvr's own code must raise none.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

ROOT = REPO_ROOT
NOISE = {
    "torch's LeafSpec deprecation (Lightning's code)": r"LeafSpec",
    "Lightning's cloud-logger tip": r"Tip: For seamless cloud logging",
    "the policy left in eval mode": r"module\(s\) in eval mode",
    "a validation loop over no dataloaders": r"across ranks is zero",
    "an epoch bound of -1": r"Epoch \d+/-\d",
    "Lightning's default of limit_val_batches spelled out": r"100% of the batches will be used",
    "a warning raised by lit_rlvr's own code": r"lit_rlvr/\S+\.py:\d+: \w*Warning",
}


def run(tmp_path: Path, *args: str) -> str:
    """``python -W default -m lit_rlvr.cli *args`` in ``tmp_path``: its stdout and stderr."""
    env = dict(
        os.environ, OMP_NUM_THREADS="1", JSONARGPARSE_DEPRECATION_WARNINGS="off"
    )  # jsonargparse's: Lightning's calls
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-m", "lit_rlvr.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "countdown.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt": f"C{d}={t}:", "answer": t, "reward": "countdown", "digits": d}) + "\n"
            for d, t in [("375", "26"), ("124", "9"), ("563", "33"), ("218", "10")]
        )
    )
    return path


def assert_quiet(printed: str) -> None:
    found = {what: m.group(0) for what, pattern in NOISE.items() if (m := re.search(pattern, printed))}
    assert not found, f"{found}\n{printed[-4000:]}"


@pytest.mark.timeout(300)
def test_the_demos_fit_prints_no_noise(tiny_model_dir, tmp_path):
    """The demo's `fit` command (configs/demo/base.yaml + grpo.yaml, as the Makefile runs it) on the tiny model, 2 steps."""
    data = prompts(tmp_path)
    val = f"[{{files: {data}, adapter: jsonl, name: countdown_val, n_samples: 2, options: {{extra_fields: [digits]}}}}]"
    printed = run(
        tmp_path,
        "fit",
        "--config",
        str(ROOT / "configs/demo/base.yaml"),
        "--config",
        str(ROOT / "configs/demo/grpo.yaml"),
        f"--model.policy.path={tiny_model_dir}",
        f"--data.train.files={data}",
        f"--data.val={val}",
        "--data.batch_size=2",
        "--model.sampling.n=2",
        "--model.sampling.max_new_tokens=4",
        "--trainer.max_steps=2",
        "--trainer.val_check_interval=2",
        "--trainer.log_every_n_steps=1",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        f"--trainer.default_root_dir={tmp_path / 'runs'}",
        f"--export.dirpath={tmp_path / 'hf'}",
    )
    assert_quiet(printed)
    assert (
        re.search(r"Epoch \d ", printed)
        and "val/countdown_val/pass@2" in (tmp_path / "runs/logs/grpo/metrics.csv").read_text()
    )


@pytest.mark.timeout(300)
def test_a_plain_fit_without_validation_sets_prints_no_noise(tiny_model_dir, tmp_path):
    """Flags only, Lightning's defaults elsewhere (its default logger, its rich progress bar), no ``data.val``."""
    data = prompts(tmp_path)
    printed = run(
        tmp_path,
        "fit",
        "--imports=[lit_rlvr.demo]",
        f"--model.policy.path={tiny_model_dir}",
        f"--data.train.files={data}",
        "--data.train.options={extra_fields: [digits]}",
        "--data.batch_size=2",
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=2",
        "--rollout.init_args.engine=hf",
        "--model.sampling.n=2",
        "--model.sampling.max_new_tokens=4",
        "--model.scoring.workers=0",
    )
    assert_quiet(printed)
    assert re.search(r"Epoch \d ", printed) and "`Trainer.fit` stopped: `max_steps=2` reached" in printed
