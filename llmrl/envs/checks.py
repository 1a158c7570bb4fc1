"""What an environment hands llmrl, checked once where it arrives (docs/environments.md, docs/errors.md).

    construction   spec.make() with no argument                       → an object (one per episode)
    tools()        None, or a list of JSON tool schemas               {"type": "function", "function":
                                                                        {"name": str, "parameters": {...}}}
    reset(row, s)  a non-empty list of messages                       {role: str, content: str, ...}
    step(text, c)  an EnvStep: messages a list of such messages, reward a real number (not a bool) within
                   float32's finite range, done a bool, tool_calls and tool_errors whole numbers with
                   0 ≤ tool_errors ≤ tool_calls
    a tool's result (ToolEnv)  a str as it is; None, a bool, a finite number, or a list/tuple/dict of them
                   written as JSON (what `json.dumps(result, allow_nan=False)` writes); anything else (a set,
                   bytes, NaN, an object) refused

A value outside its contract is a `PluginError`: one sentence naming the environment (its `rollout.env`
name), what it returned, for which episode and turn, and what was expected. Found before the first
step (construction, tools(): `preflight`), it exits 2; during a run, 1 after a checkpoint.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

from ..errors import PluginError, shown
from .base import EnvSpec, EnvStep, Message

F32_MAX = 3.4028234663852886e38  # float32's largest finite value: rewards are float32 tensors
MESSAGE = "a {role: str, content: str} message"
SCHEMA = "{'type': 'function', 'function': {'name': str, 'parameters': {...}}}"
JSON_VALUES = "a str, or a JSON value (None, a bool, a finite number, or a list or dict of them), written as JSON"


def build(spec: EnvSpec, episode: int | None = None) -> Any:
    """One environment object, `spec.make()`; a constructor that raises is named (before the first step:
    `episode` None, exit 2)."""
    try:
        return spec.make()
    except Exception as exc:  # the user's constructor: one sentence, never a traceback
        text = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else ""
        why = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        where = "" if episode is None else f" (episode {episode})"
        hint = ("; llmrl builds one object per episode with no argument, so its constructor must take none "
                "(give the others defaults)") if isinstance(exc, TypeError) else ""
        raise PluginError(f"Environment '{spec.name}' cannot be built with no argument: {why}{where}{hint}.",
                          exit_code=2 if episode is None else None) from None


def preflight(spec: EnvSpec) -> None:
    """Before the run folder is made: build one environment and check what its tools() returns (exit 2)."""
    env = build(spec)
    check_tools(spec.name, call_tools(spec.name, env, before=True), before=True)


def call_tools(name: str, env: Any, before: bool = False, episode: int | None = None) -> Any:
    """What `env.tools()` returns (None when the class has no `tools`); raising is named like a bad value
    (exit 2 when `before`, as `check_tools`)."""
    tools = getattr(env, "tools", None)
    if not callable(tools):
        return None
    try:
        return tools()
    except Exception as exc:  # the user's tools(): one sentence, never a traceback
        text = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else ""
        where = f" (episode {episode})" if episode is not None else ""
        raise PluginError(f"Environment '{name}' raised {type(exc).__name__} in tools(){where}"
                          f"{': ' + text if text else ''}.", exit_code=2 if before else None) from None


def check_tools(name: str, tools: Any, before: bool = False, episode: int | None = None) -> list[dict[str, Any]] | None:
    """`tools` as the chat template's `tools=` (None for none), or a PluginError (exit 2 when `before`)."""
    code = 2 if before else None
    where = f" (episode {episode})" if episode is not None else ""
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)):
        raise PluginError(f"Environment '{name}' returned {shown(tools)} from tools(){where}; tools() returns None or "
                          f"a list of tool schemas, each {SCHEMA}.", exit_code=code)
    for i, schema in enumerate(tools):
        fn = schema.get("function") if isinstance(schema, dict) else None
        ok = (isinstance(fn, dict) and schema.get("type", "function") == "function"
              and isinstance(fn.get("name"), str) and fn["name"].strip() != ""
              and isinstance(fn.get("parameters", {}), dict) and isinstance(fn.get("description", ""), str))
        if not ok:
            raise PluginError(f"Environment '{name}' returned from tools(){where} a list whose item {i} is "
                              f"{_brief(schema)}, not a tool schema {SCHEMA}.", exit_code=code)
    try:
        json.dumps(list(tools), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"Environment '{name}' returned tool schemas from tools(){where} that are not JSON "
                          f"({exc}); the chat template writes them as JSON.", exit_code=code) from None
    return list(tools)


