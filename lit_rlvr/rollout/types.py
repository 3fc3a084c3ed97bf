"""Data types shared by every rollout engine and by what consumes rollouts.

Row order is prompt-major everywhere: for P prompts with n samples each, row ``b`` of a
:class:`Rollouts` belongs to prompt ``b // n`` and ``group_ids[b] == b // n`` (B = P·n).

A multi-turn rollout (:mod:`lit_rlvr.rollout.turns`) is a :class:`Rollouts` too: its completion is
every turn's tokens, the model's and the environment's, with a per-token ``loss_mask`` (1 on the
model's tokens, 0 on the environment's) and one :class:`Episode` per row saying how it went.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    """What to sample: the knobs every engine honours identically.

    Also the ``sampling`` option group (:mod:`lit_rlvr.options`): the training rollouts'
    (``model.sampling``, read by the rollout callback) and the reference cache's (``lit-rlvr cache``'s
    ``sampling``); the rollout callback offsets the seed per step and rank.

    Args:
        n: completions per prompt (the group size G).
        temperature: softmax temperature; the sampler's log-probs are of the tempered distribution.
        top_p: nucleus mass (1.0 = off).
        top_k: keep the k most likely tokens (0 = off).
        max_new_tokens: cap on completion length.
        stop: strings that end a completion (the stop string is kept in the text).
        seed: makes sampling reproducible when given.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"sampling.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")


DEFAULT_SAMPLING = SamplingParams(n=8, temperature=1.0, max_new_tokens=256, seed=0)
"""The default ``sampling`` of training (``model.sampling``) and of the reference cache (``lit-rlvr cache``,
:func:`~lit_rlvr.cache.build_reference_cache`) alike: defined here, below both."""


EPISODE_STATUSES = ("done", "max_turns", "length", "env_error", "env_timeout")


@dataclass(frozen=True)
class Episode:
    """How one multi-turn trajectory went.

    Attributes:
        reward: the environment's reward for the trajectory (None: the environment gives none; the
            reward functions score its text). 0 for ``env_error`` / ``env_timeout``.
        status: ``done`` (the environment ended it), ``max_turns``, ``length`` (the token budget or
            the context ran out), ``env_error`` / ``env_timeout`` (the environment failed or hung:
            the trajectory is not trained on).
        reason: why, for the last two.
        turns: the model's turns.
        tool_calls: each tool call, in order (the trajectory's behaviour).
        tool_errors: calls that failed, and turns the environment rejected as invalid (no call).
        final_text: the model's last turn (its final answer).
    """

    reward: float | None
    status: str
    reason: str = ""
    turns: int = 0
    tool_calls: tuple[str, ...] = ()
    tool_errors: int = 0
    final_text: str = ""

    def __post_init__(self):
        if self.status not in EPISODE_STATUSES:
            raise ValueError(f"Episode.status must be one of {EPISODE_STATUSES}; got {self.status!r}")


