"""The plan's parts: one formula each, in bytes, from a ModelShape and the run's settings.

Notation: L layers, H hidden, I intermediate, q = n_h·d_head, k = n_kv·d_head, V vocabulary, b the bytes
of model.dtype, r lora.r, P the longest prompt and T the response budget (S = P + T tokens a row), N rows.

Per-token activations of the update (`update_bytes_per_token`), what one decoder layer's gradient forward
keeps for its backward with LoRA on every linear (frozen weights keep no input, a LoRA A keeps its input
and its r outputs): the two RMSNorms' inputs and outputs 4H, attention's q, k, v before and after rotary and
its output ≈ 3q + 2k, the MLP's gate, up, SiLU and product 4I, in `b` bytes; on a half-precision base the
LoRA inputs and the norms' float32 upcasts add (4H + q + I)·4 bytes:

    a = L · ((4H + 3q + 2k + 4I)·b + 4·r·n_targets [+ (4H + q + I)·4 when b < 4])

Calibrated against update_fit's probe (run/update_fit.probe_bytes_per_token, which measures the real
saved tensors once the model is loaded, and which the fit still uses): the tiny model (float32) 6.8 KB a
layer and token against 7.2 KB measured (−5 %), SmolLM2-135M (bfloat16) 39.2 KB against 37.4 KB (+5 %).
With activation checkpointing a layer keeps only its input: a = L·H·b + one layer's a (the recompute).
The process holds more than the saved tensors (the backward's gradients of the layer it is in, the
allocator's blocks): ACT_SLACK below, from measured peaks (plan.py).
"""

from __future__ import annotations

import math

from .shape import ModelShape

FLOAT32 = 4
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # codes, 8-bit absmax per block of 64, float32 absmax per 256 blocks
ADAMW_STATES = 2  # exp_avg, exp_avg_sq: float32 each
ACT_SLACK = 1.6  # process memory over saved tensors in the update (run/update_fit.py measured 1.6× at 1.5B)


def base_bytes(shape: ModelShape, dtype_bytes: int, four_bit: bool) -> int:
    """The base as held: every number in model.dtype, or the decoder's linear weights as 4-bit codes and
    scales (models/quantized.py) with the embedding, LM head and norms in model.dtype."""
    if four_bit:
        return int(shape.linear_numbers * NF4_BYTES) + shape.other * dtype_bytes
    return shape.numbers * dtype_bytes


def targets(shape: ModelShape, names: list[str] | None) -> list[tuple[str, int, int]]:
    """One layer's linears LoRA adapts: all of them ('all-linear'), else those whose leaf is named."""
    return [t for t in shape.linears if names is None or t[0] in names]


def lora_numbers(shape: ModelShape, rank: int, names: list[str] | None, layers: int | None = None) -> int:
    """Σ r·(in + out) over the targeted linears of `layers` layers (default: all L)."""
    return (layers or shape.layers) * sum(rank * (i + o) for _, i, o in targets(shape, names))


def kv_bytes(shape: ModelShape, rows: int, tokens: int, dtype_bytes: int) -> int:
    """KV cache of `rows` rows of `tokens` tokens: N · S · 2 · L · k · b."""
    return rows * tokens * 2 * shape.layers * shape.kv_dim * dtype_bytes


def logits_bytes(shape: ModelShape, positions: int) -> int:
    """Float32 logits and their log-softmax at `positions` positions: 2 · 4 · V each."""
    return positions * 2 * FLOAT32 * shape.vocab


def layer_bytes(shape: ModelShape, rows: int, tokens: int, dtype_bytes: int) -> int:
    """One decoder layer's no-grad intermediates over N rows of S tokens (a forward frees a layer's before the
    next): N · S · (2H + q + 2k + 3I) · b."""
    s = shape
    return rows * tokens * (2 * s.hidden + s.q_dim + 2 * s.kv_dim + 3 * s.intermediate) * dtype_bytes


def update_bytes_per_token(shape: ModelShape, dtype_bytes: int, rank: int, names: list[str] | None,
                           checkpointing: bool) -> float:
    """a: bytes one token keeps for the update's backward (module docstring's formula)."""
    s, n = shape, len(targets(shape, names))
    layer = (4 * s.hidden + 3 * s.q_dim + 2 * s.kv_dim + 4 * s.intermediate) * dtype_bytes + FLOAT32 * rank * n
    if dtype_bytes < FLOAT32:
        layer += (4 * s.hidden + s.q_dim + s.intermediate) * FLOAT32
    return s.layers * s.hidden * dtype_bytes + layer if checkpointing else s.layers * layer


def chunk_positions(chunk_mib: float, vocab: int) -> int:
    """Positions whose float32 logits fit in `chunk_mib` MiB (models/logprobs.chunk_positions)."""
    return 2**62 if chunk_mib <= 0 else max(1, int(chunk_mib * 2**20) // (FLOAT32 * vocab))


def logits_held(shape: ModelShape, positions: int, chunk_mib: float) -> int:
    """The logits a log-prob forward or the update holds: all `positions` when they fit one chunk, else three
    chunks (one being computed, its log-softmax, one recomputed in the backward)."""
    chunk = chunk_positions(chunk_mib, shape.vocab)
    return logits_bytes(shape, positions) if positions <= chunk else 3 * chunk * FLOAT32 * shape.vocab


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b else a


def checkpoint_bytes(trainable: int) -> int:
    """A checkpoint's state serialised in memory before it is written (run/checkpoint.py): the trainable
    weights and AdamW's two states as safetensors/torch.save bytes, 3 · 4 bytes a trainable number."""
    return (1 + ADAMW_STATES) * FLOAT32 * trainable


def mib(n: float) -> float:
    return n / 2**20


def rounded_up(n: int, block: int) -> int:
    return math.ceil(n / block) * block
