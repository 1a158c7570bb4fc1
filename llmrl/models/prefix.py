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

A chat template puts the same opening before every prompt (Qwen2.5's default system message is 30 of
the 37 tokens of "What is 12+14?"). The k tokens every row starts with (`common_prefix`) go one level
higher: computed once, for one row, before everything else,

    0. decoder(opening)                   → a KV cache of length k, 1 row, gathered to U (or N) rows

and each row's own copy of them is hidden from the later steps by its attention mask (positions are
each row's own, so the rotary phases are those of the plain forward). Used when it saves more
positions, k · (rows − 1), than a forward call costs (`buckets.call_positions`).
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


def common_prefix(prompt_ids: Tensor, prompt_mask: Tensor) -> int:
    """k: how many leading real tokens all rows of a left-padded (N, P) batch share, at most the
    shortest prompt's length − 1 (every row keeps a last prompt position of its own)."""
    lengths = prompt_mask.long().sum(-1)
    shortest = int(lengths.min()) if prompt_ids.shape[0] else 0
    if shortest <= 1 or prompt_ids.shape[0] < 2:
        return 0
    p = prompt_ids.shape[1]
    cols = (p - lengths)[:, None] + torch.arange(shortest - 1, device=prompt_ids.device)[None]
    aligned = prompt_ids.gather(1, cols)  # (N, shortest − 1): each row's tokens from its first real one
    same = (aligned == aligned[:1]).all(0).long()
    return int(same.cumprod(0).sum())


def opened(prompt_mask: Tensor, k: int) -> tuple[int, Tensor]:
    """What a prefill with a k-token opening leaves in the cache, for a left-padded (N, P) prompt
    mask: r, the prompt columns kept after the opening, and the attention (N, k + r) long over the
    cache: the opening, then each row's columns from P − r with its own copy of the opening hidden.
    With k = 0: r = the longest prompt, the attention the mask's last r columns."""
    p = prompt_mask.shape[1]
    lengths = prompt_mask.long().sum(-1)
    r = int((lengths - k).max())
    att = prompt_mask[:, p - r :].long()
    if k:
        att = att * (torch.arange(p - r, p, device=att.device)[None] >= (p - lengths + k)[:, None]).long()
    return r, torch.cat([att.new_ones(att.shape[0], k), att], dim=1)


def _open(module: nn.Module, ids: Tensor, attention: Tensor, positions: Tensor, p: int, k: int, rows: int,
          cache: DynamicCache) -> tuple[int, Tensor]:
    """Step 0: the `k`-token opening fed once into `cache` and gathered to `rows` rows (nothing for
    k = 0). Returns r and the attention (N, k + r + T) of every later call (`opened`, then the
    responses' columns)."""
    r, head = opened(attention[:, :p], k)
    if k:
        s0 = p - int(attention[0, :p].sum())
        module(input_ids=ids[:1, s0 : s0 + k], attention_mask=attention[:1, s0 : s0 + k],
               position_ids=positions[:1, s0 : s0 + k], **with_cache(module, cache))
        cache.reorder_cache(torch.zeros(rows, dtype=torch.long, device=ids.device))
    return r, torch.cat([head, attention[:, p:].long()], dim=1)


def shared_prefix_hidden(decoder: nn.Module, ids: Tensor, attention: Tensor, positions: Tensor,
                         prompt_len: int, groups: PromptGroups | None, opening: int = 0) -> Tensor:
    """Last hidden states at the positions that predict the response tokens, (N, T, H), computing
    the `opening` tokens every row starts with once (k, from `common_prefix`; 0: none) and each
    distinct prompt of `groups` once (None: every row's prompt is its own). ids, attention,
    positions: (N, P+T) as in `stack.Sequences`. With k = 0 the calls are those of steps 1-3."""
    p, k = prompt_len, opening
    cache = DynamicCache()
    rows = ids.shape[0] if groups is None else groups.first.shape[0]
    r, full = _open(decoder, ids, attention, positions, p, k, rows, cache)
    if groups is None:
        out = decoder(input_ids=ids[:, p - r :], attention_mask=full, position_ids=positions[:, p - r :],
                      **with_cache(decoder, cache))
        return out.last_hidden_state[:, r - 1 : -1]
    last_prompt, tail = _grouped(decoder, ids, positions, p, k, r, full, groups, cache)
    return torch.cat([last_prompt, tail[:, :-1]], dim=1)


def shared_prefix_tail(decoder: nn.Module, ids: Tensor, attention: Tensor, positions: Tensor,
                       prompt_len: int, groups: PromptGroups, opening: int = 0) -> Tensor:
    """The hidden states of the response positions themselves, (N, T, H): h[P + t] for t < T (a reward
    model reads a row's last token, the response's own last position), computed as `shared_prefix_hidden`
    computes its rows: the opening once, each distinct prompt of `groups` once, then the responses."""
    cache = DynamicCache()
    r, full = _open(decoder, ids, attention, positions, prompt_len, opening, groups.first.shape[0], cache)
    return _grouped(decoder, ids, positions, prompt_len, opening, r, full, groups, cache)[1]


def _grouped(decoder: nn.Module, ids: Tensor, positions: Tensor, p: int, k: int, r: int, full: Tensor,
             groups: PromptGroups, cache: DynamicCache) -> tuple[Tensor, Tensor]:
    """Steps 1-3 after the opening: (the last prompt position's hidden state of each row (N, 1, H), the
    response positions' (N, T, H))."""
    first = groups.first
    head = decoder(input_ids=ids[first, p - r : p], attention_mask=full[first, : k + r],
                   position_ids=positions[first, p - r : p], **with_cache(decoder, cache))
    cache.reorder_cache(groups.inverse)
    tail = decoder(input_ids=ids[:, p:], attention_mask=full, position_ids=positions[:, p:],
                   **with_cache(decoder, cache))
    return head.last_hidden_state[:, -1:].index_select(0, groups.inverse), tail.last_hidden_state


def shared_prefill(model: nn.Module, prompt_ids: Tensor, attention: Tensor, positions: Tensor,
                   cache: DynamicCache, groups: PromptGroups | None, opening: int = 0) -> tuple[Tensor, Tensor]:
    """Fill `cache` with the prompts' keys and values, the common opening (k tokens) once and each
    distinct prompt once, and return the logits of every row's last prompt position, (N, 1, V), and
    the attention (N, k + r) over the cache that decoding continues from (the prompt mask when k = 0)."""
    p = prompt_ids.shape[1]
    rows = prompt_ids.shape[0] if groups is None else groups.first.shape[0]
    r, full = _open(model, prompt_ids, attention, positions, p, opening, rows, cache)
    first = slice(None) if groups is None else groups.first
    out = model(input_ids=prompt_ids[first, p - r :], attention_mask=full[first], position_ids=positions[first, p - r :],
                logits_to_keep=1, **with_cache(model, cache))
    if groups is None:
        return out.logits, full
    cache.reorder_cache(groups.inverse)
    return out.logits.index_select(0, groups.inverse), full
