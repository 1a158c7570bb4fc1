"""Tasks: prompts with their extra columns, and a reward over completions.

A reward function is a plain callable `reward(prompts, completions, **columns) -> list[float]`
returning one float per completion; `columns` are the dataset's other columns, row-aligned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import ConfigError
from . import arithmetic

RewardFn = Callable[..., Sequence[float]]


@dataclass(frozen=True)
class Task:
    """train/eval rows are dicts with a 'prompt' and any other columns the reward uses.
    `success` is the reward at or above which a completion counts as correct (for accuracy)."""

    name: str
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    reward: RewardFn
    success: float = 1.0


def _arithmetic() -> Task:
    train, held_out = arithmetic.splits()
    rows = lambda xs: [{"prompt": x.prompt, "answer": x.answer} for x in xs]  # noqa: E731
    return Task("arithmetic", rows(train), rows(held_out), arithmetic.exact_match)


TASKS: dict[str, Callable[[], Task]] = {"arithmetic": _arithmetic}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"Unknown task '{name}'; valid tasks: {', '.join(TASKS)}.")
    return TASKS[name]()
