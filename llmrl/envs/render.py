"""An episode's messages → token ids, without ever re-tokenizing what the model sampled.

    prompt     apply_chat_template(opening messages, tools=…, add_generation_prompt=True) → ids; a template
               that ignores `tools=` (SmolLM2's, Llama 2's) gets them from a system message instead, in
               the Hermes format the calls are parsed in (`with_tool_instructions`)
    env turn   the environment's messages rendered in the template's turn format and tokenized alone:
               the text the template puts after an assistant turn's stop token (e.g. Qwen's '\n' after
               <|im_end|>) + the messages' turns + the next assistant header; appended as they are

The env turn's text is found by rendering a fixed two-turn conversation with and without the new
messages: the difference is what the template adds, and the template must render conversations
append-only (its rendering of the shorter one is a prefix of the longer one's), else the run is
refused. Without a chat template (the built-in tiny model) the prompt is tokenized as a plain
prompt is, and an env turn is its messages' contents, joined, tokenized alone without specials.
"""

from __future__ import annotations

from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from ..errors import ConfigError
from ..models.prompts import tokenize_prompts, uses_chat
from .base import Message

_PROBE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "\x00probe\x00"}]
_TOOL_PROBE = [{"type": "function", "function": {"name": "llmrl_probe_tool_7f3a", "description": "", "parameters": {}}}]
PLAIN_INSTRUCTIONS = (
    "You have a calculator-style tool, {name}: {description} To use it, reply with its input alone, ending "
    "in '=' (for example: {example}=), and it answers with the result. Any other reply is your final answer."
)
TOOL_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to help with the user's request. Their signatures are "
    "within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\nFor each call, write a JSON object with "
    "the function's name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def template_shows_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template renders `tools=` at all (a probe schema's name appears in its text)."""
    text = tokenizer.apply_chat_template(_PROBE[:1], tools=_TOOL_PROBE, add_generation_prompt=True, tokenize=False)
    return "llmrl_probe_tool_7f3a" in text


def with_tool_instructions(messages: list[Message], tools: Sequence[dict[str, Any]], fmt: str = "hermes") -> list[Message]:
    """The messages with the tools described in a system message — Hermes: the schemas and the call format,
    as Qwen2.5's template writes them; plain: the only tool and 'reply with its input ending in =' —
    merged into a leading system message when there is one."""
    import json

    if fmt == "plain":
        fn = tools[0].get("function", tools[0])
        note = PLAIN_INSTRUCTIONS.format(name=fn.get("name", "tool"), description=fn.get("description", "").strip(),
                                         example="12*34")
    else:
        note = TOOL_INSTRUCTIONS.format(schemas="\n".join(json.dumps(t) for t in tools))
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


def call_format(tokenizer: PreTrainedTokenizerBase, setting: str = "auto") -> str:
    """The tool-call format a model writes (envs/tools.py): `setting` (rollout.tool_format) when it names
    one, else 'hermes' with a chat template and 'plain' without. 'json' is offered as 'hermes' is (the
    template's `tools=`); only the parsing of the model's turns differs."""
    if setting != "auto":
        return setting
    return "hermes" if uses_chat(tokenizer) else "plain"


def prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: Sequence[dict[str, Any]] | None,
               fmt: str | None = None) -> list[int]:
    """The episode's prompt ids: the chat template with `tools=` (or, where it ignores them, with the
    tools in a system message), or a plain prompt's tokens. `fmt` 'plain' with a chat template: the
    tools are explained in a system message and not passed to the template (whose own words would ask
    for JSON calls)."""
    if not uses_chat(tokenizer):
        if len(messages) != 1 or messages[0].get("role") != "user":
            raise ConfigError("Without a chat template an episode opens with one user message; use a chat model.")
        return list(tokenize_prompts(tokenizer, [messages[0]["content"]]).input_ids[0])
    if tools and fmt == "plain":
        messages, tools = with_tool_instructions(messages, tools, "plain"), None
    elif tools and not template_shows_tools(tokenizer):
        messages = with_tool_instructions(messages, tools)
    text = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def env_turn_text(tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: Sequence[dict[str, Any]] | None,
                  stop_text: str) -> str:
    """The text that follows an assistant turn ending in `stop_text` when the environment answers with
    `messages` and the assistant speaks next (see the module docstring)."""
    if not uses_chat(tokenizer):
        return "".join(str(m.get("content", "")) for m in messages)
    before = tokenizer.apply_chat_template(_PROBE, tools=tools or None, tokenize=False)
    after = tokenizer.apply_chat_template(_PROBE + list(messages), tools=tools or None, add_generation_prompt=True,
                                          tokenize=False)
    if not after.startswith(before):
        raise ConfigError("The model's chat template does not render a conversation append-only (an earlier turn "
                          "changes when a message is added), so an episode's tokens cannot be extended turn by turn.")
    tail = before[before.rindex(_PROBE[1]["content"]) + len(_PROBE[1]["content"]):]  # what closes an assistant turn
    cut = tail.find(stop_text) if stop_text else -1
    return (tail[cut + len(stop_text):] if cut >= 0 else tail) + after[len(before):]


def env_turn_ids(tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: Sequence[dict[str, Any]] | None,
                 stop_text: str) -> list[int]:
    """`env_turn_text` tokenized alone, without special tokens added."""
    return list(tokenizer(env_turn_text(tokenizer, messages, tools, stop_text), add_special_tokens=False).input_ids)