@dataclass
class Rollouts:
    """P prompts × n completions, ragged, as an engine returns them.

    Attributes:
        prompt_ids: P lists of prompt token ids.
        completion_ids: B lists of completion token ids (B = P·n, prompt-major).
        sampler_logprobs: B lists, the sampler's log-prob of each completion token (same lengths
            as ``completion_ids``; 0.0 on a multi-turn rollout's environment tokens).
        finish_reasons: B strings, ``"stop"`` (EOS or stop string) or ``"length"``.
        n: samples per prompt.
        texts: B decoded completions (filled by the engine when it has a tokenizer).
        loss_mask: multi-turn rollouts: B lists, 1 on the model's tokens and 0 on the environment's
            (same lengths as ``completion_ids``); None for single-turn rollouts (every token is the model's).
        episodes: multi-turn rollouts: B :class:`Episode`; None for single-turn rollouts.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    sampler_logprobs: list[list[float]]
    finish_reasons: list[str]
    n: int
    texts: list[str] = field(default_factory=list)
    loss_mask: list[list[int]] | None = None
    episodes: list[Episode] | None = None

    def __post_init__(self):
        B = len(self.prompt_ids) * self.n
        if not (len(self.completion_ids) == len(self.sampler_logprobs) == len(self.finish_reasons) == B):
            raise ValueError(
                f"Rollouts: expected {B} rows (P={len(self.prompt_ids)} × n={self.n}), got "
                f"{len(self.completion_ids)} completions, {len(self.sampler_logprobs)} log-prob rows, "
                f"{len(self.finish_reasons)} finish reasons"
            )
        if self.loss_mask is not None and [len(m) for m in self.loss_mask] != [len(c) for c in self.completion_ids]:
            raise ValueError("Rollouts.loss_mask: expected one 0/1 per completion token of every row")
        if self.episodes is not None and len(self.episodes) != B:
            raise ValueError(f"Rollouts.episodes: expected {B} episodes, got {len(self.episodes)}")

    @property
    def group_ids(self) -> Tensor:
        """``(B,)`` long: the prompt index of each row."""
        return torch.arange(len(self.prompt_ids)).repeat_interleave(self.n)

    def of_prompts(self, prompts: list[int]) -> Rollouts:
        """The rollouts of the given prompts only (indices into ``prompt_ids``), in that order.

        Example:
            >>> r = Rollouts([[1], [2]], [[5], [6], [7], [8]], [[0.0]] * 4, ["stop"] * 4, n=2, texts=list("abcd"))
            >>> r.of_prompts([1]).texts
            ['c', 'd']
        """
        rows = [p * self.n + j for p in prompts for j in range(self.n)]

        def pick(values):
            return None if values is None else [values[b] for b in rows]

        return Rollouts(
            [self.prompt_ids[p] for p in prompts],
            pick(self.completion_ids),
            pick(self.sampler_logprobs),
            pick(self.finish_reasons),
            self.n,
            pick(self.texts) if self.texts else [],
            pick(self.loss_mask),
            pick(self.episodes),
        )

    def behaviour(self) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """Multi-turn rollouts: each trajectory's turns, tool calls, failed tool calls and whether its
        environment failed, each ``(B,)`` (:func:`~lit_rlvr.functional.metrics.behaviour_sums`); None for single-turn.
        """
        if self.episodes is None:
            return None
        e = self.episodes
        return (
            torch.tensor([x.turns for x in e], dtype=torch.long),
            torch.tensor([len(x.tool_calls) for x in e], dtype=torch.long),
            torch.tensor([x.tool_errors for x in e], dtype=torch.long),
            torch.tensor([x.status in ("env_error", "env_timeout") for x in e], dtype=torch.bool),
        )

    def tool_sequences(self) -> list[list[tuple[str, ...]]] | None:
        """Multi-turn rollouts: P groups of n tool-call sequences (each trajectory's calls in order); None for single-turn."""
        if self.episodes is None:
            return None
        return [
            [self.episodes[b].tool_calls for b in range(p * self.n, (p + 1) * self.n)]
            for p in range(len(self.prompt_ids))
        ]

    def final_turns(self) -> tuple[list[str], list[list[int]]]:
        """What the reward functions score: B texts and their token ids.

        Single-turn: the completions. Multi-turn: the model's last turn of each trajectory (its
        final answer; the tokens after the last environment token), so a reward written for
        single-turn answers scores a trajectory's answer as it scores a completion.

        Example:
            >>> r = Rollouts([[1]], [[5, 6, 7, 8]], [[-1.0, 0.0, -1.0, -1.0]], ["stop"], n=1, texts=["a=1b;"],
            ...              loss_mask=[[1, 0, 1, 1]], episodes=[Episode(None, "done", turns=2, final_text="b;")])
            >>> r.final_turns()
            (['b;'], [[7, 8]])
        """
        texts = list(self.texts)
        if self.episodes is None or self.loss_mask is None:
            return texts, [list(c) for c in self.completion_ids]
        ids = []
        for completion, mask in zip(self.completion_ids, self.loss_mask):
            start = len(mask) - next((i for i, m in enumerate(reversed(mask)) if not m), len(mask))
            ids.append(list(completion[start:]) if any(mask) else [])
        return [e.final_text for e in self.episodes], ids

    def environment_rewards(self) -> list[float | None] | None:
        """B rewards the environments gave (None where one gave none: the reward functions score that
        row); None for single-turn rollouts."""
        return None if self.episodes is None else [e.reward for e in self.episodes]

    def num_tokens(self) -> int:
        """Total completion tokens, the model's and (multi-turn) the environment's."""
        return sum(len(c) for c in self.completion_ids)

    def model_tokens(self) -> int:
        """Completion tokens the model generated and is trained on (the loss mask's ones; single-turn:
        every completion token): what generation throughput counts.

        Example:
            >>> r = Rollouts([[1]], [[5, 6, 7, 8]], [[0.0] * 4], ["stop"], n=1, loss_mask=[[1, 0, 0, 1]])
            >>> r.model_tokens(), r.environment_tokens(), r.num_tokens()
            (2, 2, 4)
        """
        if self.loss_mask is None:
            return self.num_tokens()
        return sum(sum(m) for m in self.loss_mask)

    def environment_tokens(self) -> int:
        """Completion tokens that are not the model's (the environment's, and those of a trajectory whose
        environment failed, which is not trained on); 0 for single-turn rollouts."""
        return self.num_tokens() - self.model_tokens()

    def to_padded(self, pad_id: int) -> dict[str, Tensor]:
        """Pad into the tensors a policy forward pass consumes.

        Prompts are left-padded to the longest prompt (Lp) and completions right-padded to the
        longest completion (T), so every completion starts at column Lp.

        Returns:
            ``input_ids (B, Lp+T)``, ``attention_mask (B, Lp+T)``, ``response_mask (B, T)``
            (1 on real completion tokens), ``old_logprobs (B, T)`` (sampler log-probs, 0 on
            padding), ``group_ids (B,)``, and for multi-turn rollouts ``loss_mask (B, T)`` (1 on the
            model's tokens, 0 on the environment's and on padding).
        """
        prompts = [self.prompt_ids[b // self.n] for b in range(len(self.completion_ids))]
        Lp = max(len(p) for p in prompts)
        T = max(1, max(len(c) for c in self.completion_ids))
        B = len(prompts)
        input_ids = torch.full((B, Lp + T), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((B, Lp + T), dtype=torch.long)
        old_logprobs = torch.zeros((B, T), dtype=torch.float32)
        for b, (p, c, lp) in enumerate(zip(prompts, self.completion_ids, self.sampler_logprobs)):
            input_ids[b, Lp - len(p) : Lp] = torch.tensor(p, dtype=torch.long)
            attention_mask[b, Lp - len(p) : Lp + len(c)] = 1
            if c:
                input_ids[b, Lp : Lp + len(c)] = torch.tensor(c, dtype=torch.long)
                old_logprobs[b, : len(c)] = torch.tensor(lp, dtype=torch.float32)
        response_mask = attention_mask[:, Lp:].clone()
        padded = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "old_logprobs": old_logprobs,
            "group_ids": self.group_ids,
        }
        if self.loss_mask is not None:
            loss_mask = torch.zeros((B, T), dtype=torch.long)
            for b, m in enumerate(self.loss_mask):
                loss_mask[b, : len(m)] = torch.tensor(m, dtype=torch.long)
            padded["loss_mask"] = loss_mask
        return padded
