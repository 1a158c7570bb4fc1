"""A decode-time saving for the `hf` engine's loop of (N, 1) forwards, and where strided rows reach a product.

`skinny_head`: the LM head of an (N, 1, H) decoding step is an (N × H) · (H × V) product with N ≪ V
(32 × 576 against 49,152 columns for SmolLM2). MKL's float32 GEMM runs that shape in 36 ms as W · xᵀ,
(V × H) · (H × N), against 56 ms as x · Wᵀ (a microbenchmark, 2 threads); the result is transposed back
into a contiguous (N, 1, V) tensor. Each logit is the same dot product of H terms through the other
operand order, which may round differently: the logits were bit-identical at 16-100 rows on the CPU of
docs/performance.md, not at 8 (ae998e2:bench/probes/decode_kernels.py). It acts where the weights are not
packed (models/packed.py takes the head where it packs): an episode's later turns, a model under 256
wide, `engine.pack_weights=false`; on a later turn's shape (Qwen2.5-0.5B, ~700 tokens of context, 64
rows × 64 tokens) whole generations took 1.08× as long without it (ae998e2:bench/decode_tweaks.py, docs/engines.md).

The KV cache is transformers' own `DynamicCache` (a KV cache with room reserved ahead, which saved the
torch.cat of the past at each token, measured 0.95-1.03× whole generations at today's defaults and was
deleted: docs/history.md).

Used only by the `hf` engine's `generate`; training forwards (many rows) keep the plain paths, but for
`wide`: a strided slice of a model of hidden size ≥ 256 reaches the LM head as contiguous rows wherever
it is computed (`stack.hidden` too).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

SKINNY_ROWS = 256  # above this many rows the plain x · Wᵀ is as fast (ae998e2:bench/probes/decode_kernels.py)
WIDE = 256  # hidden size from which a strided input reaches a product only as contiguous rows (`wide`)


def wide(x: Tensor) -> bool:
    """Whether x (..., H) is a strided slice of a model of hidden size ≥ 256, which a linear layer should
    get as contiguous rows: torch's CPU matmul runs a strided 3-D input against a 2-D weight as a
    batched product with the weight copied once per batch row (SmolLM2's LM head on the prefill's last
    positions, 8 rows: 726 against 8 ms in bfloat16, 78 against 18 in float32). Smaller models keep
    the plain path, so their numbers stay bit for bit what they were (the copy is small there)."""
    return x.shape[-1] >= WIDE and x.dim() > 2 and x.device.type == "cpu" and not x.is_contiguous()


def skinny_linear(head: nn.Linear, x: Tensor) -> Tensor:
    """head(x) for x (..., H) with few rows, as (W · xᵀ)ᵀ made contiguous: (..., V)."""
    rows = x.reshape(-1, x.shape[-1])  # a copy of the few rows when x is a strided slice (the prefill's last positions)
    if rows.shape[0] > SKINNY_ROWS or rows.device.type != "cpu" or head.weight.dtype != torch.float32:
        if not wide(x):  # a small model's head as it always ran, bit for bit
            return nn.Linear.forward(head, x)
        return nn.functional.linear(rows, head.weight, head.bias).reshape(*x.shape[:-1], head.weight.shape[0])
    out = torch.mm(head.weight, rows.t()).t()
    if head.bias is not None:
        out = out + head.bias
    return out.contiguous().reshape(*x.shape[:-1], head.weight.shape[0])


@contextmanager
def skinny_head(model: nn.Module) -> Iterator[None]:
    """Within the block, `model`'s output embedding (a plain `nn.Linear`) runs `skinny_linear`."""
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear or "forward" in head.__dict__:  # another saving (models/packed.py) has it
        yield
        return
    head.forward = lambda x: skinny_linear(head, x)  # an instance attribute shadows the class method
    try:
        yield
    finally:
        del head.forward
