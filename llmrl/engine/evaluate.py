"""evaluate: greedy accuracy and mean reward of the actor on held-out prompts; evaluate_sampled:
K sampled completions per prompt and the unbiased pass@k estimator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from ..models.stack import PolicyStack
from ..models.tokenizer import stop_token_ids
from .rewards import score
from .rollout import decode, encode_prompts
from .sampling import generate, row_uniforms


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
                           eos_id=stop_token_ids(tokenizer, stack.lm), pad_id=tokenizer.pad_token_id)
        completions += decode(tokenizer, gen.response_ids, gen.response_mask)
    rewards = score(reward_fn, rows, completions) if rows else torch.zeros(0)
    n = max(len(rows), 1)
    return EvalResult(float((rewards >= success).sum()) / n, float(rewards.sum()) / n, completions)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. 2021 (Codex, eq. 1) from n samples of which c are correct:

        pass@k = 1 − C(n−c, k) / C(n, k) = 1 − ∏_{i=n−c+1}^{n} (1 − k/i)

    (the product form avoids huge binomials). 1.0 when fewer than k samples are wrong.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


@dataclass(frozen=True)
class SampledResult:
    """K sampled completions per prompt: `correct[i]` of prompt i's K reached the success threshold.
    pass_at[k] is the mean over prompts of `pass_at_k(K, correct[i], k)`."""

    samples: int
    correct: list[int]
    reward_mean: float
    pass_at: dict[int, float]
    completions: list[list[str]]


EVAL_STEP = -1
"""The `step` slot of an evaluation's per-row uniforms: never one a training step uses."""


@torch.no_grad()
def evaluate_sampled(
    stack: PolicyStack,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, Any]],
    reward_fn: Callable[..., Sequence[float]],
    *,
    samples: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    success: float = 1.0,
    batch_size: int = 256,
    role: str = "actor",
) -> SampledResult:
    """Sample K = `samples` completions per prompt and report pass@1 and pass@K.

    Sample j of prompt i draws its uniforms from (seed, EVAL_STEP, i, j) exactly as a training
    rollout does, so the result does not depend on `batch_size`.
    """
    prompts = [r["prompt"] for r in rows for _ in range(samples)]
    prompt_index = torch.arange(len(rows)).repeat_interleave(samples)
    sample_index = torch.arange(samples).repeat(len(rows))
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        stop = start + batch_size
        ids, mask = encode_prompts(tokenizer, prompts[start:stop], stack.lm.device)
        u = row_uniforms(seed, EVAL_STEP, prompt_index[start:stop], sample_index[start:stop], max_new_tokens)
        with stack.use(role):
            gen = generate(stack, ids, mask, max_new_tokens=max_new_tokens, eos_id=stop_token_ids(tokenizer, stack.lm),
                           pad_id=tokenizer.pad_token_id, temperature=temperature, top_p=top_p,
                           uniforms=u.to(stack.lm.device))
        texts += decode(tokenizer, gen.response_ids, gen.response_mask)
    expanded = [r for r in rows for _ in range(samples)]
    rewards = score(reward_fn, expanded, texts) if rows else torch.zeros(0)
    correct = (rewards >= success).view(len(rows), samples).sum(1).tolist() if rows else []
    ks = sorted({1, samples})
    pass_at = {k: sum(pass_at_k(samples, c, k) for c in correct) / max(len(rows), 1) for k in ks}
    grouped = [texts[i * samples : (i + 1) * samples] for i in range(len(rows))]
    return SampledResult(samples, correct, float(rewards.double().mean()) if rows else 0.0, pass_at, grouped)
