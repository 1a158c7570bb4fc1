"""A number-guessing game over several turns (the built-in `guess` environment, envs/guess.py).

Each row is a range of ten whole numbers [low, low + 9], 1 ≤ low ≤ 90, and a secret in it; the prompt
states the range ("Guess my number (20 to 29)."), the environment answers every wrong guess "Higher." or "Lower.", and
the reward (`envs.guess.guessed`) is 1.0 when the episode's last guess is the secret. The (low, secret)
pairs are all 900 of them in an order fixed by seed 1234 (independent of the run's seed), the first
EVAL_SIZE held out, so train and held-out games are disjoint.
"""

from __future__ import annotations

import random

EVAL_SIZE = 200
SPLIT_SEED = 1234
ENV = "guess"
WIDTH = 10


def prompt(low: int, high: int) -> str:
    """Short, because the built-in tiny model's context is 64 tokens (about 3 turns of it fit)."""
    return f"Guess my number ({low} to {high})."


def splits(eval_size: int = EVAL_SIZE) -> tuple[list[dict], list[dict]]:
    """(train, eval) rows {'prompt', 'answer': str(secret), 'low', 'high'}, disjoint, seed-independent."""
    pairs = [(low, secret) for low in range(1, 91) for secret in range(low, low + WIDTH)]
    random.Random(SPLIT_SEED).shuffle(pairs)
    rows = [{"prompt": prompt(low, low + WIDTH - 1), "answer": str(secret), "low": low, "high": low + WIDTH - 1}
            for low, secret in pairs]
    return rows[eval_size:], rows[:eval_size]
