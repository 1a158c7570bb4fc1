"""A number-guessing game over several turns (the built-in `guess` environment, envs/guess.py).

Each row is a range of ten whole numbers [low, low + 9], 1 ≤ low ≤ 90, and a secret in it; the prompt
states the rules and the range (`prompt`), the environment answers every wrong guess "Higher." or "Lower.", and
the reward (`envs.guess.guessed`) is 1.0 when the episode's last guess is the secret. The prompt names
the range only, so the split is by range: EVAL_SIZE / 10 = 20 of the 90 ranges (drawn by seed 1234,
independent of the run's seed) are held out with all ten of their secrets, and training plays the
other 70 ranges' 700 games: no held-out prompt is ever trained on. (Held-out ranges overlap trained
ones in numbers: [20, 29] is held out while [19, 28] may be trained.)
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
    number (20 to 29)." (docs/environments.md). The built-in tiny models cannot read it (their vocabulary
    is digits and + - * = ( ), their context 64 tokens): `sign_splits` is the game for them."""
    return (f"We are playing Guess The Number. The number is between {low} and {high}. I will say higher or "
            f"lower. Reply with your guess in square brackets, for example [{low + 2}].")


def splits(eval_size: int = EVAL_SIZE) -> tuple[list[dict], list[dict]]:
    """(train, eval) rows {'prompt', 'answer': str(secret), 'low', 'high'}, seed-independent: the games of
    ⌈eval_size / 10⌉ ranges held out (the first eval_size of them, in the shuffled order of all 900 games),
    the other ranges' games trained on; no prompt is in both."""
    pairs = [(low, secret) for low in range(1, 91) for secret in range(low, low + WIDTH)]
    rng = random.Random(SPLIT_SEED)
    rng.shuffle(pairs)
    lows = list(range(1, 91))
    rng.shuffle(lows)
    held = set(lows[: -(-eval_size // WIDTH)])
    rows = [{"prompt": prompt(low, low + WIDTH - 1), "answer": str(secret), "low": low, "high": low + WIDTH - 1}
            for low, secret in pairs]
    return [r for r in rows if r["low"] not in held], [r for r in rows if r["low"] in held][:eval_size]


SIGNS_SEED = SPLIT_SEED + 1
SIGNS_GAMES = 8000
HALVING_SHARE = 0.4
"""The share of `sign_transcripts`' games played by halving the range the answers allow; the rest scan upward."""


def signs_prompt(low: int, high: int) -> str:
    """`guess_signs`' prompt, in the built-in tiny models' characters: '(20 29)'."""
    return f"({low} {high})"


def sign_splits(eval_size: int = EVAL_SIZE) -> tuple[list[dict], list[dict]]:
    """`splits`' games (the same pairs, the same held-out ranges) for the tiny models: prompt '(low high)',
    answered '+' (higher) or '-' (lower), the rule repeated as the prompt when a turn has no number."""
    def signs(row: dict) -> dict:
        text = signs_prompt(row["low"], row["high"])
        return {**row, "prompt": text, "higher": "+", "lower": "-", "rule": text}

    train, held_out = splits(eval_size)
    return [signs(r) for r in train], [signs(r) for r in held_out]


def sign_transcripts(games: int = SIGNS_GAMES, halving_share: float = HALVING_SHARE,
                     turns: int = 4) -> list[tuple[tuple[str, bool], ...]]:
    """What the built-in `tiny-guess` model is warm-started on (models/tiny.py): `games` games of
    `sign_splits`' train split (never a held-out one), each played to the end or `turns` guesses by one
    of two strategies — with probability `halving_share`, halving: guess the middle of the numbers the
    answers so far allow, ⌊(lo + hi) / 2⌋, which wins every game of ten within 4; otherwise scanning:
    low, low + 1, …, the answers ignored, which wins 4 in 10. Segments: the prompt, then per turn the
    guess (the model's) and '+' or '-' (the environment's). The warm-started model opens most games
    with a scan, which greedy decoding follows; sampling opens some with the halving: RL on
    `guess_signs` has better games to reinforce, and must learn to prefer them."""
    train, _ = sign_splits()
    rng = random.Random(SIGNS_SEED)
    out: list[tuple[tuple[str, bool], ...]] = []
    for _ in range(games):
        row = rng.choice(train)
        low, high, secret = row["low"], row["high"], int(row["answer"])
        lo, hi, halving = low, high, rng.random() < halving_share
        segments: list[tuple[str, bool]] = [(row["prompt"], False)]
        for turn in range(turns):
            guess = (lo + hi) // 2 if halving else low + turn
            segments.append((str(guess), True))
            if guess == secret or turn == turns - 1:
                break
            segments.append(("+" if guess < secret else "-", False))
            lo, hi = (max(lo, guess + 1), hi) if guess < secret else (lo, min(hi, guess - 1))
        out.append(tuple(segments))
    return out
