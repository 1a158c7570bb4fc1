"""The built-in task: two-number addition with a verifiable reward.

Prompts look like ``37+85=``; the right completion is ``122`` followed by EOS. The universe of
prompts is every pair (a, b) with 0 <= a, b <= 99; a fixed shuffle (seed 1234, independent of the
run's seed) puts 500 pairs in the held-out eval split and the rest in the train split, so every run
and every algorithm sees the same splits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

EVAL_SIZE = 500
SPLIT_SEED = 1234


@dataclass(frozen=True)
class Example:
    """One prompt and its reference answer (the extra column a reward function receives)."""

    prompt: str
    answer: str


def _all_examples(max_operand: int) -> list[Example]:
    return [
        Example(f"{a}+{b}=", str(a + b))
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
    ]


def splits(max_operand: int = 99, eval_size: int = EVAL_SIZE) -> tuple[list[Example], list[Example]]:
    """(train, eval): a fixed, seed-independent partition of all `a+b=` prompts."""
    examples = _all_examples(max_operand)
    random.Random(SPLIT_SEED).shuffle(examples)
    return examples[eval_size:], examples[:eval_size]


def exact_match(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str]) -> list[float]:
    """1.0 when the completion, stripped of surrounding spaces, equals the answer; else 0.0."""
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer, strict=True)]
