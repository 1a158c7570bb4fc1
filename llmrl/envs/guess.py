"""The built-in `guess` environment: a number-guessing game answered "Higher." or "Lower.".

The episode's row names a range [low, high] and the secret (its `answer`). Each assistant turn is a
guess: its first whole number (`first_guess`). A right guess ends the episode; a wrong one is answered
"Higher." or "Lower."; a turn with no number is answered with the rule again. A row may name its own
answers in `higher`, `lower` and `rule` columns (`guess_signs`: '+', '-' and the prompt, in the built-in
tiny models' characters). The environment gives
no reward itself: the task's reward (`guessed`, on the episode's last turn) is 1.0 exactly when the
last guess is the secret, i.e. when the game was won within `rollout.max_turns` turns. Over a range of
10 numbers, halving it each turn wins in at most 4 guesses (the default `rollout.max_turns`); guessing
at random without repeats wins in 4 with probability 4/10.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from .base import EnvStep, Message, ToolCall, register_env

_NUMBER = re.compile(r"-?\d{1,30}")  # a longer run of digits reads as its first 30: never a 5,000-digit int


def first_guess(text: str) -> int | None:
    """The first whole number in `text` ('I guess 7, or 8' → 7); None when there is none."""
    match = _NUMBER.search(text)
    return int(match.group()) if match else None


def guessed(prompts: Sequence[Any], completions: Sequence[str], answer: Sequence[str], **_: Any) -> list[float]:
    """1.0 when the completion's first whole number is the secret (`answer`), else 0.0."""
    return [1.0 if first_guess(c) == int(a) else 0.0 for c, a in zip(completions, answer, strict=True)]


def in_range(prompts: Sequence[Any], completions: Sequence[str], low: Sequence[Any], high: Sequence[Any],
             **_: Any) -> list[float]:
    """1.0 when the completion is one whole number from `low` to `high` and nothing else ('24', '[24]', ' 24.'),
    else 0.0: a shaping term for chat models that answer in sentences (recipes/smollm2-135m-guess.yaml)."""
    out = []
    for c, lo, hi in zip(completions, low, high, strict=True):
        match = re.fullmatch(r"\s*\[?(\d{1,30})\]?\.?\s*", c)
        out.append(1.0 if match and int(lo) <= int(match.group(1)) <= int(hi) else 0.0)
    return out


@register_env("guess")
class Guess:
    """One game: reset reads the secret and the range from the row; step answers a guess."""

    def __init__(self, timeout_s: float | None = None) -> None:
        """`timeout_s` is the built-ins' tool time limit (rollout.env_timeout_s): no tool here, unused."""

    def tools(self) -> None:
        return None

    def reset(self, row: dict[str, Any], seed: int) -> list[Message]:
        try:
            self.secret, self.low, self.high = int(row["answer"]), int(row["low"]), int(row["high"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("the guess environment plays rows with whole-number 'answer', 'low' and 'high' "
                             "columns (the `guess` task's); this row has "
                             f"{', '.join(repr(k) for k in row) or 'none'}") from None
        self.higher, self.lower = str(row.get("higher", "Higher.")), str(row.get("lower", "Lower."))
        self.rule = str(row.get("rule", f"Reply with one number from {self.low} to {self.high}."))
        prompt = row["prompt"]
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)

    def step(self, text: str, calls: list[ToolCall]) -> EnvStep:
        guess = first_guess(text)
        if guess == self.secret:
            return EnvStep(done=True)
        if guess is None:
            return EnvStep([{"role": "user", "content": self.rule}])
        return EnvStep([{"role": "user", "content": self.higher if guess < self.secret else self.lower}])
