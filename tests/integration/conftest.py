"""Fixtures of the end-to-end fits: SQLite files of the SQL toy, their ``sql`` rows, and a tiny policy
taught to query them, so that a few-step fit runs real queries on every engine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

SQL_QUERY = "SELECT count(*) FROM t"
"""The query turn the :func:`sql_model_dir` policy writes on an ``sql`` row (its result: the table's size)."""
SQL_SOLUTION = "SELECT count(*) FROM t where a>3"
"""Its final query: right for the golds ``a>3`` and ``3<a``, wrong for ``a>5`` (lowercase ``where``: no
``E `` before ``a`` that ``SELECT `` also has, which a 2-layer model tells apart slowly)."""
MIXED_COUNTDOWN = [("357", 26), ("129", 11), ("248", 16)]
"""The countdown rows of test_multiturn_fit's mixed data (the echo rows are ``C{i}{i+4}=0{i}:``)."""


@pytest.fixture(scope="session")
def sql_rows(tmp_path_factory) -> list[dict]:
    """Three ``sql`` rows on two generated SQL-toy databases (30 rows, seed 0; 20 rows, seed 1)."""
    from lit_rlvr.demo.sql_toy import build_database

    folder = tmp_path_factory.mktemp("sql_toy")
    big, small = build_database(folder / "big.sqlite", seed=0), build_database(folder / "small.sqlite", 1, 20)
    questions = [(big, "a>3"), (small, "3<a"), (big, "a>5")]
    return [
        {
            "id": f"sql{i}",
            "prompt": f"Q:count {where};",
            "answer": f"SELECT count(*) FROM t WHERE {where};",
            "db_path": str(db),
            "environment": "sql",
        }
        for i, (db, where) in enumerate(questions)
    ]


def _trajectory(tok, prompt: str, parts: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """``(ids, mask)``: the prompt as the DataModule encodes it, then each part (text, the model's?),
    mask 1 on the model's tokens; a model part ending in ``<eos>`` ends with the EOS token."""
    from lit_rlvr.data.prompts import encode_prompt

    ids = encode_prompt({"prompt": prompt}, tok)
    mask = [0] * len(ids)
    for text, model in parts:
        eos = model and text.endswith(tok.eos_token)
        part = tok(text.removesuffix(tok.eos_token) if eos else text, add_special_tokens=False).input_ids
        part += [tok.eos_token_id] if eos else []
        ids, mask = ids + part, mask + [int(model)] * len(part)
    return ids, mask


@pytest.fixture(scope="session")
def sql_model_dir(tiny_model_dir, sql_rows, tmp_path_factory) -> Path:
    """``tiny_model_dir``'s model (its tokenizer and config) taught by next-token loss, in ~15 s on one
    CPU thread, what test_multiturn_fit's mixed rows need: on an ``sql`` row ``<sql>SQL_QUERY</sql>``,
    then after the environment's real observation ``<solution>SQL_SOLUTION</solution>``; on the other
    rows ``7<eos>`` every turn (short turns). The trajectories are made by the environments themselves.
    Sampling at temperature 1 still strays now and then (each ``sql`` trajectory follows the script
    with probability ~0.9), so the tests check every trajectory by what it did, and train with a
    small learning rate: Adam moves every weight by about its rate each step, whatever the gradient."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_rlvr.demo.agents import CountdownChecker
    from lit_rlvr.demo.data import countdown_rows
    from lit_rlvr.envs.sql import SQLEnvironment

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    short = f"7{tok.eos_token}"
    scripted, turns = [], []
    for row in sql_rows:
        env = SQLEnvironment()
        env.reset(row, max_turns=3)
        query = f"<sql>{SQL_QUERY}</sql>"
        parts = [(query, True), (env.step(query).observation, False), (f"<solution>{SQL_SOLUTION}</solution>", True)]
        scripted.append(_trajectory(tok, row["prompt"], parts))
    for row in countdown_rows(MIXED_COUNTDOWN):
        env = CountdownChecker()
        env.reset(row, max_turns=3)
        parts = [(short, True), (env.step("7").observation, False), (short, True), (env.step("7").observation, False)]
        turns.append(_trajectory(tok, row["prompt"], [*parts, (short, True)]))
    for i in range(3):
        echo = f"[echo{i}]\n"
        parts = [(short, True), (echo, False), (short, True), (echo, False), (short, True)]
        turns.append(_trajectory(tok, f"C{i}{i + 4}=0{i}:", parts))

    def batch(trajectories):
        width = max(len(ids) for ids, _ in trajectories)
        ids = torch.full((len(trajectories), width), tok.pad_token_id)
        labels, attention = torch.full_like(ids, -100), torch.zeros_like(ids)
        for b, (row, mask) in enumerate(trajectories):
            ids[b, : len(row)], attention[b, : len(row)] = torch.tensor(row), 1
            labels[b, : len(row)] = torch.tensor([t if m else -100 for t, m in zip(row, mask)])
        return ids, attention, labels

    batches = [(batch(scripted), 4.0), (batch(turns), 1.0)]  # the long scripted turns weigh more
    steps = 120
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / 10) * 0.5 * (1 + math.cos(math.pi * i / steps))
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matmuls: two threads on a busy 2-core machine were 10x slower
    try:
        model.train()
        for _ in range(steps):
            loss = sum(w * model(input_ids=i, attention_mask=a, labels=y).loss for (i, a, y), w in batches)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    path = tmp_path_factory.mktemp("sql_llama")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
