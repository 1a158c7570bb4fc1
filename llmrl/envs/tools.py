"""Tools as the simplest environment: plain Python functions offered to the model, calls parsed
from its turns, each run under a time limit.

A tool is a function with type hints and a Google-style docstring; its JSON schema is what
`transformers.utils.get_json_schema` makes of it, offered through the chat template's `tools=`.
Two call formats are parsed (`parse_calls`):

    hermes  <tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>
            (Hermes / Qwen2.5 / Qwen3 templates; several blocks per turn allowed)
    json    the Hermes blocks, and in a turn without one every JSON object with a string "name" and an
            "arguments" object, bare or in a ```json fence: {"name": "calculator", "arguments": {…}}.
            What Qwen2.5-Coder-0.5B-Instruct writes when a template offers it tools (0 of its calls in
            the tags; docs/environments.md), as some servers' tool parsers accept; an object without
            those two keys (an answer that is JSON) is no call
    plain   a turn whose text ends with '=' calls the environment's only tool with the text before
            it as the tool's first argument: '347*28=' → calculator('347*28'). The built-in tiny
            model's character tokenizer has no letters, so it cannot write a tool name or JSON.

A malformed call (bad JSON, no name, unknown tool, wrong arguments), a tool that raises and a
tool that outlives `timeout_s` are the model's mistake: the environment answers with one sentence
saying so (counted in `tool_errors`) and the episode goes on. A tool's result becomes the message's
content by one rule (`checks.tool_text`): a str as it is; None, a bool, a finite number, or a list or
dict of them as JSON; anything else (a set, bytes, NaN, an object) is the tool's own mistake and stops
the run, naming the tool. A timed-out call's thread is left to
finish on its own (a Python thread cannot be killed); its result is dropped.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable, Sequence

from transformers.utils import get_json_schema

from ..errors import PluginError, plugin_name
from .base import EnvStep, Message, ToolCall
from .checks import tool_text

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
FORMATS = ("hermes", "json", "plain")


def parse_calls(text: str, fmt: str) -> list[ToolCall]:
    """The tool calls of one assistant turn's text in format `fmt` ([] when it makes none)."""
    if fmt == "plain":
        body = text.strip()
        return [ToolCall("", {"": body[:-1].strip()})] if body.endswith("=") else []
    if fmt not in ("hermes", "json"):
        raise ValueError(f"unknown tool-call format '{fmt}'; valid: {', '.join(FORMATS)}")
    calls = _hermes_calls(text)
    return calls if calls or fmt == "hermes" else _json_calls(text)


def _json_calls(text: str) -> list[ToolCall]:
    """Every top-level JSON object of `text` (bare, or inside a ```json fence) that names a tool: a str
    "name" and an "arguments" object (or a JSON string of one); objects inside one are not looked at
    again. Scanned left to right with `json.JSONDecoder.raw_decode` from each '{'."""
    decoder, calls, at = json.JSONDecoder(), [], text.find("{")
    while at >= 0:
        try:
            obj, end = decoder.raw_decode(text, at)
        except ValueError:
            at = text.find("{", at + 1)
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and "arguments" in obj:
            calls.append(_call(obj))
        at = text.find("{", end)
    return calls


def _call(obj: dict[str, Any]) -> ToolCall:
    """A decoded call object {"name": str, "arguments": …} → a ToolCall (arguments that are a JSON string
    are decoded; arguments that are no object make an error call)."""
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            pass
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error='the tool call\'s "arguments" is not an object')
    return ToolCall(obj["name"], args)


def _hermes_calls(text: str) -> list[ToolCall]:
    """The calls of the <tool_call>{json}</tool_call> blocks of `text` (a block that is no call object is
    an error call; a block opened and never closed is one)."""
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            obj = json.loads(block)
        except ValueError as exc:
            calls.append(ToolCall("", error=f"the tool call is not valid JSON ({exc})"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCall("", error='the tool call has no "name"'))
            continue
        calls.append(_call(obj))
    if not calls and "<tool_call>" in text:  # opened, never closed
        calls.append(ToolCall("", error="the tool call has no closing </tool_call>"))
    return calls


def run_with_limit(fn: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float) -> tuple[Any, str | None]:
    """(result, None), or (None, why it failed): `fn(**kwargs)` in a daemon thread, waited on for at
    most `timeout_s` seconds. A `PluginError` (a value refused inside `fn`: a tool's result inside an
    environment's step) is raised again here, in the caller's thread."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["result"] = fn(**kwargs)
        except PluginError as exc:
            box["plugin"] = exc
        except Exception as exc:  # the tool's own failure is reported to the model
            box["error"] = f"{type(exc).__name__}: {exc}"

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return None, f"took longer than {timeout_s:g} s"
    if "plugin" in box:
        raise box["plugin"]
    if "error" in box:
        return None, f"raised {box['error']}"
    return box.get("result"), None


class ToolEnv:
    """An environment of tools: every turn's calls are run and their results returned as `tool`
    messages; a turn without a call is the answer and ends the episode (reward 0: the task's reward
    scores the answer). One object per episode."""

    def __init__(self, tools: Sequence[Callable[..., Any]], timeout_s: float = 5.0) -> None:
        self.fns = {fn.__name__: fn for fn in tools}
        self.schemas = [get_json_schema(fn) for fn in tools]
        self.timeout_s = timeout_s

    def tools(self) -> list[dict[str, Any]]:
        return self.schemas

    def reset(self, row: dict[str, Any], seed: int) -> list[Message]:
        prompt = row["prompt"]
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)

    def step(self, text: str, calls: list[ToolCall]) -> EnvStep:
        if not calls:
            return EnvStep(done=True)
        messages, errors = [], 0
        for call in calls:
            name, content = self._run(call)
            errors += content.startswith("Error:")
            messages.append({"role": "tool", "name": name, "content": content})
        return EnvStep(messages, 0.0, False, len(calls), errors)

    def _run(self, call: ToolCall) -> tuple[str, str]:
        """(the tool's name, its result or 'Error: …') for one call."""
        if call.error is not None:
            return call.name or "?", f"Error: {call.error}."
        if call.name == "" and "" in call.arguments:  # the plain format: the only tool, its first parameter
            if len(self.fns) != 1:
                return "?", "Error: the plain call format needs an environment with exactly one tool."
            fn = next(iter(self.fns.values()))
            first = next(iter(self.schemas[0]["function"]["parameters"].get("properties", {})), None)
            if first is None:
                return fn.__name__, "Error: the tool takes no argument."
            kwargs = {first: call.arguments[""]}
        elif call.name not in self.fns:
            return call.name, f"Error: there is no tool '{call.name}'; tools: {', '.join(self.fns)}."
        else:
            fn, kwargs = self.fns[call.name], call.arguments
        schema = next(s for s in self.schemas if s["function"]["name"] == fn.__name__)
        params = schema["function"]["parameters"]
        unknown = [k for k in kwargs if k not in params.get("properties", {})]
        missing = [k for k in params.get("required", []) if k not in kwargs]
        if unknown or missing:
            what = f"unknown argument {unknown[0]!r}" if unknown else f"missing argument {missing[0]!r}"
            return fn.__name__, f"Error: {fn.__name__} was called with {what}."
        result, error = run_with_limit(fn, kwargs, self.timeout_s)
        if error is not None:
            return fn.__name__, f"Error: {fn.__name__} {error}."
        return fn.__name__, tool_text(plugin_name(fn), result)
