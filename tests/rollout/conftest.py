"""The rollout tests' shared pieces: a scripted engine for the multi-turn loop (every trajectory's turns
given as token ids), and the char tokenizer, tiny Llama and ragged prompts the ``hf`` engine's tests use."""

from __future__ import annotations

import pytest

from lit_rlvr.demo.tiny import build_char_tokenizer, build_tiny_llama
from lit_rlvr.rollout.engine import EngineBase
from lit_rlvr.rollout.types import Rollouts, SamplingParams

PROMPTS = ["12+3=", "7", "abc def ghi", "9*9=", "C375=026:"]  # ragged lengths: left padding differs per row


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_llama(tok, num_layers=2, seed=0).eval()


@pytest.fixture(scope="module")
def prompts(tok):
    """:data:`PROMPTS` encoded."""
    return [tok.encode(p) for p in PROMPTS]


class ScriptedEngine(EngineBase):
    """Answers each prefix with the next turn of the trajectory whose turns it contains.

    ``scripts[tuple(prompt_ids)]`` lists, for each of the prompt's samples, that trajectory's model turns
    (token id lists, distinct first turns). A prefix is the prompt, then turns and environment tokens: the
    next turn is the first of its script's turns not yet found, in order, after the prompt. Log-probs
    are ``-0.5 - 0.01 j`` at position j of a turn; ``calls`` records every call's prompts and params.
    With ``honour_stop``, a turn is cut after the token at which its text first contains one of the
    call's stop strings (kept, as the engines keep it).
    """

    name = "scripted"

    def __init__(self, tokenizer, scripts: dict[tuple[int, ...], list[list[list[int]]]], honour_stop: bool = False):
        super().__init__()
        self.tokenizer, self.scripts, self.honour_stop = tokenizer, scripts, honour_stop
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []
        self.outputs: list[list[list[int]]] = []

    def _next_turn(self, prefix: list[int], sample: int) -> list[int]:
        prompt = next((q for q in self.scripts if tuple(prefix[: len(q)]) == q), None)
        assert prompt is not None, f"no script for prefix {prefix}"
        rest, scripts = prefix[len(prompt) :], self.scripts[prompt]
        done = [_turns_found(rest, script) for script in scripts]
        if max(done) == 0:  # a first turn: the call's sample index tells the trajectory (n = 1: the prompt's only one)
            return scripts[sample][0]
        script, turn = max(zip(scripts, done), key=lambda pair: pair[1])
        return script[turn] if turn < len(script) else []

    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        self.calls.append((prompt_ids, params))
        completions, logprobs, reasons, texts = [], [], [], []
        for p in prompt_ids:
            for k in range(params.n):
                ids = self._next_turn(list(p), k)[: params.max_new_tokens]
                if self.honour_stop and params.stop:
                    ends = (
                        j + 1
                        for j in range(len(ids))
                        if any(x in self.tokenizer.decode(ids[: j + 1]) for x in params.stop)
                    )
                    ids = ids[: next(ends, len(ids))]
                completions.append(ids)
                logprobs.append([-0.5 - 0.01 * j for j in range(len(ids))])
                reasons.append("length" if len(ids) == params.max_new_tokens else "stop")
                texts.append(self.tokenizer.decode(ids, skip_special_tokens=True))
        self.outputs.append(completions)
        return Rollouts([list(p) for p in prompt_ids], completions, logprobs, reasons, params.n, texts)

    def _update_weights(self, model) -> None:
        pass


def _turns_found(rest: list[int], script: list[list[int]]) -> int:
    """How many of ``script``'s turns occur in ``rest``, in order."""
    pos, turn = 0, 0
    while turn < len(script):
        at = next(
            (
                i
                for i in range(pos, len(rest) - len(script[turn]) + 1)
                if rest[i : i + len(script[turn])] == script[turn]
            ),
            None,
        )
        if at is None:
            break
        pos, turn = at + len(script[turn]), turn + 1
    return turn


@pytest.fixture
def scripted():
    """``scripted(tokenizer, scripts)`` -> a :class:`ScriptedEngine`."""
    return ScriptedEngine
