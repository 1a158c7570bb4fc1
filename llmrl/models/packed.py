"""Decoding through prepacked weights on the CPU: every linear layer as one oneDNN product on a copy of
its weight laid out for the kernel.

A plain `nn.Linear` on the CPU hands its (out, in) weight to the GEMM as it is stored, so a kernel
that wants the weight in its own blocked layout rearranges it on every call. Decoding makes that
the dominant cost: each token multiplies a few rows (N = 8…64) by every weight of the model, so
the product does little arithmetic per weight it reads. `packed_linears` reorders each weight once
into oneDNN's layout for the batch (`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's
CPU backend does with frozen weights) and runs the layer as `torch.ops.mkldnn._linear_pointwise` on
it. Measured on SmolLM2-135M's decoding shapes (2-core AMD EPYC, avx512_bf16, no AMX; every linear
layer of the 30 and the LM head, weights cold in the cache, `ae998e2:bench/probes/packed_decode.py`): 1.83× (bfloat16)
and 1.83× (float32) at 8 rows on 1 thread, 1.22× and 1.62× at 64 rows on 2 threads; a whole generation
of 64 rows × 20 tokens 1.03× (bfloat16) and 1.20× (float32).

The numbers: in bfloat16 the packed product gave the same bits as `F.linear` on every shape tried on
this CPU (oneDNN is torch's CPU kernel for it too); in float32 torch's plain product is another
kernel's (MKL's) and sums in another order (1e-6 … 1.5e-4 per product on SmolLM2's shapes), as any
two kernels do, so sampled tokens may part where two are nearly tied.

Cost: one copy of every packed weight while the block runs (SmolLM2-135M: its 30 layers and the LM
head: 211 layers, 134.5 M numbers, 538 MB in float32, 269 MB in bfloat16), made at entry (0.09-0.11 s
in bfloat16, 0.19-0.30 s in float32 there) and freed at exit; the start-up table lists it
(`HFEngine.memory`). Only no-grad calls take the packed path: a layer called with gradients on runs
its plain forward. bfloat16 weights are packed only where oneDNN has the instructions for them.

Used only by the `hf` engine's `generate` (`engine.pack_weights`; rollouts, evaluations and the first
turn of an episode batch, which is a rollout's `generate`; not the later turns, which would pack again
at every turn of a few tokens), on models of hidden
size ≥ 256: below that (the built-in tiny model) a product is too small for the layout to matter, and
the built-in default keeps its numbers bit for bit.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Iterator

import torch
from torch import Tensor, nn

from .decoding import WIDE
from .quantized import class_forward, float_weight, is_four_bit, stored_size

MIN_HIDDEN = WIDE  # 256: smaller models decode through the plain products (the module docstring)
ADAPTER_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "modules_to_save", "original_module")


PRIVATE_OPS = ("_reorder_linear_weight", "_linear_pointwise", "_is_mkldnn_bf16_supported")
"""The torch.ops.mkldnn ops packing calls: private to torch (torch.compile's CPU backend uses them), so a
torch build may lack or rename them; without all of them decoding runs the plain products."""


def has_private_ops() -> bool:
    """Whether this torch has every op of `PRIVATE_OPS` (an op namespace raises on a name it lacks)."""
    try:
        return all(callable(getattr(torch.ops.mkldnn, name)) for name in PRIVATE_OPS)
    except (AttributeError, RuntimeError):
        return False


def packable(model: nn.Module) -> bool:
    """Whether `model`'s decoding packs its linear layers: on the CPU, with oneDNN enabled and torch's
    private ops for it present (`PRIVATE_OPS`), hidden size ≥ 256 (of the text model, for a composite
    config), and some layer `_linears` takes."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = getattr(text, "hidden_size", 0) or 0
    return (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled and hidden >= MIN_HIDDEN
            and has_private_ops() and bool(_linears(model)))


def _dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes oneDNN packs on this CPU: float32, and bfloat16 where it has the instructions."""
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


def _linears(model: nn.Module) -> list[nn.Linear]:
    """The base's plain linear layers of `model`: frozen CPU weights of a dtype oneDNN packs here, a
    forward that is the class's own (a layer another decoding saving already rerouted is left to it).
    peft's modules are left plain — the LoRA A and B of every adapter (skinny products, rank 4…64, in
    float32 on a bfloat16 base, where a packed product's rounding would move the base's bits; an
    inactive adapter's are frozen but never called) and modules_to_save's copies. A 4-bit layer
    (models/quantized.py) counts with its compute dtype: its packed copy holds deq(W_q)."""
    dtypes = _dtypes()
    return [m for name, m in model.named_modules()
            if (type(m) is nn.Linear or is_four_bit(m)) and not any(part in ADAPTER_PARTS for part in name.split("."))
            and "forward" not in m.__dict__ and type(m.weight.data) is Tensor and not m.weight.requires_grad
            and m.weight.device.type == "cpu" and _product_dtype(m) in dtypes]


def _product_dtype(layer: nn.Linear) -> torch.dtype:
    """The dtype a layer's product runs in: its weight's, or a 4-bit layer's compute dtype."""
    return (getattr(layer, "compute_dtype", None) or torch.float32) if is_four_bit(layer) else layer.weight.dtype


def packed_size(model: nn.Module) -> tuple[int, int]:
    """(numbers, bytes) of the packed copies `packed_linears(model)` makes (0, 0 when it packs nothing)."""
    if not packable(model):
        return 0, 0
    sizes = [(stored_size(m.weight)[0], _product_dtype(m).itemsize) for m in _linears(model)]
    return sum(n for n, _ in sizes), sum(n * b for n, b in sizes)


def _packed_forward(layer: nn.Linear, packed: Tensor, source: int, x: Tensor) -> Tensor:
    """layer(x) through the packed weight: x (..., in) → (..., out). The plain product instead with
    gradients on, an input of another dtype than the weight, or a layer whose weight is no longer the
    tensor packed (`source`: its data pointer then)."""
    if torch.is_grad_enabled() or x.dtype != packed.dtype or layer.weight.data_ptr() != source:
        return class_forward(layer, x)
    return packed_product(packed, layer.bias, x)


def pack_weight(weight: Tensor, rows: int) -> Tensor:
    """`weight` (out, in) reordered into oneDNN's layout for products of `rows` rows at a time."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), max(rows, 1))


def packed_product(packed: Tensor, bias: Tensor | None, x: Tensor) -> Tensor:
    """x (..., in) @ W.T + bias through the packed W: (..., out)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])


@contextmanager
def packed_linears(model: nn.Module, rows: int) -> Iterator[None]:
    """Within the block, every layer `_linears` takes of a `packable` model runs on a copy of its
    weight packed for `rows` rows at a time (the module docstring); a layer whose weight is replaced
    inside the block runs plain from then on. Afterwards every layer runs its class's forward again
    and the copies are freed."""
    if not packable(model):
        yield
        return
    layers: list[nn.Linear] = []
    try:
        with torch.no_grad():
            for layer in _linears(model):
                packed = pack_weight(float_weight(layer), rows)  # a 4-bit layer: deq(W_q), made and packed here
                layers.append(layer)
                layer.forward = partial(_packed_forward, layer, packed, layer.weight.data_ptr())
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)
