"""Supervised warm start of the CPU demo's tiny base policy (a Lightning run), saved in HF format.

The demo needs a base policy that is a *diverse guesser* on countdown-3 (many different valid
expressions, right only part of the time) and has partly learned an out-of-domain task
(addition) that RL never sees, so that RL's effect on pass@k and on forgetting can be measured
(docs/demo.md). The recipe:

- Data (:class:`WarmStartData`): an endless stream of random examples, ``countdown_share`` of
  them countdown-3 on the *training* pairs only, with a uniformly random valid expression as the
  target (so no single answer is preferred), the rest ``width``-digit addition answered as
  ``\\boxed{082}`` (two-digit by default, see :mod:`lit_rlvr.demo.data`), never drawing the
  held-out addition pairs; with ``checker_share``, multi-turn trajectories with the countdown
  checker (:func:`lit_rlvr.demo.agents.checker_trajectory`), trained on the model's turns only
  (the checker's ``?`` joins the vocabulary); with ``sql_agent_share``, the multi-turn SQL toy's
  trajectories in the ``sql`` environment (:func:`lit_rlvr.demo.sql_agent.agent_trajectory`), with
  ``vocab_size`` a small BPE tokenizer trained on them. Prompts are built by
  :func:`lit_rlvr.data.prompts.encode_prompt`, exactly as the RL DataModule builds them; each
  completion ends with EOS.
- Model: a char-level tokenizer over :data:`lit_rlvr.demo.data.DEMO_CHARS` and a Llama
  (hidden 128, 5 layers, 4 heads × head_dim 32, FFN 512, tied embeddings: ~1.3M parameters).
- Training (:class:`WarmStartModule`): next-token cross-entropy on completion tokens only, AdamW
  (lr 2e-3), linear warm-up then cosine decay, batch 128, one torch thread.
- After training the base policy is measured (:func:`measure`) on the held-out countdown pairs
  and the addition prompts (32 samples per prompt at temperature 1.0: unbiased pass@k and distinct
  correct completions per prompt), and ``warmstart.json`` records the settings, the metrics and the
  wall time. A directory whose ``warmstart.json`` holds the same settings is reused as is.

Run it as ``python -m lit_rlvr.demo.warmstart --config configs/demo/warmstart.yaml``.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
import time
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from lit_rlvr.callbacks import StepProgressBar
from lit_rlvr.data.prompts import PromptFormat, encode_prompt
from lit_rlvr.demo import sql_agent, sql_toy
from lit_rlvr.demo.agents import CHECK, checker_trajectory
from lit_rlvr.demo.countdown import addition_completion, countdown_prompt, solutions, split_countdown
from lit_rlvr.demo.data import ADDITION_WIDTH, DEMO_CHARS, addition_rows, addition_val_pairs, countdown_rows
from lit_rlvr.demo.sql_agent import agent_trajectory
from lit_rlvr.demo.tiny import (
    DEFAULT_CHARS,
    build_bpe_tokenizer,
    build_char_tokenizer,
    build_tiny_llama,
    save_tiny_model,
)
from lit_rlvr.functional.metrics import pass_at_k_curve
from lit_rlvr.rewards import REWARDS

INFO_FILE = "warmstart.json"
IGNORE_INDEX = -100


def countdown_example(rng: random.Random, pairs: list[tuple[str, int]]) -> tuple[dict, str]:
    """A random training pair as a prompt row (digits shuffled) and a random valid expression.

    Example:
        >>> row, completion = countdown_example(random.Random(0), [("357", 26)])
        >>> row["prompt"], completion, REWARDS["countdown"](completion, row["answer"], digits=row["digits"])
        ('C537=026:', '7*3+5;', 1.0)
    """
    key, target = rng.choice(pairs)
    digits = "".join(rng.sample(key, 3))
    expression = rng.choice(solutions()[(key, target)])
    return {"prompt": countdown_prompt(digits, target), "answer": str(target), "digits": digits}, f"{expression};"


def addition_example(rng: random.Random, width: int, exclude: frozenset[tuple[int, int]]) -> tuple[dict, str]:
    """A random addition (operands < 10**width, not in ``exclude``) and its boxed answer.

    Example:
        >>> addition_example(random.Random(0), 3, frozenset())
        ({'prompt': 'A864+394=', 'answer': '1258'}, '\\\\boxed{1258}')
    """
    while True:
        a, b = rng.randrange(10**width), rng.randrange(10**width)
        if (a, b) not in exclude:
            row = addition_rows([(a, b)], width)[0]
            return {"prompt": row["prompt"], "answer": row["answer"]}, addition_completion(a, b, width)


def sql_example(rng: random.Random, questions: list[dict]) -> tuple[dict, str]:
    """A random SQL toy training question and a random query with its gold's result.

    Example:
        >>> row, completion = sql_example(random.Random(0), [{"prompt": "Q:count a>3;", "answer": "SELECT count(*) FROM t WHERE a>3;"}])
        >>> row["prompt"], completion
        ('Q:count a>3;', 'SELECT count(b) FROM t WHERE a>3;')
    """
    question = rng.choice(questions)
    return {"prompt": question["prompt"], "answer": question["answer"]}, rng.choice(
        sql_toy.equivalent_queries(question["answer"])
    )


def collate_examples(examples: list[tuple[list[int], ...]], pad_id: int) -> dict[str, Tensor]:
    """Right-pad ``(prompt_ids, completion_ids[, loss_mask])`` examples; labels are the completion
    tokens only, and of a multi-turn completion only the model's (``loss_mask`` 1).

    Returns:
        ``input_ids (B, L)``, ``attention_mask (B, L)`` and ``labels (B, L)`` (``-100`` on prompt,
        environment and padding positions, so the loss covers the model's completion tokens only).

    Example:
        >>> out = collate_examples([([5, 6], [7, 2]), ([5], [2])], pad_id=0)
        >>> out["input_ids"].tolist(), out["labels"].tolist()
        ([[5, 6, 7, 2], [5, 2, 0, 0]], [[-100, -100, 7, 2], [-100, 2, -100, -100]])
        >>> collate_examples([([5], [7, 8, 9], [1, 0, 1])], pad_id=0)["labels"].tolist()
        [[-100, 7, -100, 9]]
    """
    L = max(len(p) + len(c) for p, c, *_ in examples)
    input_ids = torch.full((len(examples), L), pad_id, dtype=torch.long)  # (B, L)
    labels = torch.full((len(examples), L), IGNORE_INDEX, dtype=torch.long)  # (B, L)
    attention_mask = torch.zeros((len(examples), L), dtype=torch.long)  # (B, L)
    for b, (p, c, *mask) in enumerate(examples):
        input_ids[b, : len(p) + len(c)] = torch.tensor(p + c)
        labels[b, len(p) : len(p) + len(c)] = torch.tensor(
            [t if m else IGNORE_INDEX for t, m in zip(c, mask[0] if mask else [1] * len(c))]
        )
        attention_mask[b, : len(p) + len(c)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class _ExampleStream(IterableDataset):
    """Endless batches of mixed countdown / SQL / addition examples (one RNG, so one worker)."""

    def __init__(self, data: WarmStartData):
        self.data = data

    def __iter__(self):
        d = self.data
        rng = random.Random(f"warmstart/{d.seed}")
        while True:
            examples = []
            for _ in range(d.batch_size):
                draw = rng.random()  # one draw per example whatever the mix, so sql_share=0 keeps the old stream
                if draw < d.countdown_share:
                    row, completion = countdown_example(rng, d.train_pairs)
                elif draw >= 1.0 - d.checker_share:  # the last share: a stream without trajectories keeps its draws
                    row, parts = checker_trajectory(rng, d.train_pairs, d.checker_turns)
                    examples.append((d.encode(row), *d.encode_turns(parts)))
                    continue
                elif draw >= 1.0 - d.checker_share - d.sql_agent_share:  # the share before it: no SQL agent, old draws
                    row, parts = agent_trajectory(rng, d.sql_agent_rows, d.checker_turns)
                    examples.append((d.encode(row), *d.encode_turns(parts)))
                    continue
                elif draw < d.countdown_share + d.sql_share:
                    row, completion = sql_example(rng, d.sql_train)
                else:
                    row, completion = addition_example(rng, d.addition_width, d.addition_exclude)
                examples.append((d.encode(row), d.encode_completion(completion)))
            yield collate_examples(examples, d.tokenizer.pad_token_id)


class WarmStartData(pl.LightningDataModule):
    """Streams random supervised examples of the demo tasks (module docstring).

    Args:
        tokenizer: the char-level tokenizer.
        prompt_format: how a row becomes prompt text; must match the RL run's.
        batch_size: examples per batch.
        countdown_share: probability that an example is countdown.
        sql_share: probability that it is an SQL toy question (training split) answered by a
            random query with the gold's result.
        checker_share: probability that it is a multi-turn countdown trajectory with the checker
            (:func:`~lit_rlvr.demo.agents.checker_trajectory`).
        sql_agent_share: probability that it is a multi-turn SQL agent trajectory on a training
            database of the multi-turn SQL toy (:func:`~lit_rlvr.demo.sql_agent.agent_trajectory`,
            observations by the ``sql`` environment); the rest is addition.
        checker_turns: the turn limit of the multi-turn trajectories (the RL run's ``max_turns``).
        holdout: share of countdown pairs held out (never drawn), as in :func:`split_countdown`.
        addition_width: digits per addition operand.
        addition_val_size: number of held-out addition pairs (never drawn).
        seed: drives the example stream.
        data_seed: drives the countdown split, the held-out additions and the SQL split; must be
            the seed the data files were written with (``lit-rlvr demo-data --seed``, default 0),
            or the warm start trains on the held-out prompts.
        sql_agent_dir: where the SQL agent's training databases are written (a temporary folder
            when None); only with ``sql_agent_share``.
    """

    def __init__(
        self,
        tokenizer,
        prompt_format: PromptFormat = PromptFormat(),
        batch_size: int = 128,
        countdown_share: float = 0.5,
        holdout: float = 0.1,
        addition_width: int = ADDITION_WIDTH,
        addition_val_size: int = 200,
        seed: int = 0,
        sql_share: float = 0.0,
        data_seed: int = 0,
        checker_share: float = 0.0,
        checker_turns: int = 3,
        sql_agent_share: float = 0.0,
        sql_agent_dir: str | Path | None = None,
    ):
        super().__init__()
        shares = (countdown_share, sql_share, checker_share, sql_agent_share)
        if not (all(0.0 <= x <= 1.0 for x in shares) and sum(shares) <= 1.0 + 1e-9):
            raise ValueError(
                "countdown_share, sql_share, checker_share and sql_agent_share must be in [0, 1] with sum <= 1,"
                f" got {shares}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format
        self.batch_size = batch_size
        self.countdown_share, self.sql_share = countdown_share, sql_share
        self.checker_share, self.checker_turns = checker_share, checker_turns
        self.sql_agent_share, self.sql_agent_rows = sql_agent_share, []
        if sql_agent_share:
            folder = Path(sql_agent_dir or tempfile.mkdtemp(prefix="lit_rlvr_sql_agent_"))
            self.sql_agent_rows = sql_agent.training_rows(folder, data_seed)  # every question of theirs
        self.sql_train, self.sql_val = sql_toy.split_questions(data_seed)
        self.addition_width = addition_width
        self.seed, self.data_seed = seed, data_seed
        self.train_pairs, self.val_pairs = split_countdown(data_seed, holdout)
        self.addition_exclude = frozenset(addition_val_pairs(data_seed, addition_val_size, addition_width))

    def encode(self, row: dict) -> list[int]:
        return encode_prompt(row, self.tokenizer, self.prompt_format)

    def encode_completion(self, completion: str) -> list[int]:
        return list(self.tokenizer(completion, add_special_tokens=False).input_ids) + [self.tokenizer.eos_token_id]

    def encode_turns(self, parts: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
        """A trajectory's completion ids (each turn tokenized once, EOS after the last) and its loss mask."""
        ids, mask = [], []
        for text, model in parts:
            part = self.tokenizer(text, add_special_tokens=False).input_ids
            ids, mask = ids + part, mask + [int(model)] * len(part)
        return ids + [self.tokenizer.eos_token_id], mask + [1]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_ExampleStream(self), batch_size=None, num_workers=0)


