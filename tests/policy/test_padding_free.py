"""The padding-free (packed) and shared-prompt forwards and the micro-batched log-prob passes against the
padded forward.

Per-token log-probs, entropies and gradients must agree with ``completion_logprobs``'s padded
forward on the tiny Llama, for every attention implementation that keeps packed sequences apart
(transformers builds a block-diagonal causal mask from packed position ids for sdpa and eager;
flash-attention's varlen kernel cannot run on CPU, so its one-row layout is exercised through sdpa).
"""

from __future__ import annotations

import pytest
import torch

import lit_rlvr.policy.logprobs as policy_mod
from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama
from lit_rlvr.policy import (
    MicroBatching,
    batched_completion_logprobs,
    completion_logprobs,
    packs_sequences,
    shares_prompts,
)
from lit_rlvr.rollout.types import Rollouts

IMPLEMENTATIONS = ["sdpa", "eager"]


def tiny(attn: str, seed: int = 0):
    model = build_tiny_llama(build_char_tokenizer(), num_layers=2, seed=seed)
    model.config._attn_implementation = attn
    return model


def decoder_input_shapes(model) -> list[tuple[int, int]]:
    """``input_ids.shape`` of every forward of ``model``'s decoder, appended as they run."""
    shapes: list[tuple[int, int]] = []
    model.model.register_forward_pre_hook(
        lambda mod, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return shapes


def ragged_batch(seed: int, P: int = 3, n: int = 3, max_prompt: int = 9, max_completion: int = 14) -> dict:
    gen = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(4, 90, (int(torch.randint(1, max_prompt + 1, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(P)
    ]
    completions = [
        torch.randint(4, 90, (int(torch.randint(0, max_completion + 1, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(P * n)
    ]
    completions[0] = completions[0] or [5]  # at least one completion token in the batch
    r = Rollouts(prompts, completions, [[0.0] * len(c) for c in completions], ["stop"] * len(completions), n=n)
    return r.to_padded(0)


@pytest.mark.parametrize("attn", IMPLEMENTATIONS)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_packed_logprobs_and_entropies_equal_the_padded_forward(attn, seed, temperature):
    model = tiny(attn)
    batch = ragged_batch(seed)
    T, mask = batch["response_mask"].shape[1], batch["response_mask"].bool()
    with torch.no_grad():
        lp, ent = completion_logprobs(model, batch["input_ids"], batch["attention_mask"], T, temperature, True)
        plp, pent = completion_logprobs(
            model, batch["input_ids"], batch["attention_mask"], T, temperature, True, padding_free=True
        )
    assert plp.shape == pent.shape == (len(mask), T)
    assert torch.allclose(plp[mask], lp[mask], atol=1e-5) and torch.allclose(pent[mask], ent[mask], atol=1e-5)
    assert (plp[~mask] == 0).all()


@pytest.mark.parametrize("attn", IMPLEMENTATIONS)
@pytest.mark.parametrize("one_row", [False, True], ids=["bins", "one_row"])
def test_packed_gradients_equal_the_padded_gradients(attn, one_row, monkeypatch):
    if one_row:  # flash-attention's layout: every sequence in one packed row
        monkeypatch.setattr(policy_mod, "_attention_kind", lambda model: "varlen")
    batch = ragged_batch(7)
    T, mask = batch["response_mask"].shape[1], batch["response_mask"]
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    grads = []
    for padding_free in (False, True):
        model = tiny(attn).train()
        lp, _ = completion_logprobs(
            model, batch["input_ids"], batch["attention_mask"], T, 1.0, padding_free=padding_free
        )
        torch.where(mask.bool(), lp * weights, 0.0).sum().backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("padding_free", [False, True])
@pytest.mark.parametrize(
    "batching",
    [MicroBatching(), MicroBatching(max_rows=2), MicroBatching(max_tokens=40), MicroBatching(max_rows=3, max_tokens=1)],
    ids=["all", "rows2", "tokens40", "tokens1"],
)
def test_micro_batched_logprobs_equal_one_forward(batching, padding_free):
    model = tiny("sdpa")
    batch = ragged_batch(3, P=4, n=4)
    T, mask = batch["response_mask"].shape[1], batch["response_mask"].bool()
    with torch.no_grad():
        want, want_ent = completion_logprobs(model, batch["input_ids"], batch["attention_mask"], T, 0.8, True)
        got, ent = batched_completion_logprobs(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            T,
            0.8,
            True,
            MicroBatching(batching.max_rows, batching.max_tokens, padding_free),
        )
    assert got.shape == (16, T)
    assert torch.allclose(got[mask], want[mask], atol=1e-5) and torch.allclose(ent[mask], want_ent[mask], atol=1e-5)


def test_micro_batched_forwards_are_length_sorted_cropped_and_within_budget():
    model = tiny("sdpa")
    batch = ragged_batch(5, P=4, n=4)
    shapes = decoder_input_shapes(model)
    with torch.no_grad():
        batched_completion_logprobs(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            batch["response_mask"].shape[1],
            batching=MicroBatching(max_tokens=60),
        )
    assert len(shapes) > 1 and all(b * L <= 60 or b == 1 for b, L in shapes)
    assert all(L < batch["input_ids"].shape[1] for _, L in shapes[1:])  # later (shorter) micro-batches are cropped
    assert sum(b for b, _ in shapes) == 16


def test_packing_support_is_probed_and_refused_where_sequences_would_mix():
    model = tiny("sdpa")
    assert packs_sequences(model, True) and packs_sequences(model, "auto") and not packs_sequences(model, False)
    assert packs_sequences(tiny("eager"), True) and not packs_sequences(tiny("eager"), "auto")  # eager: not measured

    class Mixing(torch.nn.Module):  # claims sdpa but hides the packing from transformers' mask builder
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, input_ids, position_ids=None, **kwargs):
            return self.inner(
                input_ids=input_ids, position_ids=position_ids, attention_mask=torch.ones_like(input_ids), **kwargs
            )

        def get_output_embeddings(self):
            return self.inner.get_output_embeddings()

    with pytest.raises(
        ValueError,
        match=r"model.batching.padding_free=true: Mixing with attn_implementation='sdpa' does not keep packed",
    ):
        packs_sequences(Mixing(tiny("sdpa")), True)
    assert not packs_sequences(Mixing(tiny("sdpa")), False)
    unknown = tiny("sdpa")
    unknown.config._attn_implementation = "paged_attention"
    with pytest.raises(ValueError, match="does not keep packed sequences apart"):
        packs_sequences(unknown, True)
    with pytest.raises(ValueError, match="model.batching.padding_free must be 'auto', true or false, got 'yes'"):
        packs_sequences(model, "yes")


def test_auto_packs_flash_varlen_anywhere_and_sdpa_on_cpu_only(monkeypatch):
    model = tiny("eager")
    monkeypatch.setattr(policy_mod, "_attention_kind", lambda model: "varlen")
    assert packs_sequences(model, "auto")
    monkeypatch.setattr(policy_mod, "_attention_kind", lambda model: "mask")
    assert not policy_mod._packing_pays(model, "mask")
    model.config._attn_implementation = "sdpa"
    assert policy_mod._packing_pays(model, "mask")
    monkeypatch.setattr(model, "parameters", lambda: iter([torch.nn.Parameter(torch.zeros(1, device="meta"))]))
    assert not policy_mod._packing_pays(model, "mask")  # sdpa off CPU: padded under auto


@pytest.mark.parametrize("attn", IMPLEMENTATIONS)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_shared_prompt_logprobs_and_entropies_equal_the_padded_forward(attn, seed, temperature):
    model = tiny(attn)
    batch = ragged_batch(seed, P=3, n=4)  # ragged prompts, each shared by its 4 rows
    T, mask = batch["response_mask"].shape[1], batch["response_mask"].bool()
    with torch.no_grad():
        lp, ent = completion_logprobs(model, batch["input_ids"], batch["attention_mask"], T, temperature, True)
        slp, sent = completion_logprobs(
            model, batch["input_ids"], batch["attention_mask"], T, temperature, True, shared_prompts=True
        )
    assert slp.shape == sent.shape == (12, T)
    assert torch.allclose(slp[mask], lp[mask], atol=1e-5) and torch.allclose(sent[mask], ent[mask], atol=1e-5)


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_shared_prompt_gradients_equal_the_padded_gradients(entropy_grad):
    """Every row's gradient reaches its prompt's one forward through the repeated keys and values."""
    batch = ragged_batch(7, P=3, n=4)
    T, mask = batch["response_mask"].shape[1], batch["response_mask"]
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    grads = []
    for shared in (False, True):
        model = tiny("sdpa").train()
        lp, ent = completion_logprobs(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            T,
            0.8,
            True,
            entropy_grad=entropy_grad,
            shared_prompts=shared,
        )
        loss = torch.where(mask.bool(), lp * weights + (ent if entropy_grad else 0.0), 0.0).sum()
        loss.backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4), name


def test_shared_prompts_forward_each_distinct_prompt_once_in_every_micro_batch():
    model = tiny("sdpa")
    batch = ragged_batch(2, P=4, n=4)
    shapes = decoder_input_shapes(model)
    T, mask = batch["response_mask"].shape[1], batch["response_mask"].bool()
    with torch.no_grad():
        want, _ = completion_logprobs(model, batch["input_ids"], batch["attention_mask"], T)
        assert shares_prompts(model, True)  # the probe's forwards, once per model
        shapes.clear()
        got, _ = batched_completion_logprobs(
            model, batch["input_ids"], batch["attention_mask"], T, batching=MicroBatching(shared_prompts=True)
        )
        assert [b for b, _ in shapes] == [4, 16]  # the 4 prompts, then the 16 completions on their keys and values
        shapes.clear()
        distinct = batch["input_ids"].clone()
        distinct[:, 0] = torch.arange(16)  # no prompt repeats: still two forwards (ranks in step under FSDP)
        completion_logprobs(model, distinct, torch.ones_like(distinct), T, shared_prompts=True)
        assert [b for b, _ in shapes] == [16, 16]
    assert torch.allclose(got[mask], want[mask], atol=1e-5)


def test_prompt_sharing_is_probed_and_refused_where_the_keys_and_values_cannot_be_shared(monkeypatch):
    model = tiny("sdpa")
    assert shares_prompts(model, True) and not shares_prompts(model, False)
    assert policy_mod._SHARES[model] < 1e-5

    class Forgetful(torch.nn.Module):  # drops the cache it is given: the completions would lose their prompt
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, past_key_values=None, **kwargs):
            return self.inner(**kwargs)

        def get_output_embeddings(self):
            return self.inner.get_output_embeddings()

    with pytest.raises(
        ValueError, match=r"shared_prompts=true: Forgetful cannot share .*max \|log-prob difference\| .* on a probe"
    ):
        shares_prompts(Forgetful(tiny("sdpa")), True)
    monkeypatch.setattr(policy_mod, "reusable", lambda cache: False)  # e.g. sliding-window or recurrent layers
    with pytest.raises(ValueError, match=r"its cache DynamicCache does not keep every token's keys and values"):
        shares_prompts(tiny("sdpa"), True)
    checkpointed = tiny("sdpa")
    checkpointed.gradient_checkpointing_enable()
    with pytest.raises(ValueError, match="which gradient checkpointing drops"):
        shares_prompts(checkpointed, True)


@pytest.mark.parametrize("training", [True, False])
def test_eval_mode_turns_dropout_off_for_its_block_and_restores_the_flag_even_on_an_error(training):
    model = torch.nn.Sequential(torch.nn.Dropout(0.5)).train(training)
    x = torch.ones(1000)
    with policy_mod.eval_mode(model):
        assert not model.training and torch.equal(model(x), x)  # dropout off: the identity
    assert model.training is training
    with pytest.raises(RuntimeError, match="inside"), policy_mod.eval_mode(model):
        raise RuntimeError("inside")
    assert model.training is training
