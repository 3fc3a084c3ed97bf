"""Fixtures for reference-cache tests: the tiny model, a rollout engine, a toy scorer, prompt rows."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from lit_rlvr.rollout.types import Rollouts, SamplingParams

DIGITS = "0123456789"


def contains_any(completion: str, answer: str, **row) -> float:
    """Toy verifiable reward: 1 if the completion contains any character of ``answer``."""
    return float(any(ch in completion for ch in answer))


@pytest.fixture(autouse=True, scope="session")
def contains_reward():
    """Rows of these tests name ``contains``: register it (the DataModule checks reward names)."""
    from lit_rlvr.rewards import REWARDS

    if "contains" not in REWARDS:
        REWARDS.register("contains")(contains_any)
    yield "contains"


@dataclass
class Score:
    reward: float
    status: str


class ToyScorer:
    """Duck-typed BatchScorer over :func:`contains_any`."""

    def __init__(self):
        self.calls = 0

    def score(self, completions: list[str], rows: list[dict]) -> list[Score]:
        self.calls += 1
        return [Score(contains_any(c, r["answer"]), "ok") for c, r in zip(completions, rows)]


class GenerateEngine:
    """Minimal engine over ``model.generate`` (used only while the real HFEngine is not importable)."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        completions, finish = [], []
        for p in prompt_ids:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.model.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                do_sample=True,
                temperature=params.temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=params.max_new_tokens,
                num_return_sequences=params.n,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
            )[:, len(p) :].tolist()
            for c in out:
                if self.tokenizer.eos_token_id in c:
                    c = c[: c.index(self.tokenizer.eos_token_id) + 1]
                    finish.append("stop")
                else:
                    finish.append("length")
                completions.append(c)
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        return Rollouts(prompt_ids, completions, [[0.0] * len(c) for c in completions], finish, params.n, texts)


class FailAfter:
    """Wraps an engine and raises on the (k+1)-th generate call: a build killed mid-way."""

    def __init__(self, engine, k: int):
        self.engine, self.k, self.calls = engine, k, 0

    def generate(self, prompt_ids, params):
        if self.calls >= self.k:
            raise KeyboardInterrupt("simulated kill")
        self.calls += 1
        return self.engine.generate(prompt_ids, params)


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, tok


def make_engine(model, tok):
    try:
        from lit_rlvr.rollout.hf import HFEngine
    except ImportError:
        return GenerateEngine(model, tok)
    return HFEngine(model, tok)


@pytest.fixture(scope="session")
def toy_rows(tiny):
    """12 prompt rows (a JSONL-style toy task) and their token ids."""
    from lit_rlvr.data.prompts import encode_prompt

    _, tok = tiny
    rows = [{"id": f"toy/{i}", "prompt": f"q{i}: say {i}", "answer": DIGITS, "reward": "contains"} for i in range(12)]
    return rows, [encode_prompt(r, tok) for r in rows]


PARAMS = SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=7)  # seed: the build's run seed


def build(out, rows, prompt_ids, model, tok, engine=None, **kw):
    from lit_rlvr.cache import build_reference_cache

    kw.setdefault("prompts_per_shard", 3)
    return build_reference_cache(
        out,
        rows,
        prompt_ids,
        engine=engine or make_engine(model, tok),
        scorer=ToyScorer(),
        model=model,
        tokenizer=tok,
        params=kw.pop("params", PARAMS),
        progress=False,
        **kw,
    )


@pytest.fixture(scope="session")
def built_cache(tmp_path_factory, tiny, toy_rows):
    model, tok = tiny
    rows, ids = toy_rows
    return build(tmp_path_factory.mktemp("cache") / "ref", rows, ids, model, tok)


@pytest.fixture(scope="session")
def kit():
    """The helpers above, for test modules (``--import-mode=importlib`` cannot import conftest)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        PARAMS=PARAMS,
        FailAfter=FailAfter,
        build=build,
        contains_any=contains_any,
        make_engine=make_engine,
        ToyScorer=ToyScorer,
        DIGITS=DIGITS,
    )
