"""The built-in chat task: "What is a+b?" as a chat message, a and b in 1..20.

Made for small instruction-tuned models (the SmolLM2 recipe): the prompt is one user message and
the chat template of the model renders it. The reward is 1.0 when the last number in the
completion is the sum ("7 + 12 = 19." and "The answer is 19" score 1; "19 is not 7+12" scores 0),
so a model is rewarded for ending on its answer, not for writing many numbers. The 400 pairs are
shuffled once (seed 1234, independent of the run's seed): 100 form the held-out eval split, 300
the train split.
"""

from __future__ import annotations

import random
from typing import Any

MAX_OPERAND = 20
EVAL_SIZE = 100
SPLIT_SEED = 1234


def _row(a: int, b: int) -> dict[str, Any]:
    return {"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "answer": str(a + b)}


def splits() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) rows: a fixed partition of the 400 pairs (300 train, 100 eval)."""
    pairs = [(a, b) for a in range(1, MAX_OPERAND + 1) for b in range(1, MAX_OPERAND + 1)]
    random.Random(SPLIT_SEED).shuffle(pairs)
    rows = [_row(a, b) for a, b in pairs]
    return rows[EVAL_SIZE:], rows[:EVAL_SIZE]
