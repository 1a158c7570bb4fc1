"""Two decode-time savings for the `hf` engine's loop of (N, 1) forwards.

1. `ReservedCache`: transformers' `DynamicCache` grows every layer's keys and values with
   `torch.cat` at each token, so decoding T tokens after a P-token prompt copies
   O(N · heads · (P + T) · d) per layer per token. Here each layer writes into a buffer with room
   for `reserve` more positions and hands out views of its filled part: the same values, so the
   attention reads the same numbers, and no copy of the past is made until the room runs out.
   `reorder_cache` (after a shared-prompt prefill, or when finished rows leave the batch,
   engines/hf_decode.py) gathers the rows kept straight into new buffers with the same room.

2. `skinny_head`: the LM head of an (N, 1, H) decoding step is an (N × H) · (H × V) product with
   N ≪ V (32 × 576 against 49,152 columns for SmolLM2). MKL's float32 GEMM runs that shape in
   36 ms as W · xᵀ, (V × H) · (H × N), against 56 ms as x · Wᵀ (a microbenchmark, 2 threads); the
   result is transposed back into a contiguous (N, 1, V) tensor. Each logit is the same dot product
   of H terms through the other operand order, which may round differently: the logits were
   bit-identical at 16-100 rows on the CPU of docs/performance.md, not at 8 (bench/probes/decode_kernels.py).

Both are used only by the `hf` engine's `generate`; training forwards (many rows) keep the plain
paths, but for `wide`: a strided slice of a model of hidden size ≥ 256 reaches the LM head as
contiguous rows wherever it is computed (`stack.hidden` too).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

SKINNY_ROWS = 256  # above this many rows the plain x · Wᵀ is as fast (bench/probes/decode_kernels.py)
WIDE = 256  # hidden size from which a strided input reaches a product only as contiguous rows (`wide`)


def wide(x: Tensor) -> bool:
    """Whether x (..., H) is a strided slice of a model of hidden size ≥ 256, which a linear layer should
    get as contiguous rows: torch's CPU matmul runs a strided 3-D input against a 2-D weight as a
    batched product with the weight copied once per batch row (SmolLM2's LM head on the prefill's last
    positions, 8 rows: 726 against 8 ms in bfloat16, 78 against 18 in float32). Smaller models keep
    the plain path, so their numbers stay bit for bit what they were (the copy is small there)."""
    return x.shape[-1] >= WIDE and x.dim() > 2 and x.device.type == "cpu" and not x.is_contiguous()


class ReservedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of (N, heads, capacity, d) buffers.

    `keys`/`values` are always `buffer[:, :, :length]`; an update that fits writes in place, one
    that does not (first use, or no room left) allocates a buffer of length + new + `reserve`
    positions and copies the filled part once. `reorder_cache` and `adopt` make new buffers."""

    def __init__(self, reserve: int) -> None:
        super().__init__()
        self.reserve = reserve
        self._key_buffer: Tensor | None = None
        self._value_buffer: Tensor | None = None
        self._length = 0

    def _fits(self, new: Tensor) -> bool:
        buffer = self._key_buffer
        return (self._viewing() and buffer is not None and buffer.shape[0] == new.shape[0]
                and self._length + new.shape[-2] <= buffer.shape[-2])

    def _grow(self, key_states: Tensor, value_states: Tensor) -> None:
        filled = self.get_seq_length()
        shape = (*key_states.shape[:-2], filled + key_states.shape[-2] + self.reserve, key_states.shape[-1])
        self._key_buffer = key_states.new_empty(shape)
        self._value_buffer = value_states.new_empty((*shape[:-1], value_states.shape[-1]))
        if filled:
            self._key_buffer[:, :, :filled] = self.keys
            self._value_buffer[:, :, :filled] = self.values
        self._length = filled

    def adopt(self, keys: Tensor, values: Tensor) -> None:
        """Hold (N, heads, L, d) `keys` and `values` as the filled part of new buffers with room for
        `reserve` more positions."""
        shape = (*keys.shape[:-2], keys.shape[-2] + self.reserve, keys.shape[-1])
        self._key_buffer, self._value_buffer = keys.new_empty(shape), values.new_empty((*shape[:-1], values.shape[-1]))
        self._key_buffer[:, :, : keys.shape[-2]] = keys
        self._value_buffer[:, :, : values.shape[-2]] = values
        self._length = keys.shape[-2]
        self.keys, self.values = self._key_buffer[:, :, : self._length], self._value_buffer[:, :, : self._length]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep the rows `beam_idx` (in that order, repeats allowed), gathered straight into new buffers
        with the same room after the filled part (one copy; the next update writes in place)."""
        if self.get_seq_length() == 0:
            return
        idx = beam_idx.to(self.keys.device)
        length, keys, values = self.get_seq_length(), self.keys, self.values
        room = self._key_buffer.shape[-2] - length if self._viewing() else self.reserve  # type: ignore[union-attr]
        shape = (idx.shape[0], keys.shape[1], length + room, keys.shape[-1])
        self._key_buffer, self._value_buffer = keys.new_empty(shape), values.new_empty((*shape[:-1], values.shape[-1]))
        torch.index_select(keys, 0, idx, out=self._key_buffer[:, :, :length])
        torch.index_select(values, 0, idx, out=self._value_buffer[:, :, :length])
        self._length = length
        self.keys, self.values = self._key_buffer[:, :, :length], self._value_buffer[:, :, :length]

    def _viewing(self) -> bool:
        """Whether keys and values are the views of the buffers' filled part."""
        return (self._key_buffer is not None and self.keys is not None
                and self.keys.data_ptr() == self._key_buffer.data_ptr() and self.keys.shape[-2] == self._length)

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Append (N, heads, t, d) keys and values; return the filled (N, heads, length, d) views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if not self._fits(key_states):
            self._grow(key_states, value_states)
        assert self._key_buffer is not None and self._value_buffer is not None
        end = self._length + key_states.shape[-2]
        self._key_buffer[:, :, self._length:end] = key_states
        self._value_buffer[:, :, self._length:end] = value_states
        self._length = end
        self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
        return self.keys, self.values


class ReservedCache(DynamicCache):
    """A `DynamicCache` of `ReservedLayer`s, each with room for `reserve` more positions."""

    def __init__(self, reserve: int) -> None:
        Cache.__init__(self, layer_class_to_replicate=lambda: ReservedLayer(reserve))


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
