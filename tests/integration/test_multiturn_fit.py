"""Multi-turn training end to end: a few-step fit per engine (hf, colocated vLLM, a vLLM server with
synchronous and with asynchronous rollouts), with each row's environment, scored by the environment
or by the rewards.

Every batch holds one row of each: the demo's countdown checker (its reward scores the trajectory),
an environment that echoes its row's id and gives no reward (the ``contains_seven`` reward scores
the trajectory's final turn), and the ``sql`` environment on generated SQLite files (its Spider
execution reward scores the solution). The policy is taught to query on ``sql`` rows
(``sql_model_dir``, tests/integration/conftest.py), so real queries run on every engine. So the rows
must travel with the prompts to every engine, also to the producer that generates ahead, and each
trajectory is scored by the judge the docs name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sqlite3
from collections import Counter
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
from lit_rlvr.envs.sql import format_rows
from lit_rlvr.module import RLVRModule
from lit_rlvr.options import EnvironmentOptions, LossOptions, PolicyOptions, SamplingParams, ScoringOptions, TurnOptions
from lit_rlvr.rewards import REWARDS
from tests.integration.conftest import MIXED_COUNTDOWN, SQL_QUERY

ECHO = "_test_row_echo"
VLLM = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory_bytes": 32 * 2**20, "enforce_eager": True}
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


def data_file(tmp: Path, seven_reward: str, sql_rows: list[dict]) -> Path:
    countdown = [{**r, "environment": "countdown"} for r in countdown_rows(MIXED_COUNTDOWN)]
    echo = [
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
    rows = [row for batch in zip(countdown, echo, sql_rows) for row in batch]  # every batch of 3 has one of each
    path = tmp / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fit(model_dir: Path, tmp: Path, seven_reward: str, sql_rows: list[dict], rollout: dict, steps: int = 3, **module):
    spec = {
        "files": str(data_file(tmp, seven_reward, sql_rows)),
        "options": {"extra_fields": ["digits", "environment"]},
    }
    dm = PromptDataModule(
        tokenizer=str(model_dir),
        train=DatasetSpec(**spec, name="mixed"),
        val=[ValSet(**spec, name="mixed_val", n_samples=2)],
        batch_size=3,
        val_batch_size=3,
        seed=0,
    )
    # an sql trajectory: a query turn of 33 tokens, its observation (~97), a solution turn of 53
    environment = EnvironmentOptions(None, max_turns=3, max_turn_tokens=56, max_total_tokens=192)
    model = RLVRModule(
        PolicyOptions(str(model_dir), dtype="float32"),
        sampling=SamplingParams(n=3, max_new_tokens=4, seed=0),
        scoring=ScoringOptions(workers=0),
        environment=environment,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4),
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


SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.DOTALL)


def query_rows(sql: str, db_path: str) -> list[tuple] | None:
    """What SQLite itself returns for ``sql`` on the file (opened read-only); None where it refuses it."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    except sqlite3.Error:
        return None
    finally:
        con.close()


def execution_reward(final_turn: str, row: dict) -> float:
    """Spider's execution match by brute force: 1 when the turn's solution returns the gold's rows (a
    multiset: the golds have no ORDER BY), else 0 (no solution, or one SQLite refuses)."""
    solutions = SOLUTION.findall(final_turn)
    if not solutions:
        return 0.0
    predicted = query_rows(solutions[-1], row["db_path"])
    return float(predicted is not None and Counter(predicted) == Counter(query_rows(row["answer"], row["db_path"])))


def sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_trajectories(tok, rows: list[dict], rollouts, n: int) -> int:
    """Each trajectory ran its row's environment: its environment tokens are that environment's answers,
    tokenized once. Returns how many ``sql`` trajectories queried and answered as the policy was taught."""
    assert rollouts.episodes is not None and rollouts.loss_mask is not None and len(rows) * n == len(rollouts.episodes)
    scripted = 0
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
        elif row["environment"] == "sql":
            if episode.status == "done":  # scored by execution on the row's database
                assert episode.reward == execution_reward(episode.final_text, row), (row["id"], episode)
            if episode.tool_calls == (SQL_QUERY,) and episode.turns == 2 and SOLUTION.search(episode.final_text):
                result = query_rows(SQL_QUERY, row["db_path"])  # the table's size: 30 or 20 rows
                assert result in ([(30,)], [(20,)]) and observations == [
                    f"\n\n<observation>{format_rows(result, 50, 9000)}\n"
                    "<reminder>You have 2 turns left to complete the task.</reminder></observation>\n\n"
                ], (row["id"], observations)
                assert episode.status == "done" and episode.tool_errors == 0
                scripted += 1
        else:
            assert all(o.startswith("=") and o.endswith("\n") for o in observations), observations
            assert episode.reward in (0.0, 1.0)
        assert [tok(o, add_special_tokens=False).input_ids for o in observations] == [run for m, run in runs if not m]
        assert episode.turns == sum(m for m, _ in runs) and episode.status in ("done", "max_turns", "length")
    return scripted


def check_scores(scored, seven) -> None:
    """The environment's reward where it gave one (the countdown and sql rows), else the reward on the
    trajectory's last turn."""
    for prefix, texts, rows, given, rewards in scored:
        assert given is not None and len(given) == len(texts) == len(rewards)
        for text, row, g, r in zip(texts, rows, given, rewards):
            assert r == (seven(text, row["answer"]) if row["environment"] == ECHO else g), (prefix, row["id"], text)
            assert (g is None) == (row["environment"] == ECHO)
            if row["environment"] == "sql" and SOLUTION.search(text):
                assert r == execution_reward(text, row), (prefix, row["id"], text)


