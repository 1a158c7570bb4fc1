"""A number-guessing game over several turns (the built-in `guess` environment, envs/guess.py).

Each row is a range of ten whole numbers [low, low + 9], 1 ≤ low ≤ 90, and a secret in it; the prompt
states the rules and the range (`prompt`), the environment answers every wrong guess "Higher." or "Lower.", and
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
    """The game's rules for a chat model: SmolLM2-135M-Instruct answers this one with a bracketed
    number and a stop token 14 times in 64 at temperature 0.7, against 3 in 64 for the bare "Guess my
    number (20 to 29)." (docs/environments.md). The built-in tiny model cannot play (its vocabulary is
    digits and + - * = ( ), its context 64 tokens)."""
    return (f"We are playing Guess The Number. The number is between {low} and {high}. I will say higher or "
            f"lower. Reply with your guess in square brackets, for example [{low + 2}].")


def splits(eval_size: int = EVAL_SIZE) -> tuple[list[dict], list[dict]]:
    """(train, eval) rows {'prompt', 'answer': str(secret), 'low', 'high'}, disjoint, seed-independent."""
    pairs = [(low, secret) for low in range(1, 91) for secret in range(low, low + WIDTH)]
    random.Random(SPLIT_SEED).shuffle(pairs)
    rows = [{"prompt": prompt(low, low + WIDTH - 1), "answer": str(secret), "low": low, "high": low + WIDTH - 1}
            for low, secret in pairs]
    return rows[eval_size:], rows[:eval_size]
