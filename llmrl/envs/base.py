"""The environment interface and its registry (`rollout.env` names one; a task may bring its own).

An episode starts from a dataset row and alternates turns until it ends:

    messages = env.reset(row, seed)                       # the episode's opening messages (the prompt)
    repeat:  assistant turn ← the policy samples it
             out = env.step(assistant_text, calls)        # calls: the tool calls parsed from the turn
             out.messages are appended (their tokens are context, never trained), out.reward is summed
    until    out.done, rollout.max_turns turns, or rollout.max_episode_tokens response tokens

One environment object serves one episode (`make()` builds a fresh one per episode), so it may
keep whatever state the episode needs. `seed` is the row's game key: the same for the G episodes of a
row in a step (they play one game, and a group estimator compares like with like), another for each
row and step, and for evaluation a key no training step uses (step/episodes.game_keys); a class that
sets `seed_per_episode = True` gets each episode's own sampling key instead. A user's environment is a class named like a reward
function, `module:Class` or `path/to/file.py:Class` (rewards/resolve.py loads it); its constructor
takes no argument.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..errors import ConfigError
from ..rewards.resolve import load_target

Message = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from an assistant turn (envs/tools.py).

    name       the tool's name ('' in the plain format: the environment's only tool)
    arguments  keyword arguments of the call (the plain format: {'': text})
    error      why the call could not be parsed (a malformed call is the model's mistake: the
               environment answers with it); None for a well-formed call
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class EnvStep:
    """What an environment answers to one assistant turn.

    messages     chat messages {role, content} appended after the turn (context tokens); [] when done
    reward       this turn's reward, summed over the episode into the episode's score
    done         the episode ends here
    tool_calls   tool calls the turn made; tool_errors: how many of them failed (malformed, unknown
                 tool, raised, timed out)
    """

    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    tool_calls: int = 0
    tool_errors: int = 0


class Environment(Protocol):
    """What an episode needs from an environment (one object per episode)."""

    def tools(self) -> list[dict[str, Any]] | None:
        """The JSON schemas offered through the chat template's `tools=`; None: no tools."""
        ...

    def reset(self, row: dict[str, Any], seed: int) -> list[Message]:
        """The episode's opening messages for this dataset row (`seed`: the row's game key, see above)."""
        ...

    def step(self, text: str, calls: list[ToolCall]) -> EnvStep:
        """Answer one assistant turn (`text` without special tokens; `calls` parsed from it)."""
        ...


EnvFactory = Callable[[], Environment]


@dataclass(frozen=True)
class EnvSpec:
    """A resolved environment: its name and how to build one per episode."""

    name: str
    make: EnvFactory


ENVS: dict[str, Callable[..., Environment]] = {}


def register_env(name: str) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    """Decorator: register an environment class (or factory) under `name`. A duplicate is an error."""

    def wrap(factory: Callable[..., Environment]) -> Callable[..., Environment]:
        if name in ENVS:
            raise ValueError(f"environment '{name}' is already registered")
        ENVS[name] = factory
        return factory

    return wrap


# a name's prefix → "module:function" of the adapter that resolves such names to an EnvSpec, looked up
# by name and imported only when a name asks for it (the adapter imports this module, not the reverse)
ADAPTERS: dict[str, str] = {"ta:": "llmrl.envs.textarena:env_spec"}  # a TextArena game


def resolve_env(name: str, **options: Any) -> EnvSpec:
    """The environment `name` names: a built-in (`ENVS`), a TextArena game `ta:ENV_ID`, `module:Class` or
    `file.py:Class`.
    `options` reach a built-in's constructor (e.g. the tools' time limit); a user's class takes none."""
    if name in ENVS:
        factory = ENVS[name]
        return EnvSpec(name, lambda: factory(**options))
    for prefix, adapter in ADAPTERS.items():
        if name.startswith(prefix):
            module, _, function = adapter.partition(":")
            return getattr(importlib.import_module(module), function)(name)
    target, sep, attr = name.rpartition(":")
    if not sep or not target or not attr:
        raise ConfigError(f"Environment '{name}' is not a built-in ({', '.join(sorted(ENVS))}), a TextArena game "
                          "'ta:ENV_ID', a 'module:Class' or a 'file.py:Class'.")
    cls = getattr(load_target(target, "environment"), attr, None)
    if cls is None or not callable(cls):
        raise ConfigError(f"Environment '{name}': '{target}' has no class '{attr}'.")
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigError(f"Environment '{name}' has no {' or '.join(missing)} method; an environment defines "
                          "reset(row, seed) and step(text, calls).")
    return EnvSpec(name, cls)


def offered_tools(env: Environment) -> list[dict[str, Any]] | None:
    """The environment's tool schemas, or None (a user's class need not define `tools`)."""
    tools = getattr(env, "tools", None)
    return tools() if callable(tools) else None