ENGINES = {
    "hf": {"engine": "hf", "drift_every_n_steps": 1},
    "vllm": pytest.param({"engine": "vllm", "engine_options": VLLM, "drift_every_n_steps": 1}, marks=needs_vllm),
    "vllm_server": pytest.param(  # the synchronous loop (max_staleness None)
        {
            "engine": "vllm_server",
            "engine_options": VLLM,
            "drift_every_n_steps": 1,
            "generate_timeout_s": 120,
            "sync_timeout_s": 180,
        },
        marks=needs_vllm,
    ),
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
def test_a_few_steps_with_countdown_echo_and_sql_rows_on_every_engine(
    rollout, sql_model_dir, sql_rows, tmp_path, seven_reward
):
    """Real queries on generated SQLite files (left as they were), each trajectory scored by its judge,
    the behaviour metrics logged."""
    from lit_rlvr.rollout import vllm_available

    if rollout["engine"] != "hf" and not vllm_available():
        pytest.skip("`import vllm` fails")
    databases = {row["db_path"]: sha256(row["db_path"]) for row in sql_rows}
    model, batches, scored, metrics = fit(sql_model_dir, tmp_path, seven_reward, sql_rows, rollout)
    assert {path: sha256(path) for path in databases} == databases
    seven = REWARDS[seven_reward]
    assert len(batches.train) == 3 and len(batches.val) == 3
    assert Counter(r["environment"] for rows, _ in batches.train for r in rows) == {ECHO: 3, "countdown": 3, "sql": 3}
    train = [check_trajectories(model.tokenizer, rows, rollouts, n=3) for rows, rollouts in batches.train]
    val = [check_trajectories(model.tokenizer, rows, rollouts, n=2) for rows, rollouts in batches.val]
    assert sum(train) >= 6 and sum(val) >= 4, (train, val)  # of 9 and 6 sql trajectories: queries ran on each engine
    check_scores(scored, seven)
    sql_rewards = {g for _, _, rows, given, _ in scored for row, g in zip(rows, given) if row["environment"] == "sql"}
    assert {0.0, 1.0} <= sql_rewards  # right (a>3, 3<a) and wrong (a>5) solutions, told apart by execution
    assert [p for p, *_ in scored] == ["train"] * 3 + ["val/mixed_val"] * 3
    behaviour = ("turns", "single_turn", "tool_calls", "distinct_tool_sequences")
    assert {"train/turns_3", "val/mixed_val/pass@2"} | {
        f"{p}/{k}" for p in ("train", "val/mixed_val") for k in behaviour
    } <= set(metrics)
    assert metrics["train/tool_calls"] > 0 and metrics["val/mixed_val/tool_calls"] > 0
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


class SpinsForever(EnvironmentBase):
    """A step that never returns, spinning in Python (a core busy for as long as its thread runs)."""

    def step(self, action):
        while True:
            pass


@pytest.mark.timeout(120)
def test_a_fit_whose_environment_spins_ends_its_steps_and_leaves_nothing_spinning(tiny_model_dir, toy_prompts, caplog):
    """Issue 42's done-when: every step's environment spins forever (step_timeout_s 2); the fit ends its
    3 steps with train/env_failed 1, the reason warned about, and no environment thread left running
    (the process idle after it). The spinning threads used to be abandoned, burning the cores."""
    import logging
    import threading
    import time

    register_environment("_test_spins")(SpinsForever)
    try:
        dm = PromptDataModule(
            tokenizer=str(tiny_model_dir), train=DatasetSpec(files=toy_prompts(6), name="toy"), batch_size=2
        )
        model = RLVRModule(
            PolicyOptions(str(tiny_model_dir), dtype="float32"),
            sampling=SamplingParams(n=2, max_new_tokens=4, seed=0),
            scoring=ScoringOptions(workers=0, max_failed_steps=None),
            environment=EnvironmentOptions("_test_spins", max_turns=2, step_timeout_s=2.0),
            optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4),
        )
        logger = Names()
        trainer = Trainer(
            max_steps=3,
            accelerator="cpu",
            logger=logger,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            log_every_n_steps=1,
            callbacks=[RolloutCallback(engine="hf")],
        )
        with caplog.at_level(logging.WARNING, logger="lit_rlvr.rewards.report"):
            trainer.fit(model, datamodule=dm)
    finally:
        ENVIRONMENTS.pop("_test_spins")
    assert trainer.global_step == 3 and logger.metrics["train/env_failed"] == 1.0
    end = time.monotonic() + 2
    while any(t.name.startswith("lit-rlvr-env-") for t in threading.enumerate()) and time.monotonic() < end:
        time.sleep(0.05)
    assert [t.name for t in threading.enumerate() if t.name.startswith("lit-rlvr-env-")] == []
    cpu = time.process_time()
    time.sleep(1.0)
    assert time.process_time() - cpu < 0.3  # nothing left spinning
    warned = [r.getMessage() for r in caplog.records if r.name == "lit_rlvr.rewards.report"]
    assert len(warned) == 1 and warned[0].startswith(
        "train environments (step 0, rank 0): the environment failed on 4 of 4 trajectories"
    )
    assert warned[0].endswith("did not return within 2 s (model.environment.step_timeout_s); it was stopped")


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
