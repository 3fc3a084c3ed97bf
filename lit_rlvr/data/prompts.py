"""Turning a prompt row into model input token ids: the one place prompt text is built.

The DataModule (training and validation) and the reference-cache builder both call
:func:`encode_prompt`, so the cached π_ref samples are conditioned on exactly the prompts the
policy later sees. With a chat template the row becomes ``[system?, user]`` messages plus the
generation prompt; without one (base models, the tiny char-level model) a plain template is used.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptFormat:
    """How a row's problem text becomes the model's input.

    Args:
        instruction: the user message, a ``str.format`` template over the row's fields
            (``{prompt}`` is the problem text); literal braces are doubled (``\\\\boxed{{}}``).
        system_prompt: an optional system message.
        use_chat_template: True/False forces it; None uses the chat template when the tokenizer
            has one.
        plain_template: used without a chat template; ``{system}`` is the system prompt plus a
            blank line (or empty) and ``{user}`` the formatted instruction.
    """

    instruction: str = "{prompt}"
    system_prompt: str | None = None
    use_chat_template: bool | None = None
    plain_template: str = "{system}{user}\n"

    def text(self, row: dict, tokenizer) -> tuple[str, bool]:
        """The prompt string and whether it came from the chat template (then it holds BOS itself)."""
        try:
            user = self.instruction.format(**row)
        except KeyError as e:
            raise ValueError(
                f"instruction template {self.instruction!r} uses field {e.args[0]!r}, which row "
                f"{row.get('id')!r} does not have (fields: {sorted(row)})"
            ) from None
        has_template = getattr(tokenizer, "chat_template", None) is not None
        if self.use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        if self.use_chat_template if self.use_chat_template is not None else has_template:
            messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
                {"role": "user", "content": user}
            ]
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), True
        system = f"{self.system_prompt}\n\n" if self.system_prompt else ""
        return self.plain_template.format(system=system, user=user), False


def encode_prompt(row: dict, tokenizer, fmt: PromptFormat = PromptFormat()) -> list[int]:
    """Token ids of a row's prompt under ``fmt``.

    Example:
        >>> from lit_rlvr.demo.tiny import build_char_tokenizer
        >>> tok = build_char_tokenizer("0123456789+=?\\n")
        >>> ids = encode_prompt({"prompt": "1+1=?"}, tok, PromptFormat(instruction="{prompt}"))
        >>> tok.decode(ids)
        '1+1=?\\n'
    """
    text, templated = fmt.text(row, tokenizer)
    return list(tokenizer(text, add_special_tokens=not templated).input_ids)
