"""The vllm engine's KV cache and context sized to the run's work, not to a fixed GiB (issue 29).

On the CPU vLLM allocates `kv_cache_memory_bytes` up front, whatever the run decodes; the old fixed
1 GiB was 2.2× the `hf` engine's whole peak RSS on issue 8's configuration. A run knows what it will
ask of the engine: at most R rows at once, each a prompt of at most P tokens and at most N new ones:

    R = (rollout.prompts_per_step + rollout.oversample) × rollout.num_generations    a step's rows,
        capped at engine.max_num_seqs (vLLM never runs more sequences at once)
    L = engine.max_model_len, else P + N, at most the model's context window             the context
        (episodes: N = their response budget, step/episodes.episode_budget)
    bytes per token  b = 2 (K and V) × layers × kv_heads × head_dim × dtype bytes
    KV bytes = HEADROOM × R × ⌈L / BLOCK⌉ · BLOCK × b

BLOCK = 128 tokens rounds each row up to whole cache blocks (vLLM's CPU backend pages the cache in
blocks; 128 is the largest block it uses, so the rounding is never short). HEADROOM = 1.25 covers the
blocks a finished request keeps until it is freed. With prefix caching the G samples of a prompt share
its blocks, so the cache holds more than R rows in practice; a cache that is too small never fails a
run, vLLM queues the rows it cannot hold, so the sizing trades nothing but memory for speed: an
evaluation wider than a step (`eval.batch_size` 100 against 64 rows) runs its extra rows as others
finish instead of holding a cache for them through the whole run.
`engine.kv_cache_gb` set by hand wins; where the longest prompt is not known (e.g. an engine built
outside a run) the cache keeps the old 1 GiB.
"""

from __future__ import annotations

import math
from typing import Any

import torch

BLOCK = 128
HEADROOM = 1.25
FALLBACK_BYTES = 2**30
DEFAULT_BATCHED_TOKENS = 4096  # vLLM's max_num_batched_tokens when llmrl sets none


def bytes_per_token(text_config: Any, dtype: torch.dtype) -> int:
    """2 × layers × kv_heads × head_dim × dtype bytes: the K and V one token leaves in every layer."""
    heads = int(text_config.num_attention_heads)
    kv_heads = int(getattr(text_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text_config, "head_dim", None) or text_config.hidden_size // heads)
    return 2 * int(text_config.num_hidden_layers) * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def rows_at_once(config: Any) -> int:
    """R: the rows of one step, (B + oversample) × G, at most engine.max_num_seqs."""
    r = config.rollout
    return max(1, min((r.prompts_per_step + r.oversample) * r.num_generations, config.engine.max_num_seqs))


def context_tokens(config: Any, longest_prompt: int | None, response_tokens: int | None = None,
                   text_config: Any = None) -> int | None:
    """L: engine.max_model_len, else the longest prompt + the response's tokens (`response_tokens`:
    episodes' budget, step/episodes.episode_budget; else rollout.max_new_tokens), at most the model's
    context window (None: not known)."""
    if config.engine.max_model_len:
        return config.engine.max_model_len
    if longest_prompt is None:
        return None
    length = longest_prompt + (response_tokens or config.rollout.max_new_tokens)
    window = getattr(text_config, "max_position_embeddings", None)
    return min(length, window) if window else length


def kv_cache_bytes(config: Any, text_config: Any, dtype: torch.dtype, longest_prompt: int | None,
                   response_tokens: int | None = None) -> int:
    """The CPU KV cache to allocate: engine.kv_cache_gb, else the module's formula (1 GiB when the
    context is not known)."""
    if config.engine.kv_cache_gb:
        return int(config.engine.kv_cache_gb * 2**30)
    length = context_tokens(config, longest_prompt, response_tokens, text_config)
    if length is None:
        return FALLBACK_BYTES
    padded = math.ceil(length / BLOCK) * BLOCK
    return int(HEADROOM * rows_at_once(config) * padded * bytes_per_token(text_config, dtype))


def batched_tokens(config: Any, length: int | None) -> int | None:
    """vLLM's per-step token budget on the CPU: enough for the prefill of every row it may hold at once
    (a step's rows or an evaluation batch, at most engine.max_num_seqs) at the context L, so that no
    request's prefill is split. vLLM rewinds a split, seeded request's generator
    (`gen.set_offset(gen.get_offset() - 4)`), which a CPU `torch.Generator` cannot do: a step of 64 rows of
    72 prompt tokens failed with 'CPU Generator does not use offset' under the default 4 096 tokens.
    None (vLLM's default) when L is not known or the rows fit in the default."""
    if length is None:
        return None
    rows = min(max(rows_at_once(config), config.eval.batch_size), config.engine.max_num_seqs)
    return rows * length if rows * length > DEFAULT_BATCHED_TOKENS else None
