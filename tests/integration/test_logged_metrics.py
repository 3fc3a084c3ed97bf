"""What lit_rlvr logs: each validation set under its own dataloader, the progress bar, and the documented table.

One tiny fit (two validation sets, KL, recomputed log-probs, drift every step) and one
``trainer.validate``, recorded by a logger that keeps every name; plus one DPH-RL step on a batch
with anchors (``train/pef``), one step with the entropy and diversity methods that log their own
values (Clip-Cov, a forking-token mask, an adaptive entropy bonus), and a multi-turn fit in the
countdown environment with a validation (the behaviour metrics). The metric table of
docs/operations.md must match those names both ways.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from lightning import Trainer
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader

from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.contracts import AnchorBatch, TrainBatch
from lit_rlvr.data import PromptDataModule
from lit_rlvr.data.datamodule import DatasetSpec, ValSet
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import (
    AnchorOptions,
    EntropyOptions,
    EvalOptions,
    KLOptions,
    LossOptions,
    PolicyOptions,
    RolloutCorrection,
    SamplingParams,
    ScoringOptions,
)
from lit_rlvr.rewards.base import STATUSES
from lit_rlvr.rollout.types import Rollouts
from tests.conftest import REPO_ROOT

METRICS_DOC = REPO_ROOT / "docs" / "operations.md"
PLACEHOLDERS = {
    "<set>": r"[^/]+",
    "<k>": r"\d+",
    "<t>": r"\d+",
    "<status>": f"({'|'.join(STATUSES)})",
    "<name>": r"[^/]+",
}
LIGHTNING_KEYS = {"epoch"}


class Names(Logger):
    """A logger that keeps every metric name it is given."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    name, version = "names", 0

    def log_metrics(self, metrics, step=None):
        self.names |= set(metrics)

    def log_hyperparams(self, *args, **kwargs):
        pass


def prompts_file(path: Path, reward: str, n: int = 6) -> str:
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "prompt": f"C{i}{i + 1}=0{i}:", "answer": "x", "reward": reward}) + "\n"
            for i in range(n)
        )
    )
    return str(path)


@pytest.fixture(scope="module")
def fit_then_validate(tiny_model_dir, seven_reward, tmp_path_factory):
    """A 2-step fit validating two sets at its end, then ``trainer.validate``: (logger names, trainer, outputs)."""
    tmp = tmp_path_factory.mktemp("logged")
    files = prompts_file(tmp / "p.jsonl", seven_reward)
    reference = tmp / "base_counts.json"  # every prompt "solved by the base": retention is logged
    reference.write_text(json.dumps({"a_val": {f"a_val/{i}": 1 for i in range(6)}}))
    dm = PromptDataModule(
        tokenizer=str(tiny_model_dir),
        train=DatasetSpec(files=files, name="toy"),
        val=[ValSet(files=files, name="a_val", n_samples=4), ValSet(files=files, name="b_val", n_samples=2)],
        batch_size=2,
        val_batch_size=4,
        seed=0,
    )
    module = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=4, max_new_tokens=6, seed=0),
        kl=KLOptions(coef=0.1),
        scoring=ScoringOptions(workers=0, reward_funcs=[seven_reward]),  # logs train/reward/<name> too
        evaluation=EvalOptions(retention_reference=str(reference)),
        rollout_correction=RolloutCorrection(),
        recompute_old_logprobs=True,
    )
    logger = Names()
    trainer = Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=2,
        log_every_n_steps=1,
        callbacks=[RolloutCallback(engine="hf", drift_every_n_steps=1)],
    )
    trainer.fit(module, datamodule=dm)
    progress_bar = set(trainer.progress_bar_metrics)
    outputs = trainer.validate(module, datamodule=dm, verbose=False)
    return logger.names, progress_bar, outputs


def dph_step_names(model_dir: Path, reward: str, **methods) -> set[str]:
    """One DPH-RL step (with ``methods``: more option groups) on a fixed batch with cached-anchor samples: the names it logs."""
    module = RLVRModule(
        PolicyOptions(str(model_dir)),
        sampling=SamplingParams(n=2, max_new_tokens=4),
        anchor=AnchorOptions(divergence="forward_kl", coef=1.0),
        scoring=ScoringOptions(workers=0),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        **methods,
    )
    tok = module.tokenizer
    prompt, texts = tok("C12=3:").input_ids, ["7", "12"]
    completions = [tok(t).input_ids for t in texts]
    rollouts = Rollouts(
        [prompt], completions, [[-1.0] * len(c) for c in completions], ["stop", "stop"], n=2, texts=texts
    )
    anchor = Rollouts([prompt], completions, [[0.0] * len(c) for c in completions], ["stop", "stop"], n=2).to_padded(
        tok.pad_token_id
    )
    anchor = AnchorBatch(
        anchor["input_ids"],
        anchor["attention_mask"],
        anchor["response_mask"],
        -torch.ones(anchor["response_mask"].shape),
        torch.ones(2),
    )
    batch = TrainBatch([{"id": "p", "prompt": "C12=3:", "answer": "", "reward": reward}], [prompt], anchor, rollouts)
    logger = Names()
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=DataLoader([batch], batch_size=None, collate_fn=lambda b: b))
    return logger.names


