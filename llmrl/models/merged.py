"""The actor with its LoRA merged in, for decoding: one matrix product per adapted layer, not three.

Under the actor's adapter a LoRA linear layer computes  y = W·x + s·B·(A·x)  with the frozen
W (out, in), A (r, in), B (out, r), s = α / r. Decoding one token per row runs that for every
adapted layer: besides W·x, two skinny products (r = 8…64) and a scale and an add, each a
separate kernel with its own dispatch cost, which on a small model cost more than W·x itself
(docs/performance.md, the roofline). `merged_actor` computes W′ = W + s·B·A once per generation
(peft's `get_delta_weight`, in at least float32, cast to W's dtype), points each adapted layer's
frozen weight at W′ and runs the body with the adapters disabled, so every layer is one product
W′·x. Afterwards every layer gets back its very tensor W (not W′ − s·B·A), so the base is bit for
bit what it was: the reference and the critic never see W′.

Cost: one copy of the adapted weights while the body runs (SmolLM2-135M, q/k/v/o: 26.5 M numbers,
106 MB in float32; all linear layers of a model: nearly its whole size, 1,365 MiB for
Qwen2.5-Coder-0.5B), freed after; the start-up table shows it (`HFEngine.memory`). When the engine
also packs its weights (models/packed.py), W′ is made one layer at a time straight into its packed
copy (`pack_rows`), so the merge adds no copy of its own. W′·x rounds differently from W·x + s·B·(A·x): the tokens drawn
are those of the actor up to float rounding, and with `rollout.generation_logprobs` (the default; in
float32 these logits give log π_old) the log-probs are the actor's within that rounding (max
|Δ log-prob| 3.6e-5 on SmolLM2, `ae998e2:bench/probes/merged_decode.py`).

Only a plain float32 (or float64) actor merges (`mergeable`): LoRA on linear layers alone, no trained module
copy (`lora.modules_to_save`), no DoRA, no LoRA on an embedding, no LoRA dropout active, W in
float32 or float64 (or a 4-bit W on the CPU computing in float32, models/quantized.py: W′ =
deq(W_q) + s·B·A is then a float copy made beside the 4-bit codes while generating), the base not
sharded (`dist.shard_base` keeps each process's share of W: there is no whole W to merge into).
In bfloat16 a merge would round s·B·A into W's 8-bit mantissa: an update smaller than half of W's
spacing (≈ 2⁻⁹·|W|) would vanish from the generation copy, so early small updates would never reach
the samples (measured with a bfloat16 merge before it was refused: 197 of 9216 sampled tokens alike,
max |Δ log-prob| 0.31, against the adapters' path). A weight that is not a plain tensor (a DTensor
shard) and a nested call (the weights already merged) do not merge either. Anything else decodes
through the adapters as before.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Iterator

import torch
from peft.tuners.lora import LoraLayer
from peft.utils import ModulesToSaveWrapper
from torch import Tensor, nn

from .packed import pack_weight, packed_product
from .quantized import class_forward, float_weight, is_four_bit, stored_size
from .stack import PolicyStack

ADAPTER = "actor"


def _actor_layers(stack: PolicyStack) -> list[LoraLayer]:
    """Every LoRA layer that carries the actor's adapter, in the model's order."""
    return [m for m in stack.peft.modules()
            if isinstance(m, LoraLayer) and (ADAPTER in m.lora_A or ADAPTER in m.lora_embedding_A)]


def mergeable(stack: PolicyStack) -> bool:
    """True when the actor is the base plus LoRA on linear layers alone (see the module docstring)."""
    layers = _actor_layers(stack)
    if not layers or any(isinstance(m, ModulesToSaveWrapper) for m in stack.peft.modules()):
        return False
    for layer in layers:
        base = layer.get_base_layer()
        if ADAPTER in layer.lora_embedding_A or not isinstance(base, nn.Linear):
            return False
        if layer.use_dora.get(ADAPTER, False) or _merge_dtype(base) not in (torch.float32, torch.float64):
            return False
        if type(base.weight.data) is not torch.Tensor or getattr(stack, "_merged", False):
            return False  # a DTensor shard has no whole W; already merged: W′ + s·B·A would add it twice
        if layer.lora_dropout[ADAPTER].training and isinstance(layer.lora_dropout[ADAPTER], nn.Dropout):
            return False  # dropout active (`stack.dropout_active`): the adapter's output is random, not s·B·A·x
    return True


def _merge_dtype(base: nn.Linear) -> torch.dtype | None:
    """The dtype W′ would be made in: W's, or for a 4-bit layer on the CPU its compute dtype (W′ =
    deq(W_q) + s·B·A, a float copy made only while generating); None for a 4-bit layer elsewhere (on a
    GPU the 4-bit base decodes through its own kernels: a float copy is what the 4 bits saved)."""
    if is_four_bit(base):
        return (base.compute_dtype or torch.float32) if base.weight.device.type == "cpu" else None
    return base.weight.dtype


@torch.no_grad()
def merged_weight(layer: LoraLayer) -> Tensor:
    """W + s·B·A of one actor LoRA linear layer in W's dtype (float32 or float64, `mergeable`), W being
    deq(W_q) for a 4-bit layer (models/quantized.py): (out, in)."""
    w = float_weight(layer.get_base_layer())
    return w + layer.get_delta_weight(ADAPTER).to(w.dtype)


@contextmanager
def merged_actor(stack: PolicyStack, pack_rows: int | None = None) -> Iterator[None]:
    """Run the body as the actor through merged weights W′ (adapters disabled), then restore every
    layer's own W. Call it inside `stack.use('actor')`; `mergeable(stack)` must hold.

    `pack_rows` (the `hf` engine's decoding on a `packable` model): W′ is made one layer at a time and
    kept only as its oneDNN-packed copy for products of that many rows (models/packed.py), so the
    generation holds one copy of the adapted weights, not a merged and a packed one. Each such layer
    runs W′x on the packed copy; a call the packed copy cannot take (gradients on, another dtype)
    computes W·x + s·B·(A·x) through the layer's own adapter instead, the same function."""
    layers = _actor_layers(stack)
    originals = [layer.get_base_layer().weight.data for layer in layers]
    stack._merged = True
    try:
        with stack.peft.disable_adapter():
            for layer in layers:
                if pack_rows is None and is_four_bit(layer.get_base_layer()):  # 4-bit codes: W′ beside them
                    layer.get_base_layer().forward = partial(_merged_plain_forward, layer, merged_weight(layer))
                elif pack_rows is None:
                    layer.get_base_layer().weight.data = merged_weight(layer)
                else:
                    packed = pack_weight(merged_weight(layer), pack_rows)
                    layer.get_base_layer().forward = partial(_merged_packed_forward, layer, packed)
            yield
    finally:
        for layer, w in zip(layers, originals):
            layer.get_base_layer().weight.data = w
            layer.get_base_layer().__dict__.pop("forward", None)
        stack._merged = False


def _merged_packed_forward(layer: LoraLayer, packed: Tensor, x: Tensor) -> Tensor:
    """W′x (+ bias) of one merged actor layer through its packed W′ (`merged_actor` with `pack_rows`);
    with gradients on or an input of another dtype, W·x + s·B·(A·x) through the adapter's modules."""
    base = layer.get_base_layer()
    if not torch.is_grad_enabled() and x.dtype == packed.dtype:
        return packed_product(packed, base.bias, x)
    return _through_adapter(layer, x)


def _merged_plain_forward(layer: LoraLayer, merged: Tensor, x: Tensor) -> Tensor:
    """W′x (+ bias) of one merged 4-bit actor layer through its float W′ (`merged_actor` without
    packing); with gradients on or an input of another dtype, through the adapter's modules."""
    base = layer.get_base_layer()
    if not torch.is_grad_enabled() and x.dtype == merged.dtype:
        return nn.functional.linear(x, merged, None if base.bias is None else base.bias.to(merged.dtype))
    return _through_adapter(layer, x)


def _through_adapter(layer: LoraLayer, x: Tensor) -> Tensor:
    """W·x + s·B·(A·x) of one actor layer: its base layer's own forward and the adapter's modules."""
    a, b = layer.lora_A[ADAPTER], layer.lora_B[ADAPTER]
    return class_forward(layer.get_base_layer(), x) + b(a(x.to(a.weight.dtype))).to(x.dtype) * layer.scaling[ADAPTER]


def merged_size(stack: PolicyStack) -> tuple[int, int]:
    """(numbers, bytes) of the generation copy W′ of a mergeable actor; (0, 0) where it does not merge."""
    if not mergeable(stack):
        return 0, 0
    bases = [layer.get_base_layer() for layer in _actor_layers(stack)]
    sizes = [(stored_size(b.weight)[0], _merge_dtype(b).itemsize) for b in bases]
    return sum(n for n, _ in sizes), sum(n * size for n, size in sizes)
