"""token_logprobs / token_entropy against full log_softmax."""

import pytest
import torch

from lit_rlvr.functional.logprobs import token_entropy, token_logprobs


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_match_full_log_softmax(seed, temperature, dtype):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 5, 11, generator=gen) * 4).to(dtype)
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    full = torch.log_softmax(logits.float() / temperature, dim=-1)
    want = full.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, labels, temperature), want, atol=1e-5)
    want_h = -(full.exp() * full).sum(-1)
    assert torch.allclose(token_entropy(logits, temperature), want_h, atol=1e-5)


def test_gradient_matches_log_softmax():
    logits = torch.randn(2, 4, 7, requires_grad=True)
    labels = torch.randint(0, 7, (2, 4))
    token_logprobs(logits, labels).sum().backward()
    ref = logits.detach().clone().requires_grad_(True)
    torch.log_softmax(ref, -1).gather(-1, labels.unsqueeze(-1)).sum().backward()
    assert torch.allclose(logits.grad, ref.grad, atol=1e-6)


def test_rejects_non_positive_temperature():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(torch.zeros(1, 1, 2), torch.zeros(1, 1, dtype=torch.long), 0.0)


def test_token_entropy_in_chunks_equals_one_pass_and_keeps_its_gradient(monkeypatch):
    from lit_rlvr.functional import logprobs as module

    logits = torch.randn(2, 7, 11, generator=torch.Generator().manual_seed(0), requires_grad=True)
    whole = -(torch.softmax(logits / 0.7, -1) * torch.log_softmax(logits / 0.7, -1)).sum(-1)
    monkeypatch.setattr(module, "ENTROPY_CHUNK", 3)  # 3 + 3 + 1 positions per row
    chunked = module.token_entropy(logits, 0.7)
    torch.testing.assert_close(chunked, whole)
    (g1,) = torch.autograd.grad(chunked.sum(), logits)
    (g2,) = torch.autograd.grad(whole.sum(), logits)
    torch.testing.assert_close(g1, g2)
