"""Multi-turn training end to end: a few-step fit per engine (hf, colocated vLLM, a vLLM server with
asynchronous rollouts), with each row's environment, scored by the environment or by the rewards.

Half the prompts run the demo's countdown checker (its reward scores the trajectory); the other half
run an environment that echoes its row's id and gives no reward (the ``contains_seven`` reward scores
the trajectory's final turn). So the rows must travel with the prompts to every engine, also to the
producer that generates ahead, and each trajectory is scored by the judge the docs name.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from lightning import Callback, Trainer
from lightning.pytorch.loggers import Logger

import lit_rlvr.demo  # noqa: F401  (the countdown environment)
from lit_rlvr.callbacks import RolloutCallback
from lit_rlvr.data import PromptDataModule
from lit_rlvr.data.datamodule import DatasetSpec, ValSet
from lit_rlvr.demo.data import countdown_rows
from lit_rlvr.envs import ENVIRONMENTS, EnvironmentBase, Step, register_environment
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import EnvironmentOptions, LossOptions, PolicyOptions, SamplingParams, ScoringOptions, TurnOptions
from lit_rlvr.rewards import REWARDS

ECHO = "_test_row_echo"
VLLM = {"dtype": "float32", "max_model_len": 128, "kv_cache_memory_bytes": 32 * 2**20, "enforce_eager": True}
needs_vllm = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


class RowEcho(EnvironmentBase):
    """Answers every turn with its row's id in brackets; never scores (the rewards score the final turn)."""

    def reset(self, row, max_turns):
        self.id = row["id"]

    def step(self, action):
        return Step(f"[{self.id}]\n", tool_call=self.id)


if ECHO not in ENVIRONMENTS:
    register_environment(ECHO)(RowEcho)


class Names(Logger):
    name, version = "names", 0

    def __init__(self):
        super().__init__()
        self.metrics: dict[str, float] = {}

    def log_metrics(self, metrics, step=None):
        self.metrics.update(metrics)

    def log_hyperparams(self, *args, **kwargs):
        pass


class Batches(Callback):
    """Records each training and validation batch's rows and rollouts (after the rollout callback)."""

    def __init__(self):
        self.train, self.val = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.train.append((batch.rows, batch.rollouts))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.val.append((batch.rows, batch.rollouts))


def data_file(tmp: Path, seven_reward: str) -> Path:
    rows = [{**r, "environment": "countdown"} for r in countdown_rows([("357", 26), ("129", 11), ("248", 16)])]
    rows += [
        {
            "id": f"echo{i}",
            "prompt": f"C{i}{i + 4}=0{i}:",
            "answer": "x",
            "reward": seven_reward,
            "digits": "123",
            "environment": ECHO,
        }
        for i in range(3)
    ]
    rows = [rows[i] for i in (0, 3, 1, 4, 2, 5)]  # every batch of 2 has one of each
    path = tmp / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fit(model_dir: Path, tmp: Path, seven_reward: str, rollout: dict, steps: int = 3, **module):
    spec = {"files": str(data_file(tmp, seven_reward)), "options": {"extra_fields": ["digits", "environment"]}}
    dm = PromptDataModule(
        tokenizer=str(model_dir),
        train=DatasetSpec(**spec, name="mixed"),
        val=[ValSet(**spec, name="mixed_val", n_samples=2)],
        batch_size=2,
        val_batch_size=2,
        seed=0,
    )
    environment = EnvironmentOptions(None, max_turns=3, max_turn_tokens=4, max_total_tokens=40)
    model = RLVRModule(
        PolicyOptions(str(model_dir), dtype="float32"),
        sampling=SamplingParams(n=3, max_new_tokens=4, seed=0),
        scoring=ScoringOptions(workers=0),
        environment=environment,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3),
        **module,
    )
    scored = []
    score_rollouts = model.score_rollouts

    def spy(rollouts, prompts, prefix, **kwargs):
        out = score_rollouts(rollouts, prompts, prefix, **kwargs)
        rows = [row for row in prompts for _ in range(rollouts.n)]
        scored.append(
            (prefix, rollouts.final_turns()[0], rows, rollouts.environment_rewards(), [s.reward for s in out])
        )
        return out

    model.score_rollouts = spy
    batches, logger = Batches(), Names()
    trainer = Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=steps,
        log_every_n_steps=1,
        callbacks=[RolloutCallback(**rollout), batches],
        default_root_dir=str(tmp),
    )
    trainer.fit(model, datamodule=dm)
    return model, batches, scored, logger.metrics


