"""Turning a prompt row into model input token ids: the one place prompt text is built.

The DataModule (training and validation) and the reference-cache builder both call
:func:`encode_prompt`, so the cached π_ref samples are conditioned on exactly the prompts the
policy later sees. With a chat template the row becomes ``[system?, user]`` messages plus the
generation prompt; without one (base models, the tiny char-level model) a plain template is used.

A conversational row (``prompt`` a list of messages: TRL's conversational format, verl's parquet)
keeps its messages: the instruction template formats the last user message (``{prompt}`` is its
text), the system prompt is added only when the conversation has none, and the chat template
renders it all, as TRL's ``apply_chat_template`` does. Without a chat template a conversation of
one user message (after an optional system message) takes the plain template.

TRL templates conversational prompts only: a *standard* (text) prompt goes to the tokenizer as it
is. Rows of the ``trl`` adapter follow TRL (``raw_text``): unless ``use_chat_template`` or ``tools``
is set, their text prompts are the instruction-formatted text alone, tokenized with the tokenizer's
special tokens, as ``tokenizer(text=prompt)`` in TRL's ``GRPOTrainer``.

A multi-turn run with a TRL environment (``model.environment``, docs/agents.md) lists its tools in
the prompt as TRL's ``GRPOTrainer(environment_factory=...)`` does: ``tools`` names the class, whose
public methods (but ``reset`` and ``get_reward``) go to the chat template as ``tools=``. Unlike
TRL, which renders tools for conversational prompts only, a text prompt with ``tools`` is rendered
by the chat template too (as a user message), so the model sees its tools with every adapter; a
prompt no chat template renders (none, or ``use_chat_template: false``) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lit_rlvr.envs.trl import tool_methods
from lit_rlvr.plugins import load_function


@dataclass(frozen=True)
class PromptFormat:
    """How a row's problem text becomes the model's input.

    Args:
        instruction: the user message, a ``str.format`` template over the row's fields
            (``{prompt}`` is the problem text); literal braces are doubled (``\\\\boxed{{}}``).
        system_prompt: an optional system message.
        use_chat_template: True/False forces it; None uses the chat template when the tokenizer
            has one, except for the text prompts of TRL-format data (the ``trl`` adapter), which
            go to the tokenizer as they are, as TRL sends them (TRL templates conversational
            prompts only), unless ``tools`` lists tools, which only the chat template shows.
        plain_template: used without a chat template; ``{system}`` is the system prompt plus a
            blank line (or empty) and ``{user}`` the formatted instruction.
        tools: the import path of a TRL environment class (``pkg.mod:Class``, ``file.py:Class``;
            the one ``model.environment`` runs) whose tools the chat template lists, as TRL renders
            its prompts (``apply_chat_template(..., tools=...)``); None: no tools. Needs the chat
            template, with every adapter: TRL-format text prompts are rendered with it too (TRL sends
            them as they are, without the tools, so its model never sees them).
    """

    instruction: str = "{prompt}"
    system_prompt: str | None = None
    use_chat_template: bool | None = None
    plain_template: str = "{system}{user}\n"
    tools: str | None = None

    def __post_init__(self):
        if self.tools is not None:
            environment_tools(self.tools)  # importable, and has tools: checked now

    def text(self, row: dict, tokenizer, raw_text: bool = False) -> tuple[str, bool]:
        """The prompt string and whether it came from the chat template (then it holds BOS itself).

        Args:
            row: the prompt row.
            tokenizer: the policy's tokenizer.
            raw_text: a text prompt is the model's input as it is (TRL's standard prompts), unless
                :attr:`use_chat_template` or :attr:`tools` is set; a conversation is unaffected.
        """
        if (
            raw_text
            and self.use_chat_template is None
            and self.tools is None
            and not isinstance(row.get("prompt"), list)
        ):
            if self.system_prompt:
                raise ValueError(
                    f"row {row.get('id')!r}: data.prompt.system_prompt with a text prompt of TRL-format data, which "
                    "TRL sends as it is; set data.prompt.use_chat_template to true (the chat template) or false "
                    "(the plain layout) to add it"
                )
            return self._instruction(row), False
        messages = self.messages(row)
        has_template = getattr(tokenizer, "chat_template", None) is not None
        if self.use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        if self.use_chat_template if self.use_chat_template is not None else has_template:
            tools = {"tools": environment_tools(self.tools)} if self.tools is not None else {}
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **tools), True
        if self.tools is not None:
            raise ValueError(
                f"data.prompt.tools lists {self.tools!r}'s tools in the chat template, but row {row.get('id')!r} is not "
                "rendered with one (a tokenizer without a chat template, or use_chat_template: false)"
            )
        system = [m["content"] for m in messages if m["role"] == "system"]
        turns = [m for m in messages if m["role"] != "system"]
        if len(system) > 1 or len(turns) != 1 or turns[0]["role"] != "user":
            raise ValueError(
                f"row {row.get('id')!r}: a conversation of {[m['role'] for m in messages]} needs a chat template; "
                "without one only [system?, user] can be written as plain text"
            )
        return self.plain_template.format(system=f"{system[0]}\n\n" if system else "", user=turns[0]["content"]), False

    def messages(self, row: dict) -> list[dict]:
        """The row as chat messages: ``[system?, user]`` from the templates, or a conversational
        row's own messages with the instruction applied to its last user message.

        Example:
            >>> fmt = PromptFormat(instruction="{prompt} Think step by step.", system_prompt="Be brief.")
            >>> fmt.messages({"prompt": "2+2?"})
            [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '2+2? Think step by step.'}]
            >>> fmt.messages({"prompt": [{"role": "system", "content": "Hi."}, {"role": "user", "content": "2+2?"}]})
            [{'role': 'system', 'content': 'Hi.'}, {'role': 'user', 'content': '2+2? Think step by step.'}]
        """
        prompt = row.get("prompt")
        if not isinstance(prompt, list):
            system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            return system + [{"role": "user", "content": self._instruction(row)}]
        messages = [dict(m) for m in prompt]
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
        if last_user is not None:
            messages[last_user]["content"] = self._instruction({**row, "prompt": messages[last_user]["content"]})
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def _instruction(self, row: dict) -> str:
        try:
            return self.instruction.format(**row)
        except KeyError as e:
            raise ValueError(
                f"instruction template {self.instruction!r} uses field {e.args[0]!r}, which row "
                f"{row.get('id')!r} does not have (fields: {sorted(row)})"
            ) from None


def encode_prompt(row: dict, tokenizer, fmt: PromptFormat = PromptFormat(), raw_text: bool = False) -> list[int]:
    """Token ids of a row's prompt under ``fmt`` (``raw_text``: :meth:`PromptFormat.text`, TRL-format data).

    Example:
        >>> from lit_rlvr.demo.tiny import build_char_tokenizer
        >>> tok = build_char_tokenizer("0123456789+=?\\n")
        >>> ids = encode_prompt({"prompt": "1+1=?"}, tok, PromptFormat(instruction="{prompt}"))
        >>> tok.decode(ids), tok.decode(encode_prompt({"prompt": "1+1=?"}, tok, raw_text=True))
        ('1+1=?\\n', '1+1=?')
    """
    text, templated = fmt.text(row, tokenizer, raw_text)
    return list(tokenizer(text, add_special_tokens=not templated).input_ids)


@lru_cache(maxsize=16)
def environment_tools(path: str) -> list[Any]:
    """The tools of the TRL environment class at ``path`` as TRL passes them to the chat template: the
    bound public methods (but ``reset`` and ``get_reward``) of one instance.

    Raises:
        ValueError: the class has no tool.
    """
    cls = load_function(path, "data.prompt.tools")
    tools = list(tool_methods(cls()).values())
    if not tools:
        raise ValueError(
            f"data.prompt.tools: {path!r} has no public method besides reset and get_reward, so no tool to list"
        )
    return tools