def multiturn_fit_names(model_dir: Path, tmp: Path) -> set[str]:
    """One training step and one validation of multi-turn rollouts in the countdown environment: the names logged."""
    import lit_rlvr.demo  # noqa: F401  (the countdown environment)
    from lit_rlvr.demo.data import countdown_rows
    from lit_rlvr.options import EnvironmentOptions

    path = tmp / "countdown.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in countdown_rows([("357", 26), ("129", 11)])))
    spec = {"files": str(path), "options": {"extra_fields": ["digits"]}}
    dm = PromptDataModule(
        tokenizer=str(model_dir),
        train=DatasetSpec(**spec, name="cd"),
        val=[ValSet(**spec, name="cd_val", n_samples=2)],
        batch_size=2,
        val_batch_size=2,
        seed=0,
    )
    module = RLVRModule(
        PolicyOptions(str(model_dir)),
        sampling=SamplingParams(n=2, max_new_tokens=4, seed=0),
        scoring=ScoringOptions(workers=0),
        environment=EnvironmentOptions("countdown", max_turns=2),
    )
    logger = Names()
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=1,
        log_every_n_steps=1,
        callbacks=[RolloutCallback(engine="hf")],
        default_root_dir=str(tmp),
    )
    trainer.fit(module, datamodule=dm)
    return logger.names


def documented_metric_patterns() -> dict[str, re.Pattern]:
    """``{documented name: regex}`` from docs/operations.md's metric table (first column, back-quoted names)."""
    text = METRICS_DOC.read_text().split("<!-- metrics-table -->", 1)[1].strip()
    rows = [line for line in text.split("\n\n", 1)[0].splitlines() if line.startswith("| `")]
    names = [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]
    patterns = {}
    for name in names:
        regex = re.escape(name)
        for placeholder, part in PLACEHOLDERS.items():
            regex = regex.replace(re.escape(placeholder), part)
        patterns[name] = re.compile(regex + "$")
    return patterns


def test_each_validation_set_is_reported_once_under_its_own_dataloader(fit_then_validate):
    _, _, (a, b) = fit_then_validate
    assert {k.split("/")[1] for k in a if k.startswith("val/")} == {"a_val"}
    assert {k.split("/")[1] for k in b if k.startswith("val/")} == {"b_val"}
    assert {
        "val/a_val/pass@4",
        "val/a_val/reward_status/ok",
        "val/a_val/retention/pass@4",
        "val_rollout/seconds/dataloader_idx_0",
    } <= set(a)
    assert {"val/b_val/pass@2", "val/b_val/reward_status/ok", "val_rollout/seconds/dataloader_idx_1"} <= set(b)
    assert not {k for k in a if k.endswith("dataloader_idx_1")} and not {k for k in b if k.endswith("dataloader_idx_0")}


def test_progress_bar_shows_reward_response_length_and_rollout_speed(fit_then_validate):
    _, progress_bar, _ = fit_then_validate
    assert {"train/loss", "train/reward", "rollout/mean_len", "rollout/tokens_per_s", "rollout/seconds"} <= progress_bar


def test_the_documented_metric_table_lists_exactly_the_logged_names(
    fit_then_validate, tiny_model_dir, seven_reward, tmp_path
):
    names, _, _ = fit_then_validate
    methods = {
        "loss": LossOptions(policy_loss="clip_cov", token_mask="top_entropy"),
        "entropy": EntropyOptions("adaptive"),
    }
    multiturn = multiturn_fit_names(tiny_model_dir, tmp_path)
    assert {"train/turns", "train/turns_2", "val/cd_val/single_turn", "val/cd_val/distinct_tool_sequences"} <= multiturn
    names = (
        names
        | dph_step_names(tiny_model_dir, seven_reward)
        | dph_step_names(tiny_model_dir, seven_reward, **methods)
        | multiturn
    )
    logged = {re.sub(r"/dataloader_idx_\d+$", "", n) for n in names} - LIGHTNING_KEYS
    patterns = documented_metric_patterns()
    assert len(patterns) > 30
    undocumented = sorted(n for n in logged if not any(p.match(n) for p in patterns.values()))
    assert not undocumented, f"logged but not in docs/operations.md's metric table: {undocumented}"
    never_logged = sorted(doc for doc, p in patterns.items() if not any(p.match(n) for n in logged))
    assert not never_logged, f"in docs/operations.md's metric table but not logged by the runs: {never_logged}"


def test_lit_rlvr_validate_prints_each_sets_metrics_once(tiny_model_dir, seven_reward, tmp_path, capsys):
    """`lit-rlvr validate` with two sets: one table, a column per set (Lightning's lists every set's
    metrics under every dataloader); `--verbose=false` prints none."""
    import yaml

    from lit_rlvr.cli import main

    files = prompts_file(tmp_path / "p.jsonl", seven_reward, n=4)
    config = {
        "trainer": {
            "accelerator": "cpu",
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(tmp_path),
        },
        "model": {
            "policy": {"path": str(tiny_model_dir)},
            "sampling": {"n": 2, "max_new_tokens": 4, "seed": 0},
            "scoring": {"workers": 0},
        },
        "rollout": {"init_args": {"engine": "hf"}},
        "data": {
            "train": {"files": files, "name": "toy"},
            "val": [
                {"files": files, "name": "a_val", "n_samples": 2},
                {"files": files, "name": "b_val", "n_samples": 4},
            ],
        },
    }
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["validate", "--config", str(path)])
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["metric"])
    assert lines[head].split() == ["metric", "a_val", "b_val"]
    table = {line.split()[0]: line.split()[1:] for line in lines[head + 1 :] if len(line.split()) == 3}
    assert table["pass@1"][0] != "–" and table["pass@1"][1] != "–"
    assert table["pass@4"] == ["–", table["pass@4"][1]] and table["pass@4"][1] != "–"  # b_val only: 4 samples
    assert not any("val/" in line for line in lines[head:])
    main(["validate", "--config", str(path), "--verbose=false"])
    assert not any(line.startswith("metric") for line in capsys.readouterr().out.splitlines())
