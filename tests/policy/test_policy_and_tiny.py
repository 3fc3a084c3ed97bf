"""completion_logprobs (padding layout) against unpadded per-row forward passes; tiny model round trip."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from lit_rlvr.policy import completion_logprobs, sequence_logprob
from lit_rlvr.rollout.types import Rollouts


def test_tiny_model_and_tokenizer_round_trip(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert isinstance(tok, PreTrainedTokenizerFast)  # not a hub tokenizer class picked from the config
    text = "C375=026: 3*7+5;"
    assert tok.decode(tok(text).input_ids) == text
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.head_dim == 32


def test_padded_logprobs_equal_unpadded_forward(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [tok("12+3=").input_ids, tok("7*8+100=").input_ids]
    completions = [tok("15;").input_ids, tok("1").input_ids, tok("156;").input_ids, tok("99").input_ids]
    r = Rollouts(prompts, completions, [[0.0] * len(c) for c in completions], ["stop"] * 4, n=2)
    batch = r.to_padded(tok.pad_token_id)
    T = batch["response_mask"].shape[1]
    with torch.no_grad():
        lp, ent = completion_logprobs(model, batch["input_ids"], batch["attention_mask"], T, with_entropy=True)
    assert lp.shape == ent.shape == (4, T)
    for b, c in enumerate(completions):
        want = sequence_logprob(model, prompts[b // 2], c)
        assert torch.allclose(lp[b, : len(c)], want, atol=1e-5), b
    assert batch["group_ids"].tolist() == [0, 0, 1, 1]
    assert batch["response_mask"].sum(1).tolist() == [len(c) for c in completions]


def test_rollouts_reject_wrong_row_count():
    import pytest

    with pytest.raises(ValueError, match="expected 4 rows"):
        Rollouts([[1], [2]], [[3]], [[0.0]], ["stop"], n=2)


def test_the_policy_loads_in_train_mode_so_gradient_checkpointing_recomputes(tiny_model_dir):
    """transformers loads in eval mode, where gradient checkpointing is off: a loaded policy trains in train mode,
    and with ``gradient_checkpointing`` each layer runs again in the backward (and only then)."""
    from lit_rlvr.policy import PolicyOptions, load_policy

    ids = torch.tensor([[1, 2, 3, 4, 5]])
    for checkpointing, forwards in ((False, 1), (True, 2)):
        policy, _ = load_policy(PolicyOptions(str(tiny_model_dir), gradient_checkpointing=checkpointing))
        assert all(module.training for module in policy.modules())
        calls = []
        policy.model.layers[0].mlp.register_forward_pre_hook(
            lambda *_: calls.append(1)
        )  # pre: recomputing may stop early
        policy(input_ids=ids).logits.sum().backward()
        assert len(calls) == forwards, checkpointing
