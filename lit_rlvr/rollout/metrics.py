"""What a batch of rollouts logs: its time, throughput, lengths and truncations (:func:`rollout_metrics`).

The rollout callback logs them for every training (``rollout/…``) and validation (``val_rollout/…``)
batch; asynchronous rollouts add their staleness and waits
(:meth:`~lit_rlvr.callbacks.rollout_producer.AsyncRollouts.take`).
"""

from __future__ import annotations

from lit_rlvr.rollout.types import Rollouts


def rollout_metrics(
    rollouts: Rollouts, seconds: float, generate_seconds: float, prefix: str = "rollout"
) -> dict[str, float]:
    """What one batch of rollouts logs under ``prefix`` (``rollout``, ``val_rollout``).

    Args:
        rollouts: the batch's B completions.
        seconds: how long the loop waited for them.
        generate_seconds: how long their generation took (the same, unless generated ahead).

    Returns:
        ``<prefix>/seconds``, ``<prefix>/tokens_per_s`` (the model's completion tokens per second of
        generation), ``<prefix>/mean_len`` (the model's tokens per completion), ``<prefix>/truncated``
        (share of completions cut at ``max_new_tokens``); multi-turn rollouts add
        ``<prefix>/env_tokens`` (environment tokens per trajectory, which the other two leave out).

    Example:
        >>> r = Rollouts([[1]], [[5, 6, 7], [8]], [[0.0] * 3, [0.0]], ["length", "stop"], n=2)
        >>> rollout_metrics(r, seconds=0.5, generate_seconds=2.0)
        {'rollout/seconds': 0.5, 'rollout/tokens_per_s': 2.0, 'rollout/mean_len': 2.0, 'rollout/truncated': 0.5}
        >>> r = Rollouts([[1]], [[5, 6, 7, 8], [9]], [[0.0] * 4, [0.0]], ["stop"] * 2, n=2, loss_mask=[[1, 0, 0, 1], [1]])
        >>> rollout_metrics(r, seconds=1.0, generate_seconds=1.0)
        {'rollout/seconds': 1.0, 'rollout/tokens_per_s': 3.0, 'rollout/mean_len': 1.5, 'rollout/truncated': 0.0, 'rollout/env_tokens': 1.0}
    """
    tokens, B = rollouts.model_tokens(), len(rollouts.completion_ids)
    out = {
        f"{prefix}/seconds": seconds,
        f"{prefix}/tokens_per_s": tokens / max(generate_seconds, 1e-9),
        f"{prefix}/mean_len": tokens / B,
        f"{prefix}/truncated": sum(r == "length" for r in rollouts.finish_reasons) / B,
    }
    if rollouts.loss_mask is not None:
        out[f"{prefix}/env_tokens"] = rollouts.environment_tokens() / B
    return out
