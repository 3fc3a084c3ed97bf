"""How many finished rows the KV-cache decode loop keeps computing: fewer than an eighth of a step's rows."""

from __future__ import annotations

import torch

import lit_rlvr.rollout.hf as hf
from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama
from lit_rlvr.rollout import SamplingParams


def test_finished_rows_are_dropped_before_an_eighth_of_the_batch_is_dead():
    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, num_layers=1, seed=0).eval()
    eos = [tok.eos_token_id, *tok.convert_tokens_to_ids(list("0123456789"))]  # ~1 in 10 tokens ends a row: ragged
    rows = [tok.encode(p) for p in ["12+3=", "C375=026:", "abc"] for _ in range(16)]  # 48 rows
    Lp = max(map(len, rows))
    ids = torch.tensor([[0] * (Lp - len(r)) + r for r in rows])
    mask = (torch.arange(Lp) >= Lp - torch.tensor([len(r) for r in rows])[:, None]).long()
    fed: list[int] = []  # rows of every decode forward (one new token each)
    hook = model.model.register_forward_pre_hook(
        lambda mod, a, kw: fed.append(kw["input_ids"].shape[0]) if kw["input_ids"].shape[1] == 1 else None,
        with_kwargs=True,
    )
    torch.manual_seed(0)
    tokens, _, _ = hf.decode_fast(model, ids, mask, SamplingParams(max_new_tokens=40), eos, tok.pad_token_id, tok)
    hook.remove()
    ended = torch.isin(tokens, torch.tensor(eos))
    lengths = torch.where(ended.any(1), ended.int().argmax(1) + 1, tokens.shape[1])  # (B,) tokens per row
    assert len(set(lengths.tolist())) > 10  # ragged
    for i, b in enumerate(fed):  # forward i feeds token i; rows with more tokens to come need it
        needed = int((lengths > i + 1).sum())
        assert b == needed or 8 * (b - needed) < b, (i, b, needed)
    assert len(fed) == int(lengths.max()) - 1
