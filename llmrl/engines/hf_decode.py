"""The `hf` engine's decoding loop after a prefill: one (n, 1) forward per new token, where n counts
only the rows still running.

A row that draws a stop token is done: its later outputs are pads with mask 0 and log μ 0. With
`Drawing.drop_finished` (the default) it also leaves the batch before the next forward: its rows of
the KV cache, the attention mask and the position ids are dropped (the cache's `reorder_cache`
gathers the rows left), so a batch whose answers mostly stop early no
longer pays for its longest one on every row. Each row draws from its own uniforms (`uniforms[row,
t]`, keyed per row), so the tokens a row draws do not depend on which rows still run beside it; the
logits do only through float rounding, where a matrix product's kernel depends on the number of rows
(MKL's and oneDNN's do: a near-tie may then part; docs/engines.md has what that measured).

When the caller keeps the cache (`Drawing.keep_cache`: an episode's next turn continues from it,
`engines/hf_turns.py`), the rows that leave are set aside (their filled positions, one copy) and put
back at the end: every row then has the same cache length, the positions a row did not feed being
holes (zeros, which the next turn masks out). Without dropping (`drop_finished` off, or a sharded base
where every forward is a collective that each process must join the same number of times) a finished
row is fed its stop token and then pads until the batch's longest answer ends, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from transformers import DynamicCache

from ..models.prefix import with_cache
from ..models.stack import tempered, token_logprobs
from .base import Generation


@dataclass(frozen=True)
class Drawing:
    """How `decode` draws: up to `max_new_tokens` per row, ending a row at its first id of `eos_id`
    (which its mask includes), padding with `pad_id`; from softmax(logits / temperature) cut to the
    top-p nucleus with `uniforms` (N, max_new_tokens) (None: greedy); `logprobs`: also log μ of each
    drawn token; `all_done(finished here) -> stop` (a sharded base stops only when every process is
    done); `drop_finished`: finished rows leave the batch; `keep_cache`: the caller continues from the
    cache, so rows that left are put back into it at the end."""

    max_new_tokens: int
    eos_id: int | Sequence[int]
    pad_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    uniforms: Tensor | None = None
    logprobs: bool = False
    all_done: Callable[[bool], bool] | None = None
    drop_finished: bool = True
    keep_cache: bool = False


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


class Outputs:
    """The (N, T) tokens, mask and log μ of a decoding, written column by column for the rows still in
    the batch (`rows`: their indices in the whole batch); pads, mask 0 and log μ 0 elsewhere."""

    def __init__(self, n: int, drawing: Drawing, device: torch.device) -> None:
        t = drawing.max_new_tokens
        self.tokens = torch.full((n, t), drawing.pad_id, dtype=torch.long, device=device)
        self.mask = torch.zeros((n, t), dtype=torch.bool, device=device)
        self.logprobs: Tensor | None = None
        self.width = 0

    def write(self, rows: Tensor, t: int, token: Tensor, live: Tensor, lp: Tensor | None) -> None:
        """Column t for `rows`: their tokens, whether each was still running (`live`), their log μ."""
        self.tokens[rows, t] = token
        self.mask[rows, t] = live
        if lp is not None:
            if self.logprobs is None:
                self.logprobs = torch.zeros(self.tokens.shape, dtype=lp.dtype, device=lp.device)
            self.logprobs[rows, t] = torch.where(live, lp, torch.zeros_like(lp))
        self.width = t + 1

    def generation(self) -> Generation:
        w = self.width
        return Generation(self.tokens[:, :w], self.mask[:, :w], None if self.logprobs is None else self.logprobs[:, :w])


class SetAside:
    """The cache rows of the rows that left the batch, to put back at the end (`Drawing.keep_cache`)."""

    def __init__(self) -> None:
        self.parts: list[tuple[Tensor, list[tuple[Tensor, Tensor]]]] = []  # (batch rows, per layer (keys, values))

    def take(self, cache: DynamicCache, leaving: Tensor, rows: Tensor) -> None:
        """Copy the filled positions of cache rows `leaving` (whole-batch rows `rows[leaving]`)."""
        self.parts.append((rows[leaving], [(layer.keys[leaving], layer.values[leaving]) for layer in cache.layers]))

    def put_back(self, cache: DynamicCache, rows: Tensor, n: int) -> None:
        """Make `cache` hold all n rows again: the rows still in it at `rows`, each set-aside row at its
        own index, its positions after it left zeros (holes: the caller's attention masks them)."""
        if not self.parts:
            return
        for i, layer in enumerate(cache.layers):
            keys = layer.keys.new_zeros((n, *layer.keys.shape[1:]))
            values = layer.values.new_zeros((n, *layer.values.shape[1:]))
            keys[rows], values[rows] = layer.keys, layer.values
            for left, per_layer in self.parts:
                k, v = per_layer[i]
                keys[left, :, : k.shape[-2]], values[left, :, : v.shape[-2]] = k, v
            layer.keys, layer.values = keys, values


def decode(model: Any, logits: Tensor, cache: DynamicCache, attention: Tensor, position: Tensor,
           drawing: Drawing) -> Generation:
    """The decoding loop of `hf.generate` after its prefill: `logits` (N, 1, V) of each row's last fed
    position, `cache` holding every fed position, `attention` (N, L) long over them, `position`
    (N, 1) the last fed token's position id. Token t is fed (its keys and values cached, at the
    next position) only when another token is drawn after it: a Generation of T tokens leaves at
    most T − 1 of them in the cache (`engines/hf_turns.py` continues from there); with
    `drop_finished`, a row's stop token is never fed (the module docstring)."""
    n, d = logits.shape[0], drawing
    rows = torch.arange(n, device=logits.device)  # the whole-batch index of each row still in the batch
    done = torch.zeros(n, dtype=torch.bool, device=logits.device)  # per row in the batch: has stopped
    stop = torch.as_tensor(d.eos_id, device=logits.device).reshape(-1)
    out, aside = Outputs(n, d, logits.device), SetAside()
    for t in range(d.max_new_tokens):
        u = None if d.uniforms is None else d.uniforms[rows.to(d.uniforms.device), t]
        token = pick_tokens(logits[:, -1].float(), d.temperature, d.top_p, u)
        token = torch.where(done, torch.full_like(token, d.pad_id), token)
        lp = token_logprobs(tempered(logits[:, -1], d.temperature), token) if d.logprobs else None
        out.write(rows, t, token, ~done, lp)
        done = done | torch.isin(token, stop)
        finished = bool(done.all())
        if (finished if d.all_done is None else d.all_done(finished)) or t == d.max_new_tokens - 1:
            break
        if d.drop_finished and bool(done.any()):
            if d.keep_cache:
                aside.take(cache, done, rows)
            staying = (~done).nonzero().squeeze(1)
            cache.reorder_cache(staying)
            attention, position, token, rows, done = (x[staying] for x in (attention, position, token, rows, done))
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        position = position + 1
        logits = model(
            input_ids=token[:, None], attention_mask=attention, position_ids=position, **with_cache(model, cache)
        ).logits
    if d.keep_cache:
        aside.put_back(cache, rows, n)
    return out.generation()
