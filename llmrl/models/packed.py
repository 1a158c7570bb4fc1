"""Decoding through prepacked weights on the CPU: every linear layer as one oneDNN product on a copy of
its weight laid out for the kernel.

A plain `nn.Linear` on the CPU hands its (out, in) weight to the GEMM as it is stored, so a kernel
that wants the weight in its own blocked layout rearranges it on every call. Decoding makes that
the dominant cost: each token multiplies a few rows (N = 8…64) by every weight of the model, so
the product does little arithmetic per weight it reads. `packed_linears` reorders each weight once
into oneDNN's layout for the batch (`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's
CPU backend does with frozen weights) and runs the layer as `torch.ops.mkldnn._linear_pointwise` on
it. Measured on SmolLM2-135M's decoding shapes (2-core AMD EPYC, avx512_bf16, no AMX; every linear
layer of the 30 and the LM head, weights cold in the cache, `bench/packed_decode.py`): 1.83× (bfloat16)
and 1.83× (float32) at 8 rows on 1 thread, 1.22× and 1.62× at 64 rows on 2 threads; a whole generation
of 64 rows × 20 tokens 1.03× (bfloat16) and 1.20× (float32).

The numbers: in bfloat16, and in float32 on one thread, the packed product gave the same bits as
`F.linear` on every shape tried on this CPU (oneDNN is torch's CPU kernel for those too); in float32
on several threads torch's plain product is MKL's and rounds differently (≤ 1.5e-4 per product on
SmolLM2's shapes), as any two kernels do, so tokens may part where two are nearly tied.

Cost: one copy of every packed weight while the block runs (SmolLM2-135M: its 30 layers and the LM
head, 134.5 M numbers, 538 MB in float32, 269 MB in bfloat16), made at entry (0.13 s in bfloat16,
0.24 s in float32 there) and freed at exit; the start-up table lists it (`HFEngine.memory`). Only
no-grad calls take the packed path: a layer called with gradients on runs its plain forward.

Used only by the `hf` engine's decoding (`engine.pack_weights`), on models of hidden size ≥ 256:
below that (the built-in tiny model) a product is too small for the layout to matter, and the
built-in default keeps its numbers bit for bit.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from .decoding import WIDE

MIN_HIDDEN = WIDE  # 256: smaller models decode through the plain products (the module docstring)
DTYPES = (torch.float32, torch.bfloat16)


def packable(model: nn.Module) -> bool:
    """Whether `model`'s decoding packs its linear layers: on the CPU, with oneDNN, hidden size ≥ 256,
    weights in float32 or bfloat16."""
    hidden = getattr(getattr(model, "config", None), "hidden_size", 0) or 0
    return (torch.backends.mkldnn.is_available() and hidden >= MIN_HIDDEN
            and bool(_linears(model)))


def _linears(model: nn.Module) -> list[nn.Linear]:
    """The plain linear layers of `model` whose weight is a frozen CPU float32/bfloat16 tensor and whose
    forward is the class's own (a layer another decoding saving already rerouted is left to it). The
    trainable LoRA A and B stay plain: their products are skinny (rank 4…64) and in float32 on a
    bfloat16 base, where a packed product's rounding would move the base's bits."""
    return [m for m in model.modules()
            if type(m) is nn.Linear and "forward" not in m.__dict__ and type(m.weight.data) is Tensor
            and not m.weight.requires_grad and m.weight.device.type == "cpu" and m.weight.dtype in DTYPES]


def packed_size(model: nn.Module) -> tuple[int, int]:
    """(numbers, bytes) of the packed copies `packed_linears(model)` makes (0, 0 when it packs nothing)."""
    if not packable(model):
        return 0, 0
    layers = _linears(model)
    return sum(m.weight.numel() for m in layers), sum(m.weight.numel() * m.weight.element_size() for m in layers)


def _packed_forward(layer: nn.Linear, packed: Tensor, x: Tensor) -> Tensor:
    """layer(x) through the packed weight: x (..., in) → (..., out). With gradients on, or an input
    of another dtype than the weight, the plain product."""
    if torch.is_grad_enabled() or x.dtype != packed.dtype:
        return nn.Linear.forward(layer, x)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(rows, packed, layer.bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])


@contextmanager
def packed_linears(model: nn.Module, rows: int) -> Iterator[None]:
    """Within the block, every plain linear layer of a `packable` model runs on a copy of its weight
    packed for `rows` rows at a time (the module docstring); a layer oneDNN refuses to pack (bfloat16
    on a CPU without the instructions for it) stays plain. Afterwards every layer runs its class's
    forward again and the copies are freed. The weights themselves are not touched, so a layer
    whose weight is replaced inside the block (it is not, in decoding) would still use the old copy."""
    if not packable(model):
        yield
        return
    layers: list[nn.Linear] = []
    try:
        with torch.no_grad():
            for layer in _linears(model):
                try:
                    packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), max(rows, 1))
                except RuntimeError:  # oneDNN refuses this dtype on this CPU (bfloat16 without avx512bw…)
                    continue  # the layer stays plain
                layer.forward = lambda x, layer=layer, packed=packed: _packed_forward(layer, packed, x)
                layers.append(layer)
        yield
    finally:
        for layer in layers:
            del layer.forward
