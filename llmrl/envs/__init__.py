"""Environments: episodes of several turns (base.py: the interface, the registry), tools as the
simplest environment (tools.py), the built-in calculator (calculator.py) and guessing game
(guess.py), and the token ids of an episode's turns (render.py). docs/environments.md."""

from . import calculator, guess  # noqa: F401  (registers the built-in environments)
from .base import ENVS, EnvSpec, EnvStep, Environment, ToolCall, offered_tools, register_env, resolve_env
from .render import call_format, env_turn_ids, env_turn_text, prompt_ids
from .tools import ToolEnv, parse_calls, run_with_limit

__all__ = ["ENVS", "EnvSpec", "EnvStep", "Environment", "ToolCall", "ToolEnv", "call_format", "env_turn_ids",
           "env_turn_text", "offered_tools", "parse_calls", "prompt_ids", "register_env", "resolve_env",
           "run_with_limit"]