def check_trajectories(tok, rows: list[dict], rollouts, n: int) -> None:
    """Each trajectory ran its row's environment: its environment tokens are that environment's answers, tokenized once."""
    assert rollouts.episodes is not None and rollouts.loss_mask is not None and len(rows) * n == len(rollouts.episodes)
    for b, (ids, mask, episode) in enumerate(zip(rollouts.completion_ids, rollouts.loss_mask, rollouts.episodes)):
        row = rows[b // n]
        runs, start = [], 0
        for i in range(1, len(ids) + 1):  # maximal runs of model (1) / environment (0) tokens
            if i == len(ids) or mask[i] != mask[start]:
                runs.append((mask[start], ids[start:i]))
                start = i
        observations = [tok.decode(run) for m, run in runs if not m]
        if row["environment"] == ECHO:
            assert observations == [f"[{row['id']}]\n"] * 2 and episode.turns == 3 and episode.status == "max_turns", (
                row["id"],
                observations,
            )
            assert episode.reward is None and episode.tool_calls == (row["id"],) * 3
        else:
            assert all(o.startswith("=") and o.endswith("\n") for o in observations), observations
            assert episode.reward in (0.0, 1.0)
        assert [tok(o, add_special_tokens=False).input_ids for o in observations] == [run for m, run in runs if not m]
        assert episode.turns == sum(m for m, _ in runs) and episode.status in ("done", "max_turns", "length")


def check_scores(scored, seven) -> None:
    """The environment's reward where it gave one, else the reward on the trajectory's last turn."""
    for prefix, texts, rows, given, rewards in scored:
        assert given is not None and len(given) == len(texts) == len(rewards)
        for text, row, g, r in zip(texts, rows, given, rewards):
            assert r == (g if row["environment"] == "countdown" else seven(text, row["answer"])), (
                prefix,
                row["id"],
                text,
            )
            assert (g is None) == (row["environment"] == ECHO)


ENGINES = {
    "hf": {"engine": "hf", "drift_every_n_steps": 1},
    "vllm": pytest.param({"engine": "vllm", "engine_options": VLLM, "drift_every_n_steps": 1}, marks=needs_vllm),
    "vllm_server_async": pytest.param(
        {
            "engine": "vllm_server",
            "engine_options": VLLM,
            "max_staleness": 1,
            "generate_timeout_s": 120,
            "sync_timeout_s": 180,
        },
        marks=needs_vllm,
    ),
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("rollout", list(ENGINES.values()), ids=list(ENGINES))
def test_a_few_steps_in_each_rows_environment_on_every_engine(rollout, tiny_model_dir, tmp_path, seven_reward):
    from lit_rlvr.rollout import vllm_available

    if rollout["engine"] != "hf" and not vllm_available():
        pytest.skip("`import vllm` fails")
    model, batches, scored, metrics = fit(tiny_model_dir, tmp_path, seven_reward, rollout)
    seven = REWARDS[seven_reward]
    assert len(batches.train) == 3 and len(batches.val) == 3
    for rows, rollouts in batches.train:
        check_trajectories(model.tokenizer, rows, rollouts, n=3)
    for rows, rollouts in batches.val:
        check_trajectories(model.tokenizer, rows, rollouts, n=2)
    check_scores(scored, seven)
    assert [p for p, *_ in scored] == ["train"] * 3 + ["val/mixed_val"] * 3
    assert {
        "train/turns",
        "train/turns_3",
        "train/tool_calls",
        "train/distinct_tool_sequences",
        "val/mixed_val/turns",
        "val/mixed_val/single_turn",
        "val/mixed_val/pass@2",
    } <= set(metrics)
    if rollout.get("max_staleness"):  # generated ahead by the producer, the rows fetched with the prompts
        assert metrics["rollout/trained"] == 3 and metrics["rollout/dropped"] == 0
    else:  # the drift over the model's tokens: sampled from the policy being trained
        assert metrics["rollout/drift"] < 1e-3


def test_dr_grpos_normaliser_is_the_whole_trajectorys_budget(tiny_model_dir):
    sampling = SamplingParams(n=2, max_new_tokens=8)
    loss = LossOptions(aggregation="seq_mean_token_sum_norm")
    single = RLVRModule(
        PolicyOptions(str(tiny_model_dir)), sampling=sampling, loss=loss, scoring=ScoringOptions(workers=0)
    )
    multi = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=sampling,
        loss=loss,
        scoring=ScoringOptions(workers=0),
        environment=EnvironmentOptions("countdown", max_turns=3, max_turn_tokens=5),
    )
    budget = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=sampling,
        loss=loss,
        scoring=ScoringOptions(workers=0),
        environment={"name": "countdown", "max_turns": 3, "max_total_tokens": 20},
    )
    assert (single.completion_tokens, multi.completion_tokens, budget.completion_tokens) == (8, 15, 20)
    assert budget.hparams.environment == {
        "name": "countdown",
        "options": {},
        **vars(TurnOptions(max_turns=3, max_total_tokens=20)),
    }


