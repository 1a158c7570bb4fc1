"""Decoding attention for a half-precision model on the CPU: plain products instead of SDPA's kernel.

torch's CPU `scaled_dot_product_attention` runs bfloat16 through its flash kernel, which on a CPU
without AMX is slow for a decoding step's single query: on the 2-core AMD EPYC of
docs/performance.md (avx512_bf16, no AMX) a SmolLM2 decoding step of 64 rows spent 45 % of its time
in that kernel, 3 ms a layer against 0.65 ms in float32; with this module the step is 1.3x faster
(`bench/attention_cpu.py`). For a one-token query (q = 1) `cpu_half_attention` computes, for each
key/value head g and the `rep` query heads that share it (grouped-query attention without copying K
and V `rep` times: the heads are stacked on the query axis),

    S = (Q_g · K_gᵀ) · scale      (B, KVH, rep·q, L), the product in the model's dtype, then float32
    S[masked] = float32 min       (a finite floor: a row with nothing to attend to, a left pad's
                                   query, gets a uniform average instead of NaN)
    P = softmax(S) in float32, cast to the model's dtype
    O = P · V_g                   (B, KVH, rep·q, D) → (B, q, H, D)

which is transformers' `eager` attention without its `repeat_kv` copies: the scores are rounded to
the model's dtype by the product, where SDPA's kernel keeps them in float32 (measured against float32:
mean |Δ logit| 0.130 with eager's rounding, 0.122 with SDPA's, in bf16 where either is ±0.9 from float32).
Everything else goes to transformers' own `sdpa_attention_forward`, unchanged: float32/float64
models, CUDA, dropout, a position bias, per-head masks, scores of more than `MAX_SCORES` elements, and
every query of several tokens — prefills and the training forwards, whose log-probabilities make the
ratio π/π_old: both forwards keep SDPA's float32 scores, and the update's forward + backward measured
no faster with these products (1.00-1.16x against an A/A spread of 1.13x).

`model.attention` picks it: 'auto' = this on a CPU half-precision model, SDPA elsewhere.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "llmrl_cpu_half"
HALF = (torch.bfloat16, torch.float16)
MAX_SCORES = 1 << 22  # 4 Mi float32 scores (16 MiB) a layer: above it, SDPA's blockwise kernel


def cpu_half_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                       dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                       **kwargs: object) -> tuple[Tensor, None]:
    """transformers' attention signature: query (B, H, q, D), key/value (B, KVH, L, D), a boolean mask
    (B, 1, q, L) (True = attend) or None; returns (B, q, H, D) and no weights."""
    b, h, q, d = query.shape
    kvh = key.shape[1]
    if not _math_applies(query, key, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    rep = h // kvh
    scale = scaling if scaling is not None else d**-0.5
    scores = torch.matmul(query.reshape(b, kvh, rep * q, d), key.transpose(-1, -2)).float() * scale
    allowed = _allowed(attention_mask, rep)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).reshape(b, h, q, d)
    return out.transpose(1, 2).contiguous(), None


def _math_applies(query: Tensor, key: Tensor, mask: Tensor | None, dropout: float, kwargs: dict) -> bool:
    b, h, q, _ = query.shape
    return (q == 1 and query.device.type == "cpu" and query.dtype in HALF and dropout == 0.0
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and h % key.shape[1] == 0 and b * h * q * key.shape[2] <= MAX_SCORES
            and (mask is None or (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1)))


def _allowed(mask: Tensor | None, rep: int) -> Tensor | None:
    """(B or 1, 1, rep, L) booleans: the keys each stacked query row may attend to (a one-token query's
    mask repeated for the `rep` heads of its group); None: every key."""
    if mask is None or rep == 1:
        return mask
    return mask.repeat(1, 1, rep, 1)


AttentionInterface.register(NAME, cpu_half_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the same boolean masks as SDPA's


def attention_for(setting: str, model: PreTrainedModel) -> str:
    """The attention implementation `model.attention` asks for: 'auto' → this module's on a CPU
    half-precision model, else 'sdpa'; 'sdpa' and 'eager' as named (transformers' own)."""
    if setting != "auto":
        return setting
    on_cpu_half = model.device.type == "cpu" and model.dtype in HALF
    return NAME if on_cpu_half else "sdpa"


def set_attention(model: PreTrainedModel, setting: str) -> str:
    """Switch `model` to the implementation `attention_for` picks (only where it differs from what the
    model was loaded with); returns its name."""
    name = attention_for(setting, model)
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)
    return name
