"""The update's micro-batch sized to the memory its activations find, decided before the first step.

A forward with gradients keeps, for its backward, tensors that grow with the tokens it runs: every
decoder layer's normed inputs, attention and MLP intermediates, the LoRA inputs. The weights' check
(`preflight.check_memory`) counts none of them, and at 1.5B they dominate: a row of 400 tokens keeps
≈ 2 GB in float32, so the 16-row minibatch of a show-your-work recipe (24 GB) was killed by the OOM
killer where micro-batches of 2 ran (docs/history.md).

They are measured, not modelled (architectures, dtypes, 4-bit layers and LoRA targets all change
them): `probe_bytes_per_token` runs the actor's decoder once with gradients over one row of `PROBE`
tokens under `torch.autograd.graph.saved_tensors_hooks`, summing the bytes of every distinct storage
saved for the backward that is not a parameter, and divides by `PROBE`:

    a        = saved bytes / PROBE                         bytes a token keeps (decoder)
    A_row    = S · (a + logits) · SLACK                    S = longest prompt + response budget
    logits   = 2 · 4 · V  while a micro-batch's response positions fit one logits chunk
               (float32 logits and log-softmax kept, models/logprobs.py), else 0 per token and
               3 chunks held once (a checkpointed chunk recomputed in the backward)
    free     = memory − what the run holds outside generation (base, adapters, value head, AdamW,
               vLLM's weights and KV cache; not the `hf` engine's copies, freed after generating)
    m        = ⌊free / A_row⌋                               rows a micro-batch may hold

SLACK = 2: on Qwen2.5-1.5B in float32 (LoRA on q, k, v, o) the probe counts 134 KB a token and layer,
while the process's anonymous memory grew ≈ 214 KB in the update (1.6×: the backward's gradients of the
layer it is in, the allocator's free blocks), and the machine's memory is not all the run's (the system,
the page cache it cannot drop). Decisions (`fit_update`):

    update.micro_batch_size unset, the minibatch's rows ≤ m   nothing changes
    unset, more rows                                         micro-batches of m rows (one line on stderr)
    set above m                                              one line on stderr, the setting kept
    one row's saved tensors alone (no slack) > free          refused before the first step (ConfigError)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from ..config import Config
from ..config.schema import UpdateConfig
from ..errors import ConfigError
from ..models.logprobs import chunk_positions
from ..models.sequences import layout
from ..models.stack import PolicyStack
from .preflight import size_text

PROBE = 32  # tokens of the probe row: half prompt, half response
SLACK = 2.0  # process memory over saved tensors: 1.6× measured at 1.5B, and headroom (module docstring)
GENERATION_ONLY = "while generating"  # engine rows freed before the update (run/memory.engine_costs)


@dataclass(frozen=True)
class UpdateFit:
    """What the update's activations need: bytes a token keeps, the row length S, the rows that fit."""
    per_token: float  # a + logits, bytes
    row_tokens: int  # S
    free: int  # bytes left for activations
    rows: int  # m = ⌊free / (S · per_token · SLACK)⌋
    minibatch_rows: int  # rows of one minibatch in this process

    @property
    def row_bytes(self) -> float:
        return self.row_tokens * self.per_token


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def probe_bytes_per_token(stack: PolicyStack, role: str = "actor") -> float:
    """a: bytes the decoder keeps for the backward per token of a gradient forward of `role`, measured on
    one row of PROBE tokens (module docstring); parameters' storages are not counted."""
    params = {_storage_key(p)[0] for p in stack.lm.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr, size = _storage_key(t)
        if ptr not in params and size:
            saved[ptr] = max(size, saved.get(ptr, 0))
        return t

    device = next(stack.lm.parameters()).device
    half = PROBE // 2
    ids = torch.zeros(1, half, dtype=torch.long, device=device)
    ones = torch.ones(1, half, dtype=torch.long, device=device)
    seq = layout(ids, ones, ids, ones)
    with stack.use(role), torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stack.hidden(seq)
    return sum(saved.values()) / PROBE


def _held(costs: Sequence[Any]) -> int:
    """Bytes the run holds while it updates: every start-up row but the `hf` engine's generation copies."""
    return sum(c.bytes for c in costs if GENERATION_ONLY not in c.role)


def measure_fit(config: Config, stack: PolicyStack, costs: Sequence[Any], have: int, longest_prompt: int,
                response_tokens: int, world: int = 1) -> UpdateFit:
    """The update's activation estimate against `have` bytes (module docstring)."""
    r, u = config.rollout, config.update
    minibatch = -(-min(u.minibatch_size, r.prompts_per_step * r.num_generations) // world)
    vocab = int(getattr(stack.lm.config.get_text_config(), "vocab_size", 0) or 0)
    chunk = chunk_positions(config.model.logits_chunk_mib, vocab) if vocab else 2**62
    micro = min(minibatch, u.micro_batch_size or minibatch)
    whole_logits = micro * response_tokens <= chunk  # models/logprobs.token_stats' one-chunk case
    per_token = probe_bytes_per_token(stack) + (2 * 4 * vocab * response_tokens / (longest_prompt + response_tokens)
                                                if whole_logits else 0.0)
    free = have - _held(costs) - (0 if whole_logits else 3 * 4 * vocab * min(chunk, micro * response_tokens))
    row = (longest_prompt + response_tokens) * per_token
    return UpdateFit(per_token, longest_prompt + response_tokens, free, max(0, int(free // (row * SLACK))), minibatch)


def fit_update(cfg: UpdateConfig, fit: UpdateFit) -> UpdateConfig:
    """The update settings this run takes: micro-batches of `fit.rows` where unset and the minibatch does
    not fit; refused where one row's saved tensors alone exceed the memory left (module docstring)."""
    what = (f"a row of {fit.row_tokens:,} tokens keeps ≈ {size_text(fit.row_bytes * SLACK)} of activations in the "
            f"update, and {size_text(max(fit.free, 0))} are left beside the weights")
    if fit.row_bytes > fit.free:
        raise ConfigError(f"This run cannot update even one row at a time: {what}; update.activation_checkpointing="
                          "true keeps only each layer's input, and fewer new tokens, shorter prompts or "
                          "model.quantize=nf4 leave more room.")
    rows = max(1, fit.rows)
    if cfg.micro_batch_size is None and fit.minibatch_rows > rows:
        print(f"llmrl: update.micro_batch_size set to {rows}: {what}, room for {rows} of the minibatch's "
              f"{fit.minibatch_rows} rows (set update.micro_batch_size to choose).", file=sys.stderr)
        return replace(cfg, micro_batch_size=rows)
    if cfg.micro_batch_size is not None and min(cfg.micro_batch_size, fit.minibatch_rows) > rows:
        print(f"llmrl: update.micro_batch_size={cfg.micro_batch_size} may not fit in memory: {what}, room for about "
              f"{rows} rows at once; the run goes on as set.", file=sys.stderr)
    return cfg
