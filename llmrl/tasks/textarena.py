"""TextArena's single-player games as tasks: `--task ta:ENV_ID` (envs/textarena.py plays them).

A row is one game: its `ta_seed` fixes it (TextArena draws the secret, the board, … from it) and its
`prompt` is the game's opening message for that seed, so previews, `completions.jsonl` and
`llmrl compare`'s prompt digests show what the model reads. Held-out games are seeds
`data.split_seed + i` (i < eval size), train games `data.split_seed + 10⁶ + i` (i < rg.train_size):
disjoint seeds, as for reasoning-gym tasks (rg.py), though two seeds may deal the same game in a
game with few of them (GuessTheNumber-v0 has 20 secrets). The reward is the game's own, given by the
environment when the game ends (`EnvStep.reward`); the task adds nothing (`no_task_reward`), so
accuracy is the share of games whose reward reaches 1.0: games won.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import ConfigError
from ..envs.textarena import PREFIX, TextArenaEnv, env_id, is_textarena  # noqa: F401  (re-exported)

TRAIN_OFFSET = 10**6


def no_task_reward(prompts: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float]:
    """0.0 for every completion: a TextArena game's reward is the environment's (summed into the score)."""
    return [0.0] * len(completions)


def _row(game: str, seed: int) -> dict[str, Any]:
    try:
        opening = TextArenaEnv(game).reset({"ta_seed": seed}, seed)
    except ValueError as exc:  # a game for several players
        raise ConfigError(f"{str(exc)[0].upper()}{str(exc)[1:]}.") from None
    except Exception as exc:  # e.g. Wordle, Hangman: NLTK's 'words' corpus, which offline machines lack
        raise ConfigError(f"TextArena's {game} could not start a game ({type(exc).__name__}: {_first_line(exc)}).") from None
    return {"prompt": opening[0]["content"], "ta_seed": seed}


def _first_line(exc: Exception) -> str:
    """The first line of an error's text that says something (NLTK's LookupError opens with a row of '*')."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip().strip("*")]
    return lines[0].rstrip(".") if lines else "no message"


def splits(name: str, *, train_size: int, eval_size: int, split_seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows {'prompt', 'ta_seed'} of the game `name` ('ta:ENV_ID')."""
    game = env_id(name)
    held_out = [_row(game, split_seed + i) for i in range(eval_size)]
    train = [_row(game, split_seed + TRAIN_OFFSET + i) for i in range(train_size)]
    return train, held_out