def check_opening(name: str, messages: Any, episode: int, before: bool = False) -> list[Message]:
    """What reset returned: a non-empty list of {role: str, content: str} messages (exit 2 when `before`:
    the run's setup sizes every prompt from its opening, `run/session.py`)."""
    bad, item = _bad_messages(messages, allow_empty=False)
    code = 2 if before else None
    if item is not None:
        raise PluginError(f"Environment '{name}' returned from reset (episode {episode}) a list whose item {item} is "
                          f"{bad}, not {MESSAGE}.", exit_code=code)
    if bad is not None:
        raise PluginError(f"Environment '{name}' returned {bad} from reset (episode {episode}), not a non-empty list "
                          f"of {{role: str, content: str}} messages.", exit_code=code)
    return list(messages)


def check_step(name: str, out: Any, episode: int, turn: int) -> EnvStep:
    """What step returned: an EnvStep whose fields hold what the module docstring says."""
    at = f"(episode {episode}, turn {turn})"
    if not isinstance(out, EnvStep):
        raise PluginError(f"Environment '{name}' returned a {type(out).__name__} from step, not an EnvStep {at}.")
    bad, item = _bad_messages(out.messages, allow_empty=True)
    if item is not None:
        raise PluginError(f"Environment '{name}' returned from step {at} messages whose item {item} is {bad}, not "
                          f"{MESSAGE}.")
    if bad is not None:
        raise PluginError(f"Environment '{name}' returned EnvStep(messages={bad}) from step {at}; messages is a list "
                          f"of {{role: str, content: str}} messages.")
    r = out.reward
    if isinstance(r, bool) or not isinstance(r, numbers.Real) or not math.isfinite(r) or abs(r) > F32_MAX:
        raise PluginError(f"Environment '{name}' returned the reward {_reward(r)} from step {at}; a reward is a finite "
                          f"number within float32's range (|r| ≤ {F32_MAX:.4g}).")
    if not isinstance(out.done, bool) and type(out.done).__name__ != "bool_":  # numpy's bool too
        raise PluginError(f"Environment '{name}' returned done={_brief(out.done)} from step {at}; done is True or False.")
    counts = (out.tool_calls, out.tool_errors)
    if any(isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 0 for c in counts) or counts[1] > counts[0]:
        raise PluginError(f"Environment '{name}' returned tool_calls={_brief(counts[0])}, tool_errors={_brief(counts[1])} "
                          f"from step {at}; both are whole numbers ≥ 0, tool_errors ≤ tool_calls.")
    return out


def tool_text(tool: str, result: Any) -> str:
    """A tool's result as the message content: a str as it is, a JSON value as JSON (module docstring);
    anything else a PluginError naming the tool (the episode and environment are added by the caller)."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, allow_nan=False)
    except (TypeError, ValueError):
        raise PluginError(f"Tool '{tool}' returned {shown(result)}; a tool returns {JSON_VALUES}.") from None


def _bad_messages(messages: Any, allow_empty: bool) -> tuple[str | None, int | None]:
    """(None, None) when `messages` is a list of {role: str, content: str} mappings (non-empty unless
    `allow_empty`); else (what is wrong, None) for the whole value, or (the item, its index) for an item."""
    if not isinstance(messages, list):
        return shown(messages), None
    if not messages and not allow_empty:
        return "an empty list", None
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            return _brief(m), i
    return None, None


def _brief(value: Any, limit: int = 80) -> str:
    """repr(value), cut at `limit` characters."""
    try:
        text = " ".join(repr(value).split())  # one line: a tensor's or a user object's repr may span several
    except Exception:  # a user's object whose repr raises
        return shown(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _reward(r: Any) -> str:
    if isinstance(r, float) and not math.isnan(r) and not math.isinf(r):
        return f"{r:g}"
    return _brief(r) if isinstance(r, (numbers.Number, str)) else shown(r)
