"""Prompts → the text the model reads: the one place where a chat template is applied.

A prompt is a string or a list of chat messages `{role, content}`. When the tokenizer has a chat
template (and `data.chat_template` is not 'off'), every prompt is rendered with

    tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

a string prompt becoming one user message, and the text is tokenized without adding special
tokens again (the template already holds them). Without a template (the built-in `tiny` model, or
'off') a string prompt is tokenized as it is, with the tokenizer's special tokens, exactly as
before chat support existed.

What a reward model reads for (prompt, answer) is `reward_text`: a string prompt plus the answer; a message
list through the chat template with the answer as the assistant's turn (no generation prompt), or without
a template the message contents and the answer joined by newlines.
"""

from __future__ import annotations

from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from ..errors import ConfigError

Prompt = str | list[dict[str, Any]]


def apply_chat_setting(tokenizer: PreTrainedTokenizerBase, mode: str, model_name: str,
                       system_prompt: str | None = None) -> None:
    """'off' removes the tokenizer's chat template; 'on' requires one; 'auto' keeps what is there. A
    data.system_prompt needs the template that renders it."""
    if mode == "off":
        tokenizer.chat_template = None
    elif mode == "on" and not uses_chat(tokenizer):
        raise ConfigError(f"'data.chat_template' is on but model '{model_name}' has no chat template; use auto or off.")
    if system_prompt is not None and not uses_chat(tokenizer):
        raise ConfigError(f"'data.system_prompt' needs a chat template to render it, and model '{model_name}' has "
                          "none here (or data.chat_template is off); drop the setting or use a chat model.")


def uses_chat(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def as_messages(prompt: Prompt) -> list[dict[str, Any]]:
    """A string prompt is one user message; a message list is returned as is."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def render_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt]) -> tuple[list[str], bool]:
    """(texts, templated): the prompts as the model reads them and whether a chat template was applied."""
    if uses_chat(tokenizer):
        texts = [tokenizer.apply_chat_template(as_messages(p), add_generation_prompt=True, tokenize=False)
                 for p in prompts]
        return texts, True
    if any(not isinstance(p, str) for p in prompts):
        raise ConfigError(
            "The prompts are chat messages but the model has no chat template (or data.chat_template is off); "
            "give string prompts or use a chat model."
        )
    return list(prompts), False


def tokenize_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt], **kwargs: Any) -> Any:
    """`tokenizer(texts, ...)` over the rendered prompts, adding special tokens only to raw text."""
    texts, templated = render_prompts(tokenizer, prompts)
    return tokenizer(texts, add_special_tokens=not templated, **kwargs)


def conversation_text(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]]) -> str:
    """A whole conversation as a reward model reads it: the chat template over it (tokenize=False, no
    generation prompt), or without a template the message contents joined by newlines."""
    if uses_chat(tokenizer):
        return tokenizer.apply_chat_template(list(messages), tokenize=False)
    return "\n".join(m["content"] for m in messages)


def reward_text(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, answer: str) -> str:
    """The text r(x, y) reads: `prompt + answer` for a string prompt; for messages the conversation
    `prompt + [{role: assistant, content: answer}]` (`conversation_text`: the chat template, or the contents,
    then the answer, joined by newlines)."""
    if isinstance(prompt, str):
        return prompt + answer
    return conversation_text(tokenizer, [*prompt, {"role": "assistant", "content": answer}])
