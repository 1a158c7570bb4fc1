"""The `hf` engine across turns: every episode's KV cache is kept, and a turn prefills only what
was added since the last one (the token the loop drew last, which was never fed, and the
environment's answer), instead of the whole conversation again.

The cache is one (N, heads, L, d) batch per layer; `slots[r]` says which token each of row r's L
positions holds, or None for a hole: a left pad, or a position after the row's turn had ended (a
finished row leaves the decoding batch and is put back with zeros there, `hf_decode.py`; without
dropping it is fed its stop token and then pads until the batch's longest answer ends). Holes stay in
the cache with attention mask 0. A new turn of episode e with ids `seq` so far:

    1. rows of the episodes still playing are gathered (`reorder_cache`: ended episodes leave);
    2. `seq` is matched against the row's slots in order: positions whose token is seq's next one
       are kept; from the first that differs (a turn cut at its room by the caller) every later
       position is a hole too, since it was computed attending to it;
    3. the rest of `seq` (≥ 1 token: when all of it is cached, the last kept position becomes a hole
       and is fed again to get its logits) is fed in one (N, S) block, left-padded with holes, at
       position ids continuing each row's count of kept tokens;
    4. `hf_decode.decode` draws the turn from those logits, as `hf.generate` does after its prefill.

Position ids count kept tokens only, so every token sits where a fresh left-padded prefill of `seq`
puts it and attends to the same keys; the numbers differ from a fresh prefill only by float rounding
(other matmul shapes). Turn 0 is `hf.generate` itself, with the engine's settings (`HFEngine.pack`), so
one-turn episodes are the single-turn rollout bit for bit; the later turns, a few tokens each, decode
through the plain products (packing the weights again at every turn would cost more than it saves).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from transformers import DynamicCache

from ..models.decoding import skinny_head
from ..models.prefix import opened, with_cache
from .base import Generation, SamplingSettings
from .hf_decode import Drawing, decode
from .turns import left_pad

Slots = list[int | None]


def match(slots: Slots, seq: Sequence[int]) -> tuple[list[int], int]:
    """(keep, n): keep[k] = 1 where cache position k holds seq's next token (in order, up to the first
    cached token that differs from it), and n, the number of seq's tokens so held."""
    keep, n, broken = [], 0, False
    for token in slots:
        ok = not broken and token is not None and n < len(seq) and seq[n] == token
        broken = broken or (token is not None and not ok)
        keep.append(int(ok))
        n += ok
    return keep, n


def prefilled_slots(ids: Tensor, mask: Tensor, opening: int) -> list[Slots]:
    """Per row of left-padded prompts (N, P), the token at each cache position after `generate`'s
    prefill with a k-token opening (`models/prefix.opened`: the opening once, then each row's
    columns with its own copy hidden), None for a hole."""
    r, attention = opened(mask, opening)
    first = ids.shape[1] - int(mask[0].sum())
    columns = torch.cat([ids[:1, first : first + opening].expand(ids.shape[0], -1), ids[:, ids.shape[1] - r :]], dim=1)
    return [[t if a else None for t, a in zip(c, at)] for c, at in zip(columns.tolist(), attention.tolist())]


@dataclass(frozen=True)
class DecodingLoop:
    """What the turns take from the `hf` engine's module, handed over by the engine (`HFEngine.turn_decoder`)
    so that this module does not import it: `generate` (prefill + decode, turn 0) and `key_uniforms`
    (a row's sampling key → its uniforms)."""

    generate: Callable[..., Generation]
    key_uniforms: Callable[[Tensor, int], Tensor]
    prefill_plan: Callable[..., tuple[Any, int]]  # (distinct prompts, the opening's k) of generate's prefill


