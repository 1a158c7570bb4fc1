"""The `hf` engine: batched decoding with the model's KV cache, straight from the policy stack.

Every row draws its random numbers from its own generator seeded by its key (`base.row_keys`:
seed, step, prompt index, sample index), so the same prompt gets the same completion whichever
process, batch position or micro-batch it lands in. Tokens are drawn by inverse CDF with those
uniforms. The engine samples from the stack's current adapters, so `sync` has nothing to do.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor
from transformers import DynamicCache

from ..models.decoding import skinny_head
from ..models.merged import mergeable, merged_actor, merged_size
from ..models.packed import packable, packed_linears, packed_size
from ..models.quantized import four_bit_layers
from ..models.prefix import PromptGroups, distinct_prompts, shared_prefill
from ..models.stack import PolicyStack
from ..models.tokenizer import stop_token_ids
from ..parallel.distributed import SINGLE, DistContext
from .base import Generation, GenerationRequest, register_engine, row_keys
from .hf_decode import Drawing, decode, pick_tokens  # noqa: F401  (pick_tokens: the sampler, also imported from here)
from .hf_turns import CachedTurns, DecodingLoop


def key_uniforms(keys: Tensor, n: int) -> Tensor:
    """(N, n) float64 uniforms in [0, 1); row i is drawn from a generator seeded with keys[i] alone."""
    return torch.stack([torch.rand(n, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
                        for k in keys.tolist()])


def row_uniforms(seed: int, step: int, prompt_index: Tensor, sample_index: Tensor, n: int) -> Tensor:
    """(N, n) uniforms in [0, 1); row i depends only on (seed, step, prompt_index[i], sample_index[i])."""
    return key_uniforms(row_keys(seed, step, prompt_index, sample_index), n)


@contextmanager
def decoding_kernels(model: Any, rows: int, pack: bool) -> Iterator[None]:
    """The products a decoding of `rows` rows runs on: every linear layer on a prepacked weight when
    `pack` and the model allow (models/packed.py), and an LM head left plain as W · xᵀ (models/decoding.py)."""
    with (packed_linears(model, rows) if pack else nullcontext()), skinny_head(model):
        yield


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
    all_done: Callable[[bool], bool] | None = None,
    cache: DynamicCache | None = None,
    pack: bool = False,
    drop_finished: bool = True,
) -> Generation:
    """Decode up to `max_new_tokens` per row with the model's KV cache, in the caller's role.

    `uniforms` (N, max_new_tokens) drives sampling; None means greedy. Stops early once every row
    has emitted EOS. `logprobs`: also return each drawn token's log-probability under the full
    (untruncated) tempered policy, computed from the decoding logits in at least float32 exactly as
    a full forward computes it (`stack.token_logprobs`), so it serves as log π_old. With
    `stack.share_prompts`, each distinct prompt is prefilled once and its cache shared by its
    samples (models/prefix.py). `eos_id`: one stop id or several (`models.tokenizer.stop_token_ids`);
    a row ends at its first, which its mask includes. `all_done(finished here) -> stop`: with a
    sharded base every forward is a collective, so decoding stops only when every process is done
    (`DistContext.all_done`). `cache`: an empty cache to decode into, which the caller keeps
    (`engines/hf_turns.py`), so rows that finished are put back into it at the end; by default a
    fresh one. `pack`: decode through prepacked copies of the linear weights where the model allows
    (models/packed.py). `drop_finished`: a row that has stopped leaves the batch (engines/hf_decode.py).
    """
    model = stack.lm
    attention = prompt_mask.long()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    groups, opening = prefill_plan(stack, prompt_ids, prompt_mask)
    drawing = Drawing(max_new_tokens, eos_id, pad_id, temperature, top_p, uniforms, logprobs, all_done,
                      drop_finished=drop_finished, keep_cache=cache is not None)
    cache = DynamicCache() if cache is None else cache
    with decoding_kernels(model, prompt_ids.shape[0], pack):
        logits, attention = shared_prefill(model, prompt_ids, attention, positions, cache, groups, opening)
        return decode(model, logits, cache, attention, positions[:, -1:], drawing)


def prefill_plan(stack: PolicyStack, prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[PromptGroups | None, int]:
    """How `generate` prefills (N, P) prompts: the distinct prompts computed once (None: each row's
    own) and the opening every prompt starts with, k tokens computed once before them (0: none);
    both only with `stack.share_prompts` (models/prefix.py). What the cache then holds: `opened`."""
    if not stack.share_prompts:
        return None, 0
    groups = distinct_prompts(prompt_ids, prompt_mask)
    return groups, stack.opening(prompt_ids, prompt_mask, groups)


@dataclass
class HFEngine:
    """Decodes from the policy stack itself under the request's role (`generate` above)."""

    stack: PolicyStack
    stop_ids: int | Sequence[int]  # the tokenizer's EOS and the generation config's end-of-turn ids
    pad_id: int
    dist: DistContext = SINGLE
    name: str = "hf"
    own_weights: bool = False  # samples from the stack itself: its decoding log-probs are log π_old
    merge: bool = True  # decode the actor through W + s·B·A (models/merged.py) where it is `mergeable`
    pack: bool = True  # decode through prepacked linear weights (models/packed.py) where the model allows
    drop_finished: bool = True  # a finished row leaves the batch (hf_decode.py); never with a sharded base

    @property
    def dropping(self) -> bool:
        """Whether finished rows leave the batch: not with a sharded base, whose every forward is a
        collective each process joins the same number of times (`DistContext.lockstep`)."""
        return self.drop_finished and not self.dist.lockstep

    @contextmanager
    def acting(self, role: str, rows: int | None = None) -> Iterator[None]:
        """Decode as `role`: the actor through its merged weights when `merge` and the stack allow
        (models/merged.py), any other role (or an actor that cannot merge) through the stack's adapters.
        `rows`: a decoding of that many rows that packs its weights: the merged weights are made
        straight into their packed copies (one copy, not two)."""
        with self.stack.use(role):
            if role == "actor" and self.merge and mergeable(self.stack):
                with merged_actor(self.stack, rows if self._fused() else None):
                    yield
            else:
                yield

    def _fused(self) -> bool:
        """Whether the merged actor is kept only as packed copies while generating."""
        return self.pack and self.merge and packable(self.stack.lm)

    @torch.no_grad()
    def generate(self, request: GenerationRequest) -> Generation:
        g, settings, device = request.num_samples, request.settings, self.stack.lm.device
        ids = request.prompt_ids.to(device).repeat_interleave(g, 0)
        mask = request.prompt_mask.to(device).repeat_interleave(g, 0)
        uniforms = None if request.keys is None else key_uniforms(request.keys, settings.max_new_tokens).to(ids.device)
        with self.acting(request.role, ids.shape[0]):
            return generate(self.stack, ids, mask, max_new_tokens=settings.max_new_tokens, eos_id=self.stop_ids,
                            pad_id=self.pad_id, temperature=settings.temperature, top_p=settings.top_p,
                            uniforms=uniforms, logprobs=request.logprobs, all_done=self.dist.all_done,
                            pack=self.pack, drop_finished=self.dropping)

    def turn_decoder(self, role: str) -> Any:
        """An episode batch's decoder that keeps every episode's KV cache from turn to turn
        (`hf_turns.CachedTurns`, given this module's decoding loop), so a turn prefills only what was
        added since the last."""
        return CachedTurns(self, role, DecodingLoop(generate, key_uniforms, prefill_plan))

    def sync(self, stack: Any) -> None:
        """Nothing to push: every call samples from the stack's current adapters."""

    def stats(self) -> dict[str, float]:
        return {}

    def memory(self) -> list[tuple[str, int, int]]:
        """(what, elements, bytes) the engine adds while it generates: the merged actor's copy W′ and the
        prepacked copies of the linear weights."""
        n, size = merged_size(self.stack) if self.merge else (0, 0)
        p, packed = packed_size(self.stack.lm) if self.pack else (0, 0)
        made = "de-quantised " if four_bit_layers(self.stack.lm) else ""  # copies of deq(W_q) (models/quantized.py)
        if n and p:  # the merged weights exist only as their packed copies (`acting`)
            return [(f"hf engine: {made}prepacked linear weights, the actor's LoRA merged in (while generating)", p, packed)]
        return ([(f"hf engine: {made}merged actor W + s·B·A (while generating)", n, size)] if n else []) + (
            [(f"hf engine: {made}prepacked linear weights (while generating)", p, packed)] if p else [])


@register_engine("hf")
def hf_engine(*, stack: PolicyStack, tokenizer: Any, config: Any = None, dist: DistContext = SINGLE,
              longest_prompt: int | None = None, response_tokens: int | None = None) -> HFEngine:
    """The `hf` engine of a run: the stack, its stop and pad ids, the run's collectives (it reserves
    nothing ahead, so `longest_prompt` and `response_tokens` do not size it). The actor decodes
    through merged weights unless `engine.merge_lora` is off or `dist.shard_base` splits W, and every
    decoding through prepacked weights unless `engine.pack_weights` is off or the base is sharded; finished
    rows leave the batch unless `engine.drop_finished` is off or the base is sharded."""
    whole = config is None or not config.dist.shard_base
    merge = whole and (config is None or config.engine.merge_lora)
    pack = whole and (config is None or config.engine.pack_weights)
    drop = config is None or config.engine.drop_finished
    return HFEngine(stack, stop_token_ids(tokenizer, stack.lm), tokenizer.pad_token_id, dist, merge=merge, pack=pack,
                    drop_finished=drop)
