"""The response tokens' log-probabilities and entropies without a (rows, tokens, vocabulary) tensor.

For every response position t of every row, with h_t the last hidden state (H,), W the LM head
(V, H) and τ the sampling temperature:

    z_t = W h_t / τ                     (V,)  float32 (float64 for a float64 model)
    log π(a_t | s_t) = log_softmax(z_t)[a_t]
    H_t = −Σ_v π_v log π_v

At a 152k vocabulary (Qwen2.5) the logits of one 32-row × 64-token minibatch are 1.2 GB per copy,
and the update keeps several (logits, log-softmax, their gradients). `token_stats` therefore runs
the head over the response positions in chunks of at most `chunk` positions and keeps only the
(positions,) results; with gradients on, each chunk is a `torch.utils.checkpoint` region, so its
backward recomputes the chunk's logits instead of keeping them (the technique of TRL's
`selective_log_softmax` for the forward, of fused linear-cross-entropy kernels for the backward;
here the loss on log π is any policy loss, so the chunk's gradient cannot be formed in the forward
and the head runs twice per chunk: one extra head product per trained token). Only positions inside
`mask` are computed; the others hold 0.

When every position fits in one chunk (the built-in models' vocabularies), the head runs once over
the whole (N, T) batch exactly as before chunking existed: the same operations, the same bits.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..losses import entropy_from_logprobs

CHUNK_MIB = 64.0
"""Default float32 logits computed at once, in MiB (`model.logits_chunk_mib`): 110 positions at
Qwen2.5's vocabulary of 151,936, 341 at SmolLM2's 49,152, the whole batch for the built-in models."""


def chunk_positions(chunk_mib: float, vocab: int) -> int:
    """How many positions' float32 logits fit in `chunk_mib` MiB (at least 1); 0 MiB: no limit."""
    if chunk_mib <= 0:
        return 2**62
    return max(1, int(chunk_mib * 2**20) // (4 * vocab))


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision and float32 models; float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


def tempered(logits: Tensor, temperature: float) -> Tensor:
    """logits / T in at least float32, (…, V); at T = 1 no (…, V) copy is made (x / 1 == x)."""
    logits = logits.to(at_least_float32(logits.dtype))
    return logits if temperature == 1.0 else logits / temperature


def _stats(head: nn.Module, h: Tensor, tokens: Tensor, temperature: float, entropy: str) -> tuple[Tensor, Tensor]:
    """(log π(tokens), H or an empty tensor) of hidden states h (…, H) and tokens (…); `entropy`:
    'off', 'logged' (no graph) or 'trained'."""
    logp = torch.log_softmax(tempered(head(h), temperature), dim=-1)
    lp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if entropy == "off":
        return lp, lp.new_empty(0)
    with torch.set_grad_enabled(entropy == "trained" and torch.is_grad_enabled()):
        return lp, entropy_from_logprobs(logp)


def token_stats(head: nn.Module, h: Tensor, tokens: Tensor, mask: Tensor, temperature: float,
                chunk: int, entropy: str = "off") -> tuple[Tensor, Tensor | None]:
    """log π(a_t|s_t) (N, T) and, unless `entropy` is 'off', H_t (N, T) from hidden states h (N, T, H).

    tokens (N, T) long, mask (N, T) bool; `entropy` 'logged' computes H without a graph, 'trained'
    with one. At most `chunk` positions' logits exist at once (see the module's docstring);
    gradients flow to h and to the head's trainable parameters, if any."""
    n, t = tokens.shape
    if n * t <= chunk:  # one chunk: the whole batch at once, every position as before
        lp, ent = _stats(head, h, tokens, temperature, entropy)
        return lp, (None if entropy == "off" else ent)
    where = mask.reshape(-1)
    hv, tv = h.reshape(n * t, -1)[where], tokens.reshape(-1)[where]  # (M, H), (M,): the positions that count
    lps, ents = [], []
    for start in range(0, hv.shape[0], chunk):
        hc, tc = hv[start : start + chunk], tv[start : start + chunk]
        if torch.is_grad_enabled() and (hc.requires_grad or any(p.requires_grad for p in head.parameters())):
            lp, ent = checkpoint(_stats, head, hc, tc, temperature, entropy, use_reentrant=False)
        else:
            lp, ent = _stats(head, hc, tc, temperature, entropy)
        lps.append(lp)
        ents.append(ent)
    dtype = at_least_float32(h.dtype)

    def scatter(parts: list[Tensor]) -> Tensor:
        flat = torch.cat(parts) if parts else h.new_zeros(0, dtype=dtype)
        return torch.zeros(n * t, dtype=dtype, device=h.device).masked_scatter(where, flat).reshape(n, t)

    return scatter(lps), (None if entropy == "off" else scatter(ents))
