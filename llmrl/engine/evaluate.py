"""evaluate: greedy accuracy and mean reward of the actor on held-out prompts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from ..models.stack import PolicyStack
from .rewards import score
from .rollout import decode, encode_prompts
from .sampling import generate


@dataclass(frozen=True)
class EvalResult:
    accuracy: float  # share of completions whose reward ≥ the task's success threshold
    reward_mean: float
    completions: list[str]


@torch.no_grad()
def evaluate(
    stack: PolicyStack,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, Any]],
    reward_fn: Callable[..., Sequence[float]],
    *,
    max_new_tokens: int,
    success: float = 1.0,
    batch_size: int = 256,
    role: str = "actor",
) -> EvalResult:
    """Greedy-decode every row's prompt in batches and score the completions."""
    completions: list[str] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        ids, mask = encode_prompts(tokenizer, [r["prompt"] for r in chunk], stack.lm.device)
        with stack.use(role):
            gen = generate(stack, ids, mask, max_new_tokens=max_new_tokens,
                           eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
        completions += decode(tokenizer, gen.response_ids, gen.response_mask)
    rewards = score(reward_fn, rows, completions) if rows else torch.zeros(0)
    n = max(len(rows), 1)
    return EvalResult(float((rewards >= success).sum()) / n, float(rewards.sum()) / n, completions)
