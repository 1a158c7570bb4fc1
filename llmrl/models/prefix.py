"""Prompt-prefix sharing: run each distinct prompt once and let all its samples attend to its cache.

A GRPO-style batch holds G samples of each prompt, so a plain forward over the (N, P+T) batch
computes every prompt's P positions G times. Causal attention makes the prompt's keys and values
independent of what follows, so they can be computed once per distinct prompt:

    1. decoder(prompts[first])            → hidden (U, P, H) and a KV cache of length P, U ≤ N rows
    2. cache.reorder_cache(inverse)       → the cache gathered to N rows (index_select: differentiable)
    3. decoder(responses, cache)          → hidden (N, T, H) for the response positions

and the hidden state that predicts response token t is h[P-1+t]: the prompt's last position for
t = 0 (gathered from step 1), the response's own positions for t ≥ 1. The result equals the plain
forward up to float rounding (different matmul shapes), gradients included: the LoRA parameters
receive the prompt positions' gradient summed over the samples that share them.

Sharing is used only when it saves at least half of the prompt work (U ≤ N / 2), so batches of
distinct prompts (PPO's default: one sample per prompt) keep the single plain forward, bit for bit.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor, nn
from transformers import DynamicCache


@lru_cache(maxsize=None)
def _cache_name(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def with_cache(module: nn.Module, cache: DynamicCache) -> dict[str, object]:
    """The keyword that passes a KV cache to `module`'s forward: `cache` in transformers ≥ 5.x,
    `past_key_values` before (an unknown keyword would be swallowed by **kwargs and silently
    ignored, decoding without the context)."""
    return {_cache_name(type(module)): cache, "use_cache": True}


@dataclass(frozen=True)
class PromptGroups:
    """first (U,) long: a representative row of each distinct prompt; inverse (N,) long: the
    distinct prompt of each row, so prompt_ids[first][inverse] == prompt_ids."""

    first: Tensor
    inverse: Tensor


def distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> PromptGroups | None:
    """The distinct (ids, mask) prompt rows of a left-padded (N, P) batch, or None when sharing them
    would not save at least half of the prompt work (U > N / 2)."""
    n = prompt_ids.shape[0]
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    u = unique.shape[0]
    if 2 * u > n:
        return None
    rows = torch.arange(n, device=prompt_ids.device)
    first = torch.full((u,), n, dtype=torch.long, device=prompt_ids.device).scatter_reduce(
        0, inverse, rows, reduce="amin"
    )
    return PromptGroups(first, inverse)


def shared_prefix_hidden(decoder: nn.Module, ids: Tensor, attention: Tensor, positions: Tensor,
                         prompt_len: int, groups: PromptGroups) -> Tensor:
    """Last hidden states at the positions that predict the response tokens, (N, T, H), computing
    each distinct prompt once. ids, attention, positions: (N, P+T) as in `stack.Sequences`."""
    p, first = prompt_len, groups.first
    cache = DynamicCache()
    head = decoder(input_ids=ids[first, :p], attention_mask=attention[first, :p],
                   position_ids=positions[first, :p], **with_cache(decoder, cache))
    cache.reorder_cache(groups.inverse)
    tail = decoder(input_ids=ids[:, p:], attention_mask=attention, position_ids=positions[:, p:],
                   **with_cache(decoder, cache))
    last_prompt = head.last_hidden_state[:, -1:].index_select(0, groups.inverse)
    return torch.cat([last_prompt, tail.last_hidden_state[:, :-1]], dim=1)


def shared_prefill(model: nn.Module, prompt_ids: Tensor, attention: Tensor, positions: Tensor,
                   cache: DynamicCache, groups: PromptGroups | None) -> Tensor:
    """Fill `cache` with the prompts' keys and values, each distinct prompt computed once, and
    return the logits of every row's last prompt position, (N, 1, V)."""
    if groups is None:
        out = model(input_ids=prompt_ids, attention_mask=attention, position_ids=positions,
                    logits_to_keep=1, **with_cache(model, cache))
        return out.logits
    first = groups.first
    out = model(input_ids=prompt_ids[first], attention_mask=attention[first], position_ids=positions[first],
                logits_to_keep=1, **with_cache(model, cache))
    cache.reorder_cache(groups.inverse)
    return out.logits.index_select(0, groups.inverse)