class WarmStartModule(pl.LightningModule):
    """Supervised fine-tuning of ``policy`` on completion tokens, AdamW with warm-up + cosine decay.

    Args:
        policy: a transformers causal LM.
        lr: peak learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up length.
        total_steps: cosine decay horizon (to ``min_lr_ratio`` × lr).
        min_lr_ratio: final learning rate as a share of ``lr``.
    """

    def __init__(
        self,
        policy,
        lr: float = 2e-3,
        weight_decay: float = 0.0,
        warmup_steps: int = 50,
        total_steps: int = 1000,
        min_lr_ratio: float = 0.1,
    ):
        super().__init__()
        self.policy = policy
        self.lr, self.weight_decay = lr, weight_decay
        self.warmup_steps, self.total_steps, self.min_lr_ratio = warmup_steps, total_steps, min_lr_ratio

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        out = self.policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        self.log("loss", out.loss, prog_bar=True)
        return out.loss

    def lr_factor(self, step: int) -> float:
        """Warm-up then cosine multiplier of ``lr`` at optimizer step ``step``.

        Example:
            >>> m = WarmStartModule(torch.nn.Linear(1, 1), warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
            >>> [round(m.lr_factor(s), 3) for s in (0, 9, 10, 60, 110, 500)]
            [0.1, 1.0, 1.0, 0.55, 0.1, 0.1]
        """
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        t = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.policy.parameters(), lr=self.lr, weight_decay=self.weight_decay, betas=(0.9, 0.95))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def measure(
    model,
    tokenizer,
    rows: list[dict],
    reward_fn,
    n_samples: int = 32,
    ks: tuple[int, ...] = (1, 4, 16, 32),
    prompt_format: PromptFormat = PromptFormat(),
    max_new_tokens: int = 16,
    seed: int = 0,
) -> dict[str, float]:
    """Sample ``n_samples`` completions per row at temperature 1.0 and summarise them.

    Args:
        model / tokenizer: the policy.
        rows: prompt rows (``reward_fn(completion, row["answer"], **row)`` judges them).
        reward_fn: a reward ``fn(completion, answer, **row) -> float``.
        n_samples: completions per prompt.
        ks: pass@k budgets (each <= ``n_samples``).

    Returns:
        ``pass@k`` for each k (unbiased, averaged over prompts), ``distinct_correct`` (mean number
        of distinct correct completions per prompt), ``solved`` (share of prompts with >= 1 correct
        sample) and ``prompts``.
    """
    from lit_rlvr.rollout.hf import HFEngine
    from lit_rlvr.rollout.types import SamplingParams

    engine = HFEngine(model, tokenizer, max_batch_rows=2048)
    params = SamplingParams(n=n_samples, temperature=1.0, max_new_tokens=max_new_tokens, seed=seed)
    rollouts = engine.generate([encode_prompt(r, tokenizer, prompt_format) for r in rows], params)
    engine.close()
    correct = torch.zeros(len(rows), dtype=torch.long)
    distinct = torch.zeros(len(rows))
    for i, row in enumerate(rows):
        texts = rollouts.texts[i * n_samples : (i + 1) * n_samples]
        ok = [t for t in texts if reward_fn(t, row["answer"], **{k: v for k, v in row.items() if k != "answer"}) > 0.5]
        correct[i], distinct[i] = len(ok), len(set(t.strip() for t in ok))
    out = {name: float(v) for name, v in pass_at_k_curve(num_correct=correct, n=n_samples, k=ks).items()}
    out |= {
        "distinct_correct": float(distinct.mean()),
        "solved": float((correct > 0).float().mean()),
        "prompts": len(rows),
    }
    return out


