"""Attention for a half-precision model on the CPU: decoding steps on packed grouped heads, sequences
in float32.

A decoding step asks for one query token per row. transformers' SDPA path then runs grouped-query
attention (9 query heads sharing 3 key/value heads in SmolLM2) in one of two ways: with a padding
mask it packs the `rep` query heads of each group onto the query axis, (B, H, 1, D) → (B, KVH, rep, D),
and calls `scaled_dot_product_attention` on the key/value heads as they are; without a mask (no row
of the batch is padded) it passes `enable_gqa=True` instead. torch's CPU kernel runs the second
5x slower in bfloat16 (2.35 against 0.46 ms a layer for 64 rows and 48 keys; 4.10 against 0.82 at 96
keys; on the 2-core AMD EPYC of docs/performance.md, avx512_bf16, no AMX), while in float32 it is the
faster one. So an unpadded bfloat16 batch decoded 1.27x slower than the same batch with one padded row
(`bench/attention_cpu.py`).

`cpu_half_attention` gives such a call an all-True mask (B, 1, 1, L), which sends it down the packed
path, and otherwise is transformers' `sdpa_attention_forward` unchanged: the same kernel, the same
float32 accumulation, the keys every row could attend to anyway. Float32/float64 models, CUDA,
decoding steps that carry a mask and sequences without a graph are not touched (bit for bit SDPA).

A query of several tokens in a forward that records a graph (the update's) runs SDPA on float32
copies of q, k, v and casts the output back: torch's CPU flash-attention backward is slower in
bfloat16, so one layer's forward + backward takes 12.3 against 7.7 ms for 16 rows of 20 queries on 70
keys, 24.5 against 12.7 at 70 on 70 (1.6-1.9x; `bench/attention_train.py`), and SmolLM2's bfloat16
update ran 1.11-1.26x faster. Without a graph (a prefill, the π_old forward) bfloat16's forward is as
fast or faster (1.10 against 1.21 ms) and is kept; the two differ by bfloat16 rounding of the output
(both kernels accumulate in float32), as products of another batch shape already do.

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
    if _half_sequence_with_graph(query, key, value):
        return _float32_sdpa(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _half_sequence_with_graph(query: Tensor, key: Tensor, value: Tensor) -> bool:
    """A query of several tokens in bfloat16/float16 on the CPU, in a forward a backward will follow."""
    return (query.shape[2] > 1 and query.device.type == "cpu" and query.dtype in HALF
            and (query.requires_grad or key.requires_grad or value.requires_grad))


def _float32_sdpa(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                  **kwargs: object) -> tuple[Tensor, None]:
    """SDPA on float32 copies of q (B, H, q, D), k and v (B, KVH, L, D), the output (B, q, H, D) cast back
    to the query's dtype (see the module docstring for why). A float mask is cast with them (a boolean
    one is kept)."""
    mask = attention_mask.float() if attention_mask is not None and attention_mask.is_floating_point() else attention_mask
    out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), mask, **kwargs)
    return out.to(query.dtype), weights


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
