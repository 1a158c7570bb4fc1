"""Multi-digit multiplication with a calculator tool (the built-in `calculator` environment).

Prompts look like ``347*28=``; the right answer is ``9716``. A small model rarely multiplies a
three-digit by a two-digit number in its head but can call the calculator and copy its result:
with a chat template it writes a Hermes `<tool_call>`, the built-in tiny model writes the plain
format (a turn ending in '=' is a call: envs/tools.py). The reward is exact match on the episode's
last assistant turn. The pairs (a, b), 100 ≤ a ≤ 999, 10 ≤ b ≤ 99, are drawn with a fixed seed
(1234, independent of the run's seed), distinct, the first EVAL_SIZE held out.
"""

from __future__ import annotations

import random

EVAL_SIZE = 200
TRAIN_SIZE = 2000
SPLIT_SEED = 1234
ENV = "calculator"


def splits(train_size: int = TRAIN_SIZE, eval_size: int = EVAL_SIZE) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, eval) rows {'prompt': 'a*b=', 'answer': str(a·b)}, disjoint, seed-independent."""
    rng = random.Random(SPLIT_SEED)
    pairs: dict[tuple[int, int], None] = {}
    while len(pairs) < train_size + eval_size:
        pairs[(rng.randint(100, 999), rng.randint(10, 99))] = None
    rows = [{"prompt": f"{a}*{b}=", "answer": str(a * b)} for a, b in pairs]
    return rows[eval_size:], rows[:eval_size]