def warmstart(
    out_dir: str | Path = "artifacts/demo/base",
    steps: int = 200,
    max_seconds: float | None = None,
    seed: int = 0,
    data_seed: int = 0,
    lr: float = 2e-3,
    batch_size: int = 128,
    warmup_steps: int = 30,
    hidden_size: int = 128,
    num_layers: int = 5,
    num_heads: int = 4,
    head_dim: int = 32,
    intermediate_size: int = 512,
    countdown_share: float = 0.5,
    sql_share: float = 0.0,
    checker_share: float = 0.0,
    checker_turns: int = 3,
    sql_agent_share: float = 0.0,
    vocab_size: int | None = None,
    holdout: float = 0.1,
    addition_width: int = ADDITION_WIDTH,
    addition_val_size: int = 200,
    prompt_format: PromptFormat = PromptFormat(),
    threads: int = 1,
    eval_samples: int = 32,
    progress_bar: bool = True,
) -> Path:
    """Warm-start the demo's base policy into ``out_dir`` (HF format) or reuse a finished one.

    Args:
        out_dir: where the model, tokenizer and ``warmstart.json`` go.
        steps: optimizer steps (also the cosine horizon).
        max_seconds: optional wall-time budget; training stops at whichever limit comes first.
        seed: model init and example stream (one base per seed, all on the same data split).
        data_seed: the data split (held-out countdown pairs and additions, SQL split); must be
            the data files' ``lit-rlvr demo-data --seed`` so that the held-out prompts stay out.
        lr / batch_size / warmup_steps: optimisation.
        hidden_size / num_layers / num_heads / head_dim / intermediate_size: the Llama's size.
        countdown_share / sql_share / checker_share / checker_turns / sql_agent_share / holdout /
            addition_width / addition_val_size: see :class:`WarmStartData` (the SQL agent's training
            databases go to ``out_dir/sql_agent``).
        vocab_size: None for one token per character; else a BPE tokenizer of that many tokens
            trained on the SQL agent's trajectories (:func:`~lit_rlvr.demo.tiny.build_bpe_tokenizer`,
            :func:`~lit_rlvr.demo.sql_agent.corpus`; needs ``sql_agent_share``), so that its
            tags, keywords and observations' phrases are a few tokens each, and each table name one.
        prompt_format: prompt construction, must match the RL run's ``PromptFormat``.
        threads: torch CPU threads.
        eval_samples: samples per prompt when measuring the base (0 skips measuring).
        progress_bar: show Lightning's progress bar.

    Returns:
        ``out_dir``. If its ``warmstart.json`` records the same settings, nothing is trained.
    """
    out = Path(out_dir)
    settings = {k: v for k, v in locals().items() if k not in ("out_dir", "out", "progress_bar")}
    if not sql_share:
        del settings["sql_share"]  # bases warm-started before the SQL mix existed stay reusable
    if not checker_share and not sql_agent_share:
        del settings["checker_share"], settings["checker_turns"]  # ... and before the checker's trajectories
    if vocab_size is not None and not sql_agent_share:
        raise ValueError(
            "vocab_size (a BPE tokenizer trained on the SQL agent's trajectories) needs sql_agent_share > 0"
        )
    if not sql_agent_share:
        del settings["sql_agent_share"], settings["vocab_size"]  # ... and before the SQL agent's
    if data_seed == seed:
        del settings["data_seed"]  # the same training as before data_seed existed: such a base stays reusable
    settings["prompt_format"] = asdict(prompt_format)
    chars = DEMO_CHARS + (CHECK if checker_share and CHECK not in DEMO_CHARS else "")
    if sql_agent_share:  # the sql environment's observations are English: every printable character
        chars += "".join(c for c in DEFAULT_CHARS if c not in chars)
    settings["chars"] = chars
    info_path = out / INFO_FILE
    if info_path.is_file():
        previous = json.loads(info_path.read_text())
        if previous.get("settings") == settings:
            return out
        print(f"lit_rlvr warmstart: {out} holds a warm start with other settings; training a new one")
        info_path.unlink()
    torch.set_num_threads(threads)
    pl.seed_everything(seed, verbose=False)
    if vocab_size is None:
        tokenizer = build_char_tokenizer(chars)
    else:
        rows = sql_agent.training_rows(out / "sql_agent", data_seed)
        texts = sql_agent.corpus(rows, seed=data_seed, max_turns=checker_turns)
        tokenizer = build_bpe_tokenizer(texts, vocab_size, chars, words=sql_agent.TABLE_NAMES)
    model = build_tiny_llama(tokenizer, hidden_size, num_layers, num_heads, head_dim, intermediate_size, seed=seed)
    data = WarmStartData(
        tokenizer,
        prompt_format,
        batch_size,
        countdown_share,
        holdout,
        addition_width,
        addition_val_size,
        seed,
        sql_share,
        data_seed,
        checker_share,
        checker_turns,
        sql_agent_share,
        out / "sql_agent" if sql_agent_share else None,
    )
    module = WarmStartModule(model.train(), lr=lr, warmup_steps=warmup_steps, total_steps=steps)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_time=timedelta(seconds=max_seconds) if max_seconds else None,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress_bar,
        callbacks=[StepProgressBar()] if progress_bar else None,  # bounded by steps: "Epoch 0", not "Epoch 0/-2"
        default_root_dir=out / ".lightning",
    )
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.fit(module, datamodule=data)
    train_seconds, train_cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    model.eval()
    save_tiny_model(out, model, tokenizer)
    info = {
        "settings": settings,
        "params": sum(p.numel() for p in model.parameters()),
        "steps_done": trainer.global_step,
        "train_seconds": round(train_seconds, 1),
        "train_cpu_seconds": round(train_cpu_seconds, 1),  # = wall time on an idle core with threads=1
        "final_loss": float(trainer.callback_metrics.get("loss", float("nan"))),
    }
    if eval_samples:
        t0 = time.perf_counter()
        val_rows = countdown_rows(data.val_pairs, data_seed)
        add_rows = addition_rows(addition_val_pairs(data_seed, addition_val_size, addition_width), addition_width)
        ks = tuple(k for k in (1, 4, 16, 32) if k <= eval_samples)
        info["metrics"] = {
            "countdown_val": measure(
                model, tokenizer, val_rows, REWARDS["countdown"], eval_samples, ks, prompt_format, seed=seed
            ),
            "addition_val": measure(
                model, tokenizer, add_rows, REWARDS["math"], eval_samples, ks, prompt_format, seed=seed
            ),
        }
        if sql_share:
            db = str(sql_toy.build_database(out / "sql_toy.sqlite", data_seed))
            sql_rows = [{**q, "db_path": db} for q in data.sql_val]
            info["metrics"]["sql_val"] = measure(
                model,
                tokenizer,
                sql_rows,
                REWARDS["sql"],
                eval_samples,
                ks,
                prompt_format,
                max_new_tokens=40,
                seed=seed,
            )
        info["eval_seconds"] = round(time.perf_counter() - t0, 1)
    info_path.write_text(json.dumps(info, indent=2) + "\n")  # written last: marks the warm start finished
    return out


def build_parser():
    """The command line parser: every :func:`warmstart` argument, plus ``--config FILE`` (YAML)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(prog="lit-rlvr warmstart", description="Warm-start the CPU demo's tiny base policy.")
    parser.add_argument("--config", action=ActionConfigFile, help="YAML file of the arguments below")
    parser.add_function_arguments(warmstart)
    return parser


def main(argv: list[str] | None = None) -> Path:
    """Command line: ``python -m lit_rlvr.demo.warmstart [--config FILE] [--steps N] ...``."""
    parser = build_parser()
    cfg = parser.instantiate(parser.parse_args(argv))
    cfg.pop("config", None)
    path = warmstart(**cfg.as_dict())
    info = json.loads((path / INFO_FILE).read_text())
    print(
        json.dumps(
            {k: info[k] for k in ("steps_done", "train_seconds", "train_cpu_seconds", "metrics") if k in info}, indent=2
        )
    )
    return path


if __name__ == "__main__":
    main()
