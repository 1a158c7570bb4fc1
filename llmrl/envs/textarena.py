"""TextArena's single-player games, unchanged, as llmrl environments: `--task ta:ENV_ID`.

TextArena (`pip install 'llmrl[textarena]'`) ships about a hundred text games (GuessTheNumber-v0,
Wordle-v0, Hangman-v0, TowerOfHanoi-v0, …) behind one interface:

    env = textarena.make(env_id)          # the '-raw' registration: no observation wrappers
    env.reset(num_players=1, seed=s)      # the game is fixed by s (TextArena seeds `random` with it)
    player, observation = env.get_observation()     # the messages since the player last acted
    done, info = env.step(action_text)
    rewards, game_info = env.close()      # at the end: {player: reward}

`TextArenaEnv` plays one game per episode: `reset` opens it with the row's `ta_seed`, or on a row
without one (`--env ta:…` on another task's rows) with the row's game key (so the G episodes of a row
play the same game either way: a group estimator compares like with like), its opening
messages are the prompt; `step` sends the assistant turn's text as the action and answers with the
game's messages since (the player's own action, which TextArena echoes back, is left out: it is
already in the episode as the model's tokens). When the game is over the episode ends with the
game's reward for the player (`close()`), e.g. GuessTheNumber: 1 for a win, the closeness of the
last guess otherwise. An episode that llmrl ends first (rollout.max_turns, the token budget) earns
no reward from the game.

TextArena seeds Python's global `random` in `reset` and draws from it during the game. Each game
here runs on its own `random` state, swapped in for its calls and out after them, so an episode's
game depends on its seed alone (not on the other episodes it is interleaved with) and llmrl's own
uses of `random` are left as they were.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Iterator

from ..errors import ConfigError
from .base import EnvSpec, EnvStep, Message, ToolCall

PREFIX = "ta:"
INSTALL = "pip install 'llmrl[textarena]' (from a clone: pip install -e '.[textarena]')"


def is_textarena(name: str) -> bool:
    return name.startswith(PREFIX)


def require() -> Any:
    """The textarena module, or one sentence naming the package to install."""
    try:
        import textarena
    except ImportError:
        raise ConfigError(f"TextArena games need the 'textarena' package, which is not installed: {INSTALL}.") from None
    return textarena


def env_id(name: str) -> str:
    """'ta:GuessTheNumber-v0' → 'GuessTheNumber-v0' (checked against TextArena's registry)."""
    game = name[len(PREFIX):].strip()
    ta = require()
    from textarena.envs.registration import ENV_REGISTRY

    if game not in ENV_REGISTRY:
        close = sorted(k for k in ENV_REGISTRY if k.split("-")[0].lower() == game.split("-")[0].lower())
        hint = f"; did you mean {', '.join(close[:4])}?" if close else " (textarena.envs.registration.ENV_REGISTRY lists them)."
        raise ConfigError(f"TextArena has no game '{game}'{hint}")
    del ta
    return game


def env_spec(name: str) -> EnvSpec:
    """`resolve_env`'s adapter for 'ta:ENV_ID' (envs/base.py `ADAPTERS`): the game checked now, one
    `TextArenaEnv` per episode."""
    game = env_id(name)
    return EnvSpec(name, lambda: TextArenaEnv(game))


def _raw(game: str) -> str:
    """The registration without observation wrappers: its observations are the new messages only."""
    from textarena.envs.registration import ENV_REGISTRY

    return f"{game}-raw" if f"{game}-raw" in ENV_REGISTRY else game


def _text(observation: Any, player: int) -> str:
    """The messages of a raw observation [(from_id, message, type), …] not sent by `player`, one per line;
    a wrapped (string) observation as it is."""
    if isinstance(observation, str):
        return observation.strip()
    return "\n".join(str(m[1]).strip() for m in observation if m[0] != player).strip()


class TextArenaEnv:
    """One TextArena game per episode (`make()` per episode: a fresh `textarena.make`)."""

    def __init__(self, game: str, timeout_s: float | None = None) -> None:
        self.game = game
        self.env: Any = None
        self.random = random.Random()
        self.player = 0

    def tools(self) -> None:
        return None

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        """Run with this game's `random` state as the global one; put the caller's back after."""
        outer = random.getstate()
        random.setstate(self.random.getstate())
        try:
            yield
        finally:
            self.random.setstate(random.getstate())
            random.setstate(outer)

    def reset(self, row: dict[str, Any], seed: int) -> list[Message]:
        """Open the game of the row's `ta_seed` (the row's game key `seed` when the row has none)."""
        ta = require()
        game_seed = int(row.get("ta_seed", seed))
        self.random.seed(game_seed)
        with self._own_random():
            self.env = ta.make(_raw(self.game))
            try:
                self.env.reset(num_players=1, seed=game_seed)
            except (ValueError, AssertionError, TypeError) as exc:
                raise ValueError(f"TextArena's {self.game} cannot be played by one player ({str(exc).rstrip('.')}); "
                                 "llmrl plays TextArena's single-player games") from None
            self.player, observation = self.env.get_observation()
        return [{"role": "user", "content": _text(observation, self.player)}]

    def step(self, text: str, calls: list[ToolCall]) -> EnvStep:
        """The turn's text is the action; the game's messages since are the answer, its reward at the end."""
        with self._own_random():
            done, _ = self.env.step(text)
            if done:
                closed = self.env.close()  # (rewards, game_info) since 0.7; rewards alone before
                rewards = closed[0] if isinstance(closed, tuple) else closed
                return EnvStep(reward=float(rewards.get(self.player, 0.0)), done=True)
            self.player, observation = self.env.get_observation()
        return EnvStep([{"role": "user", "content": _text(observation, self.player) or "(no message)"}])