def test_a_row_without_an_environment_is_refused_at_set_up(tiny_model_dir, tmp_path, seven_reward):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "q0", "prompt": "C1=2:", "answer": "x", "reward": seven_reward}) + "\n")
    dm = PromptDataModule(tokenizer=str(tiny_model_dir), train=DatasetSpec(files=str(path), name="toy"), batch_size=1)
    model = RLVRModule(
        PolicyOptions(str(tiny_model_dir)),
        sampling=SamplingParams(n=2, max_new_tokens=4),
        scoring=ScoringOptions(workers=0),
        environment=EnvironmentOptions(None),
    )
    trainer = Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RolloutCallback(engine="hf")],
        default_root_dir=str(tmp_path),
    )
    with pytest.raises(ValueError, match="row 'toy/0' has no 'environment' field and model.environment.name is null"):
        trainer.fit(model, datamodule=dm)


@pytest.mark.timeout(300)
def test_dph_f_on_a_multi_turn_cache_anchors_on_the_models_tokens(tiny_model_dir, tmp_path, seven_reward):
    """`lit-rlvr cache` with the run's environment, then DPH-F (forward KL on the cached trajectories'
    model tokens); a run in another environment refuses the cache at set-up."""
    from lit_rlvr.cache.format import CacheMismatchError
    from lit_rlvr.data.datamodule import CacheOptions
    from lit_rlvr.options import AnchorOptions
    from lit_rlvr.tools.cache import build_cache

    rows = [{"id": f"q{i}", "prompt": f"C{i}{i + 4}=0{i}:", "answer": "x", "reward": seven_reward} for i in range(6)]
    path = tmp_path / "echo.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    environment = EnvironmentOptions(ECHO, max_turns=2, max_turn_tokens=6, max_total_tokens=30)
    sampling = SamplingParams(n=4, max_new_tokens=6, seed=0)

    def data(cache: str) -> PromptDataModule:
        return PromptDataModule(
            tokenizer=str(tiny_model_dir),
            train=DatasetSpec(files=str(path), name="echo"),
            batch_size=2,
            seed=0,
            cache=CacheOptions(
                cache, perfect_threshold=1, anchor_samples="all", train_split="all", anchor_batch_size=4
            ),
        )

    cache = str(tmp_path / "cache")
    build_cache(
        data(cache),
        PolicyOptions(str(tiny_model_dir), dtype="float32"),
        sampling=sampling,
        engine="hf",
        scoring=ScoringOptions(workers=0),
        environment=environment,
        progress=False,
    )

    def run(env: EnvironmentOptions):
        model = RLVRModule(
            PolicyOptions(str(tiny_model_dir), dtype="float32"),
            sampling=sampling,
            scoring=ScoringOptions(workers=0),
            anchor=AnchorOptions(divergence="forward_kl", coef=1.0),
            environment=env,
        )
        anchors, logger = [], Names()

        class Anchors(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                anchors.append(batch.anchor)

        trainer = Trainer(
            max_steps=2,
            accelerator="cpu",
            logger=logger,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            log_every_n_steps=1,
            default_root_dir=str(tmp_path),
            callbacks=[RolloutCallback(engine="hf"), Anchors()],
        )
        trainer.fit(model, datamodule=data(cache))
        return model, anchors, logger.metrics

    model, anchors, metrics = run(environment)
    assert len(anchors) == 2 and all(a is not None and a.loss_mask is not None for a in anchors)
    tok = model.tokenizer
    for a in anchors:
        environment_tokens = a.input_ids[:, -a.response_mask.shape[1] :][(a.response_mask * (1 - a.loss_mask)).bool()]
        assert environment_tokens.numel() and set(tok.decode(environment_tokens.tolist())) <= set("[]echo/0123456789\n")
        assert torch.equal(a.loss_tokens, a.response_mask * a.loss_mask)
    assert "train/pef" in metrics and torch.isfinite(torch.tensor(metrics["train/pef"]))
    with pytest.raises(
        CacheMismatchError,
        match=r"environment: cache sampled trajectories in _test_row_echo@1 .* this run samples "
        r"trajectories in countdown@1",
    ):
        run(replace(environment, name="countdown"))


def test_lit_rlvr_validate_runs_the_configured_environment(tiny_model_dir, tmp_path, seven_reward, capsys):
    """`lit-rlvr validate` with model.environment evaluates trajectories in it: pass@k on their final
    answers and their behaviour, in the printed table."""
    import yaml

    from lit_rlvr.cli import main

    path = tmp_path / "countdown.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in countdown_rows([("357", 26), ("129", 11)])))
    val = {"files": str(path), "name": "cd_val", "n_samples": 2, "options": {"extra_fields": ["digits"]}}
    config = {
        "imports": ["lit_rlvr.demo"],
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
            "environment": {"name": "countdown", "max_turns": 3},
        },
        "rollout": {"init_args": {"engine": "hf"}},
        "data": {"val": [val]},
    }
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(config))
    main(["validate", "--config", str(tmp_path / "v.yaml")])
    lines = capsys.readouterr().out.splitlines()
    table = {line.split()[0]: line.split()[1:] for line in lines if len(line.split()) == 2}
    assert {"pass@1", "pass@2", "turns", "turns_3", "single_turn", "tool_calls", "distinct_tool_sequences"} <= set(
        table
    )
    assert 1.0 <= float(table["turns"][0]) <= 3.0