class CachedTurns:
    """`TurnDecoder` of the `hf` engine for one episode batch (`engines/turns.py`). `engine`: the
    `HFEngine` (its stack, stop and pad ids, collectives, `acting`, `pack`); `loop`: its decoding loop."""

    def __init__(self, engine: Any, role: str, loop: DecodingLoop) -> None:
        self.engine, self.role, self.loop = engine, role, loop
        self.cache: DynamicCache | None = None
        self.order: list[int] = []  # the episode of each cache row
        self.slots: list[Slots] = []  # per cache row: the token at each cache position, None for a hole

    def turn(self, episodes: Sequence[int], sequences: Sequence[list[int]], settings: SamplingSettings,
             keys: Tensor | None, *, logprobs: bool, room: Tensor | None) -> Generation:
        """The next turn of `episodes` from their ids so far (`TurnDecoder.turn`); `room` is the caller's to cut."""
        engine, stack = self.engine, self.engine.stack
        device = stack.lm.device
        uniforms = None if keys is None else self.loop.key_uniforms(keys, settings.max_new_tokens).to(device)
        with engine.acting(self.role):
            if self.cache is None:
                self.cache = DynamicCache()
                ids, mask = left_pad(sequences, engine.pad_id)
                gen = self.loop.generate(stack, ids.to(device), mask.to(device), max_new_tokens=settings.max_new_tokens,
                               eos_id=engine.stop_ids, pad_id=engine.pad_id, temperature=settings.temperature,
                               top_p=settings.top_p, uniforms=uniforms, logprobs=logprobs,
                               all_done=engine.dist.all_done, cache=self.cache, pack=engine.pack,
                               drop_finished=engine.dropping)  # the rollout's path
                self.slots = prefilled_slots(ids, mask, self.loop.prefill_plan(stack, ids.to(device), mask.to(device))[1])
            else:
                gen = self._continue(episodes, sequences, settings, uniforms, logprobs)
        self.order = list(episodes)
        self._fed(gen, engine.dropping)
        return gen

    def _fed(self, gen: Generation, dropped: bool) -> None:
        """Extend each row's slots by the positions the turn fed: T − 1 (the last drawn token was never
        fed), each a drawn token or a hole; with `dropped` a row's tokens from its stop token on are
        holes (it left the batch before feeding it), else only the pads after it."""
        fed = gen.response_ids.shape[1] - 1
        lengths = gen.response_mask.sum(-1).tolist()
        for r, (row, live) in enumerate(zip(gen.response_ids[:, :fed].tolist(), gen.response_mask[:, :fed].tolist())):
            cut = lengths[r] - 1 if dropped else fed
            self.slots[r] += [t if m and c < cut else None for c, (t, m) in enumerate(zip(row, live))]

    def _continue(self, episodes: Sequence[int], sequences: Sequence[list[int]], settings: SamplingSettings,
                  uniforms: Tensor | None, logprobs: bool) -> Generation:
        """Steps 1-4 of the module's docstring for a turn after the first."""
        assert self.cache is not None
        engine, model = self.engine, self.engine.stack.lm
        rows = [self.order.index(e) for e in episodes]
        self.cache.reorder_cache(torch.tensor(rows, device=model.device))
        kept, pending, counts = [], [], []
        for r, seq in zip(rows, sequences):
            keep, n = match(self.slots[r], seq)
            if n == len(seq):  # all of it cached: feed its last token again for the logits after it
                keep[max(k for k, v in enumerate(keep) if v)] = 0
                n -= 1
            kept.append(keep)
            pending.append(list(seq[n:]))
            counts.append(n)
        ids, mask = left_pad(pending, engine.pad_id)
        attention = torch.cat([torch.tensor(kept, dtype=torch.long), mask.long()], dim=1).to(model.device)
        positions = (torch.tensor(counts).unsqueeze(1) + mask.long().cumsum(-1) - 1).clamp(min=0).to(model.device)
        self.slots = [[t if k else None for t, k in zip(self.slots[r], keep)] + [t if m else None for t, m in zip(i, ms)]
                      for r, keep, i, ms in zip(rows, kept, ids.tolist(), mask.tolist())]
        with skinny_head(model):  # unpacked: a turn of a few tokens would pack again (models/packed.py)
            logits = model(input_ids=ids.to(model.device), attention_mask=attention, position_ids=positions,
                           logits_to_keep=1, **with_cache(model, self.cache)).logits
            drawing = Drawing(settings.max_new_tokens, engine.stop_ids, engine.pad_id, settings.temperature,
                              settings.top_p, uniforms, logprobs, engine.dist.all_done,
                              drop_finished=engine.dropping, keep_cache=True)
            return decode(model, logits, self.cache, attention, positions[:, -1:], drawing)
