"""Observations → token ids: an environment's text or chat messages rendered once each, bounded in size.

Text is tokenized as it is (inside the model's assistant message); chat messages become new turns of
the chat template by the fixed-base method (SkyRL's ``get_obs_ids_from_obs``, TRL's
``_get_tool_suffix_ids``). A special token's text in an observation stays plain text. The multi-turn
loop (:mod:`lit_rlvr.rollout.turns`) renders each observation inside the environment's timed call.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

from lit_rlvr.envs.base import Observation
from lit_rlvr.rollout.engine import chat_turn_end_ids

MAX_OBSERVATION_MESSAGES = 64
"""The most chat messages of one observation that are rendered; later ones are left out, saying so (the
characters bound alone would let thousands of empty messages through, each a templated turn)."""

_TOOL_CALL_NAME = "name"
_USER_BASE = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "I am a user."},
]


class ObservationRenderer:
    """Environment text or chat messages → token ids, each observation tokenized once (module docstring).

    Args:
        tokenizer: the policy's tokenizer.
        max_chars: characters of one observation in total: its text, or its chat messages' contents together.

    Example:
        >>> from lit_rlvr.demo.tiny import build_char_tokenizer
        >>> tok = build_char_tokenizer()
        >>> r = ObservationRenderer(tok, max_chars=20)
        >>> tok.decode(r.render("=38\\n", last_id=tok("?").input_ids[0]))
        '=38\\n'
        >>> r.cut("x" * 40)
        'xxxxxxxxxxxxxxxxxxxx…(20 more characters)'
        >>> [m["content"] for m in r.bound([{"role": "tool", "content": "y" * 15}] * 3)]
        ['yyyyyyyyyyyyyyy', 'yyyyy…(25 more characters, 1 more message)']
    """

    def __init__(self, tokenizer: Any, max_chars: int = 4000):
        self.tokenizer = tokenizer
        self.max_chars = max_chars
        self.specials = special_texts(tokenizer)
        ends = chat_turn_end_ids(tokenizer)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.turn_end: list[int] = ends or ([eos] if isinstance(eos, int) else [])
        self._bases: dict[str, list[int]] = {}
        self._lock = threading.Lock()  # one render at a time (below)

    def cut(self, text: str) -> str:
        """``text`` cut to ``max_chars`` characters, saying how many were left out."""
        return (
            text
            if len(text) <= self.max_chars
            else f"{text[: self.max_chars]}…({len(text) - self.max_chars} more characters)"
        )

    def bound(self, observation: Observation) -> Observation:
        """``observation`` within ``max_chars`` characters in total, and at most
        :data:`MAX_OBSERVATION_MESSAGES` chat messages.

        Text is cut (:meth:`cut`). Chat messages are kept in order while their contents fit; the first
        one that does not is cut to the characters left (possibly none), ending with a note of how many
        characters (its own and the later messages') and messages were left out; the later messages are
        dropped (the note's own characters are not counted).
        """
        if isinstance(observation, str):
            return self.cut(observation)
        left, kept = self.max_chars, []
        for i, m in enumerate(observation):
            content = m["content"]
            last = i + 1 == MAX_OBSERVATION_MESSAGES and len(observation) > MAX_OBSERVATION_MESSAGES
            if len(content) <= left and not last:
                kept.append(m)
                left -= len(content)
                continue
            chars = max(0, len(content) - left) + sum(len(x["content"]) for x in observation[i + 1 :])
            more = len(observation) - i - 1
            note = f"…({chars} more characters" + (f", {more} more message{'s' * (more != 1)})" if more else ")")
            kept.append({**m, "content": content[:left] + note})
            break
        return kept

    def render(self, observation: Observation, last_id: int | None) -> list[int]:
        """The observation's token ids (within the bounds, :meth:`bound`), to follow a trajectory whose
        last token is ``last_id``.

        The loop renders in the environments' threads; renders take turns (a lock), as a fast
        tokenizer's ``split_special_tokens`` is a switch on the tokenizer shared by every call (one
        thread's plain-text encoding would split another's template tokens).

        Raises:
            ValueError: chat messages, and the tokenizer has no chat template, or its template does not
                render them as a continuation of the conversation (the loop ends the trajectory, ``env_error``).
        """
        if not observation:
            return []
        observation = self.bound(observation)
        with self._lock:
            if isinstance(observation, str):
                return self.encode(observation)
            close = [] if not self.turn_end or last_id == self.turn_end[0] else list(self.turn_end)
            return close + self.chat_turns(observation)

    def forges(self, text: str) -> bool:
        """Whether ``text`` holds a special token's text (``<|im_end|>``, …), which must stay plain text."""
        return any(s in text for s in self.specials)

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids as plain text: a special token's text in it is never the special token."""
        if self.forges(text):
            return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def chat_turns(self, messages: list[Mapping[str, Any]]) -> list[int]:
        """``messages`` as new chat-template turns plus the next assistant header, after a closed turn.

        Rendered after a fixed base conversation cut after its last turn-closing token (SkyRL's and
        TRL's method); a tool message's base ends with an assistant turn calling that tool, as TRL's.
        """
        first = messages[0]
        if first["role"] == "tool":
            call = {"type": "function", "function": {"name": first.get(_TOOL_CALL_NAME, "tool"), "arguments": {}}}
            base = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
        else:
            base = _USER_BASE
        plain = any(isinstance(m.get("content"), str) and self.forges(m["content"]) for m in messages)
        prefix = self._template(base, generation=False, plain_from=len(base) if plain else None)
        if self.turn_end and self.turn_end[0] in prefix:
            prefix = prefix[: len(prefix) - prefix[::-1].index(self.turn_end[0])]
        full = self._template([*base, *messages], generation=True, plain_from=len(base) if plain else None)
        if full[: len(prefix)] != prefix:
            raise ValueError(
                "the chat template does not render new messages as a continuation of the conversation; "
                "return observations as text instead"
            )
        return full[len(prefix) :]

    def _template(
        self, messages: list[Mapping[str, Any]], generation: bool, plain_from: int | None = None
    ) -> list[int]:
        """``messages`` rendered by the chat template and tokenized; with ``plain_from``, the contents of
        the messages from that index on are tokenized as plain text (:meth:`encode`), the template's own
        text around them as the template's (its special tokens kept)."""
        if plain_from is None:
            out = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=generation, tokenize=True, return_dict=False
            )
            return list(out)
        contents: dict[str, str] = {}
        marked = []
        for i, m in enumerate(messages):
            if i >= plain_from and isinstance(m.get("content"), str) and m["content"]:
                mark = f"{_MARK[0]}{i}{_MARK[1]}"
                contents[mark] = m["content"]
                m = {**m, "content": mark}
            marked.append(m)
        text = self.tokenizer.apply_chat_template(marked, add_generation_prompt=generation, tokenize=False)
        ids: list[int] = []
        for piece in re.split(f"({_MARK[0]}\\d+{_MARK[1]})", text):
            if piece in contents:
                ids += self.encode(contents[piece])
            elif piece:
                ids += self.tokenizer(piece, add_special_tokens=False).input_ids
        return ids


_MARK = ("\ue000", "\ue001")  # private-use characters around a content's index while the template renders


def special_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts of ``tokenizer``'s special tokens (``<|im_start|>``, ``<|im_end|>``, …), longest first.

    Example:
        >>> from lit_rlvr.demo.tiny import build_char_tokenizer
        >>> special_texts(build_char_tokenizer())
        ('<bos>', '<eos>', '<pad>', '<unk>')
    """
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = {str(getattr(t, "content", t)) for t in added.values() if getattr(t, "special", True)}
    texts |= {str(t) for t in getattr(tokenizer, "all_special_tokens", ()) or ()}
    return tuple(sorted((t for t in texts if t), key=lambda t: (-len(t), t)))
