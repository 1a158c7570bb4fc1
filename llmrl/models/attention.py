"""Decoding attention for a half-precision model on the CPU: SDPA on packed grouped heads.

A decoding step asks for one query token per row. transformers' SDPA path then runs grouped-query
attention (9 query heads sharing 3 key/value heads in SmolLM2) in one of two ways: with a padding
mask it packs the `rep` query heads of each group onto the query axis, (B, H, 1, D) → (B, KVH, rep, D),
and calls `scaled_dot_product_attention` on the key/value heads as they are; without a mask (no row
of the batch is padded) it passes `enable_gqa=True` instead. torch's CPU kernel runs the second
5x slower in bfloat16 (2.35 against 0.46 ms a layer for 64 rows and 48 keys; 4.10 against 0.82 at 96
keys; on the 2-core AMD EPYC of docs/performance.md, avx512_bf16, no AMX), while in float32 it is the
faster one. So an unpadded bfloat16 batch decoded 1.27x slower than the same batch with one padded row
(`ae998e2:bench/probes/attention_cpu.py`).

`cpu_half_attention` gives such a call an all-True mask (B, 1, 1, L), which sends it down the packed
path, and otherwise is transformers' `sdpa_attention_forward` unchanged: the same kernel, the same
float32 accumulation, the keys every row could attend to anyway. Float32/float64 models, CUDA,
queries of several tokens and calls that carry a mask are not touched (bit for bit SDPA).

`model.attention: auto` picks it for a half-precision model on the CPU; 'sdpa' and 'eager' are
transformers' own.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..errors import ConfigError

NAME = "llmrl_cpu_half"
HALF = (torch.bfloat16, torch.float16)


def cpu_half_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                       **kwargs: object) -> tuple[Tensor, None]:
    """transformers' attention signature: query (B, H, q, D), key/value (B, KVH, L, D), a boolean mask
    (B, 1, q, L) (True = attend) or None; returns (B, q, H, D) and no weights."""
    if attention_mask is None and _unpadded_half_decoding(module, query):
        attention_mask = torch.ones(query.shape[0], 1, 1, key.shape[2], dtype=torch.bool, device=query.device)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _unpadded_half_decoding(module: nn.Module, query: Tensor) -> bool:
    """A one-token query of grouped heads in bfloat16/float16 on the CPU (the call to re-route)."""
    return (query.shape[2] == 1 and query.device.type == "cpu" and query.dtype in HALF
            and getattr(module, "num_key_value_groups", 1) > 1)


AttentionInterface.register(NAME, cpu_half_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the same boolean masks as SDPA's


def attention_for(setting: str, model: PreTrainedModel) -> str:
    """The implementation `model.attention` asks for: 'sdpa' and 'eager' as named (transformers' own);
    'auto' → this module's for a CPU half-precision model loaded with SDPA (it wraps SDPA), else the
    implementation the model was loaded with, left as it is."""
    loaded = model.config._attn_implementation
    if setting != "auto":
        return setting
    on_cpu_half = model.device.type == "cpu" and model.dtype in HALF
    return NAME if on_cpu_half and loaded == "sdpa" else loaded


def set_attention(model: PreTrainedModel, setting: str) -> str:
    """Switch `model` to the implementation `attention_for` picks; returns its name. A model that
    cannot take it keeps its own under 'auto', and is refused in one sentence for a named setting."""
    name, loaded = attention_for(setting, model), model.config._attn_implementation
    if name == loaded:
        return name
    try:
        model.set_attn_implementation(name)
    except (ValueError, ImportError, NotImplementedError) as exc:
        if setting == "auto":
            return loaded
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"model.attention={setting} is not available for this model: {first}") from None
    return name
