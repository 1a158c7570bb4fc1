"""Batched sampling with the KV cache, and world-size-independent randomness.

Every row draws its random numbers from its own generator seeded by (seed, step, prompt index,
sample index), so the same prompt gets the same completion whichever process, batch position or
micro-batch it lands in. Tokens are drawn by inverse-CDF with those uniforms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor
from transformers import DynamicCache

from ..models.prefix import distinct_prompts, shared_prefill, with_cache
from ..models.stack import PolicyStack, tempered, token_logprobs

_MIX = (1_000_003, 10_007, 101, 7)

# Set by fsdp.shard_base (a DistContext): with a sharded base every forward is a collective, so
# decoding stops only when every row of every process is done. None: stop when this batch is done.
LOCKSTEP = None


def _all_done(done: Tensor) -> bool:
    finished = bool(done.all())
    return finished if LOCKSTEP is None else not LOCKSTEP.any(not finished)


def row_uniforms(seed: int, step: int, prompt_index: Tensor, sample_index: Tensor, n: int) -> Tensor:
    """(N, n) uniforms in [0, 1); row i depends only on (seed, step, prompt_index[i], sample_index[i])."""
    rows = []
    for p, s in zip(prompt_index.tolist(), sample_index.tolist()):
        key = (seed * _MIX[0] + step * _MIX[1] + p * _MIX[2] + s * _MIX[3]) % (2**63 - 1)
        rows.append(torch.rand(n, generator=torch.Generator().manual_seed(key), dtype=torch.float64))
    return torch.stack(rows)


def pick_tokens(logits: Tensor, temperature: float, top_p: float, uniforms: Tensor | None) -> Tensor:
    """One token per row: argmax when `uniforms` is None, else an inverse-CDF draw from
    softmax(logits / temperature) restricted to the smallest top-p nucleus. (N, V), (N,) → (N,).

    With top_p = 1 the CDF runs in vocabulary order; a nucleus needs the tokens sorted by
    probability, which costs more than a decoding step of a small model at a 50k vocabulary."""
    if uniforms is None:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p >= 1.0:
        return _inverse_cdf(probs, uniforms)
    sorted_p, order = probs.sort(-1, descending=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p  # the most likely token is always kept
    return order.gather(-1, _inverse_cdf(sorted_p * keep, uniforms).unsqueeze(-1)).squeeze(-1)


def _inverse_cdf(weights: Tensor, uniforms: Tensor) -> Tensor:
    """The index i with cdf[i-1] ≤ u · total < cdf[i] per row: (N, V) non-negative, (N,) → (N,)."""
    cdf = weights.cumsum(-1)
    target = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).clamp(max=cdf.shape[-1] - 1).squeeze(-1)


@dataclass(frozen=True)
class Generation:
    """response_ids (N, T) right-padded with pad after the first EOS; response_mask (N, T) bool,
    True up to and including the first EOS; logprobs (N, T) log π(a_t|s_t) of the drawn tokens
    (log softmax(logits / temperature), 0 where masked) when asked for, else None."""

    response_ids: Tensor
    response_mask: Tensor
    logprobs: Tensor | None = None


@torch.no_grad()
def generate(
    stack: PolicyStack,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    *,
    max_new_tokens: int,
    eos_id: int | Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    uniforms: Tensor | None = None,
    logprobs: bool = False,
) -> Generation:
    """Decode up to `max_new_tokens` per row with the model's KV cache, in the caller's role.

    `uniforms` (N, max_new_tokens) drives sampling; None means greedy. Stops early once every row
    has emitted EOS. `logprobs`: also return each drawn token's log-probability under the full
    (untruncated) tempered policy, computed from the decoding logits in at least float32 exactly as
    a full forward computes it (`stack.token_logprobs`), so it serves as log π_old. With
    `stack.share_prompts`, each distinct prompt is prefilled once and its cache shared by its
    samples (models/prefix.py). `eos_id`: one stop id or several (`models.tokenizer.stop_token_ids`);
    a row ends at its first, which its mask includes.
    """
    model = stack.lm
    attention = prompt_mask.long()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    groups = distinct_prompts(prompt_ids, prompt_mask) if stack.share_prompts else None
    logits = shared_prefill(model, prompt_ids, attention, positions, cache, groups)
    n = prompt_ids.shape[0]
    done = torch.zeros(n, dtype=torch.bool, device=prompt_ids.device)
    stop = torch.as_tensor(eos_id, device=prompt_ids.device).reshape(-1)
    tokens, masks, lps = [], [], []
    position = positions[:, -1:]
    for t in range(max_new_tokens):
        u = None if uniforms is None else uniforms[:, t]
        token = pick_tokens(logits[:, -1].float(), temperature, top_p, u)
        token = torch.where(done, torch.full_like(token, pad_id), token)
        if logprobs:
            lp = token_logprobs(tempered(logits[:, -1], temperature), token)
            lps.append(torch.where(done, torch.zeros_like(lp), lp))
        masks.append(~done)
        tokens.append(token)
        done = done | torch.isin(token, stop)
        if _all_done(done) or t == max_new_tokens - 1:
            break
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        position = position + 1
        logits = model(
            input_ids=token[:, None], attention_mask=attention, position_ids=position, **with_cache(model, cache)
        ).logits
    return Generation(torch.stack(tokens, dim=1), torch.stack(masks, dim=1),
                      torch.stack(lps, dim=1) if logprobs else None)
