"""Per-token log-probabilities and entropies from logits.

Vocabularies are large (150k for Qwen), so ``log_softmax(logits)`` of a (B, T, V) tensor is the
biggest activation of an RL step. Both functions here work one row at a time and only keep
(B, T) results: the chosen token's logit minus ``logsumexp`` (TRL's ``selective_log_softmax``
trick), and the entropy as ``logsumexp − Σ p·logit``.
"""

from __future__ import annotations

import torch
from torch import Tensor

ENTROPY_CHUNK = 1024  # positions per float32 softmax in token_entropy (the training forward computes it every step)


def token_logprobs(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each label under ``softmax(logits / temperature)``.

    Args:
        logits: ``(B, T, V)`` next-token logits aligned with ``labels``.
        labels: ``(B, T)`` long, the tokens whose log-prob is wanted.
        temperature: divides the logits first (must be > 0); the stored reference log-probs of
            DPH-RL use 1.0 (docs/methods.md §2).

    Returns:
        ``(B, T)`` float32 log-probs (computed in float32 even for bf16 logits).

    Example:
        >>> logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0]]])
        >>> token_logprobs(logits, torch.tensor([[0, 0]])).exp()
        tensor([[0.5000, 0.8808]])
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    out = torch.empty(labels.shape, dtype=torch.float32, device=logits.device)
    for b in range(logits.shape[0]):  # one (T, V) row at a time bounds the float32 copy
        row = logits[b].float()
        if temperature != 1.0:
            row = row / temperature
        chosen = row.gather(-1, labels[b].unsqueeze(-1)).squeeze(-1)
        out[b] = chosen - torch.logsumexp(row, dim=-1)
    return out


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of ``softmax(logits / temperature)`` at every position.

    Args:
        logits: ``(B, T, V)``.
        temperature: divides the logits first (must be > 0).

    Returns:
        ``(B, T)`` float32 entropies in nats.

    Example:
        >>> token_entropy(torch.zeros(1, 1, 4))  # uniform over 4 tokens: log 4
        tensor([[1.3863]])
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for entropies, got {temperature}")
    out = torch.empty(logits.shape[:2], dtype=torch.float32, device=logits.device)
    for b in range(logits.shape[0]):
        for t in range(0, logits.shape[1], ENTROPY_CHUNK):  # a packed row holds a whole batch: bound the copies
            row = logits[b, t : t + ENTROPY_CHUNK].float()
            if temperature != 1.0:
                row = row / temperature
            lse = torch.logsumexp(row, dim=-1)
            out[b, t : t + ENTROPY_CHUNK] = lse - (torch.softmax(row, dim=-1) * row).sum(-1)
    return out
