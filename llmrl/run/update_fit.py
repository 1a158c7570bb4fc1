"""The update's micro-batch sized to the memory its activations find, decided before the first step.

A forward with gradients keeps, for its backward, tensors that grow with the tokens it runs: every
decoder layer's normed inputs, attention and MLP intermediates, the LoRA inputs (and, with
`lora.dropout` > 0, their dropout masks and masked copies). The weights' check
(`preflight.check_memory`) counts none of them, and at 1.5B they dominate: a row of 400 tokens keeps
≈ 2 GB in float32, so the 16-row minibatch of a show-your-work recipe (24 GB) was killed by the OOM
killer where micro-batches of 2 ran (docs/history.md).

They are measured, not modelled (architectures, dtypes, 4-bit layers and LoRA targets all change
them): `probe_bytes_per_token` runs the actor's decoder once over one row of `PROBE` tokens as the
update runs it (gradients on, LoRA dropout active, `update.activation_checkpointing` as set), under
`torch.autograd.graph.saved_tensors_hooks`, summing the bytes of every distinct storage saved for the
backward that is not a parameter. Under activation checkpointing the hooks see only what is saved
outside the checkpointed layers; the update keeps each layer's inputs (the checkpoint holds them) and,
in the backward, one layer's recompute at a time, so the probe adds the inputs each layer was called
with and the most any one layer's own forward saves, run again on those inputs. Then:

    a        = saved bytes / PROBE                         bytes a token keeps (decoder)
    A_row    = S · (a + logits) · SLACK                    S = longest prompt + response budget
    logits   = 2 · 4 · V  while the micro-batch the fit leads to has response positions that fit one
               logits chunk (float32 logits and log-softmax kept, models/logprobs.py), else 0 per
               token and 3 chunks held once (a checkpointed chunk recomputed in the backward)
    free     = memory − what the run holds outside generation (base, adapters, value head, AdamW,
               vLLM's weights and KV cache; not the `hf` engine's copies, freed after generating)
    m        = ⌊free / A_row⌋                               rows a micro-batch may hold

SLACK = 2: on Qwen2.5-1.5B in float32 (LoRA on q, k, v, o) the probe counts 134 KB a token and layer,
while the process's anonymous memory grew ≈ 214 KB in the update (1.6×: the backward's gradients of the
layer it is in, the allocator's free blocks), and the machine's memory is not all the run's (the system,
the page cache it cannot drop). Decisions (`fit_update`):

    update.micro_batch_size unset, the minibatch's rows ≤ m   nothing changes
    unset, more rows                                         micro-batches of m rows (one line on stderr);
                                                             refused under update.on_policy_values=on
                                                             (its one pass holds every row at once)
    set above m                                              one line on stderr, the setting kept
    one row's saved tensors alone (no slack) > free          refused before the first step (ConfigError)
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from ..config import Config
from ..config.schema import UpdateConfig
from ..errors import ConfigError
from ..models.logprobs import chunk_positions
from ..models.sequences import Sequences, layout
from ..models.stack import PolicyStack
from ..models.top_layers import decoder_layers
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


class _Storages:
    """Distinct storages and their bytes, those of `skip` (parameters, storages counted already) left out."""

    def __init__(self, skip: set[int]) -> None:
        self.skip, self.bytes = skip, {}

    def add(self, t: torch.Tensor) -> torch.Tensor:
        ptr, size = _storage_key(t)
        if ptr not in self.skip and size:
            self.bytes[ptr] = max(size, self.bytes.get(ptr, 0))
        return t

    def total(self) -> int:
        return sum(self.bytes.values())


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors of a layer call's arguments, one level of tuples deep (rotary (cos, sin))."""
    items = [*args, *kwargs.values()]
    items += [x for item in items if isinstance(item, (tuple, list)) for x in item]
    return [x for x in items if isinstance(x, torch.Tensor)]


@contextmanager
def _layer_calls(layers: Sequence[nn.Module]) -> Iterator[list[tuple[nn.Module, tuple, dict]]]:
    """Record every call of `layers` in the body: (layer, args, kwargs)."""
    calls: list[tuple[nn.Module, tuple, dict]] = []
    record = lambda layer, args, kwargs: calls.append((layer, args, kwargs))  # noqa: E731
    handles = [layer.register_forward_pre_hook(record, with_kwargs=True) for layer in layers]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def _recomputed(layer: nn.Module, args: tuple, kwargs: dict, kept: _Storages) -> int:
    """Bytes a checkpointed layer's recompute keeps during its backward beyond `kept`: what the layer's own
    forward (the one `models/checkpointing.py` wraps) saves for its backward, run again on the same inputs."""
    own = _Storages(kept.skip | set(kept.bytes))
    with torch.autograd.graph.saved_tensors_hooks(own.add, _same):
        type(layer).forward(layer, *args, **kwargs)
    return own.total()


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _probe_row(device: torch.device) -> Sequences:
    """One row of PROBE tokens, half prompt, half response."""
    ids = torch.zeros(1, PROBE // 2, dtype=torch.long, device=device)
    ones = torch.ones(1, PROBE // 2, dtype=torch.long, device=device)
    return layout(ids, ones, ids, ones)


def probe_bytes_per_token(stack: PolicyStack, role: str = "actor") -> float:
    """a: bytes the update's gradient forward of `role` keeps for its backward per token, measured on one row
    of PROBE tokens as the update runs it (LoRA dropout active, `stack.checkpointing` as configured);
    parameters' storages are not counted, and the random state is left as it was (module docstring)."""
    kept = _Storages({_storage_key(p)[0] for p in stack.lm.parameters()})
    device = next(stack.lm.parameters()).device
    layers = decoder_layers(stack.lm)[1] if stack.checkpointing else []  # a checkpoint holds their inputs
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), stack.use(role), \
            stack.dropout_active(), torch.enable_grad():
        with _layer_calls(layers) as calls, \
                torch.autograd.graph.saved_tensors_hooks(kept.add, _same):
            stack.hidden(_probe_row(device))
        for _, args, kwargs in calls:  # a checkpoint keeps each layer's inputs for its recompute
            for t in _tensors(args, kwargs):
                kept.add(t)
        recompute = max((_recomputed(layer, args, kwargs, kept) for layer, args, kwargs in calls), default=0)
    return (kept.total() + recompute) / PROBE


def _held(costs: Sequence[Any]) -> int:
    """Bytes the run holds while it updates: every start-up row but the `hf` engine's generation copies."""
    return sum(c.bytes for c in costs if GENERATION_ONLY not in c.role)


def _fit(per_token: float, row_tokens: int, free: int, minibatch: int) -> UpdateFit:
    return UpdateFit(per_token, row_tokens, free, max(0, int(free // (row_tokens * per_token * SLACK))), minibatch)


def measure_fit(config: Config, stack: PolicyStack, costs: Sequence[Any], have: int, longest_prompt: int,
                response_tokens: int, world: int = 1) -> UpdateFit:
    """The update's activation estimate against `have` bytes (module docstring), its logits counted as the
    micro-batch the fit leads to runs them: whole where that micro-batch's response positions fit one
    chunk, else chunked; where the rows that fit with whole logits exceed one chunk and those that fit
    chunked do not, the most rows whose logits are one chunk."""
    r, u = config.rollout, config.update
    minibatch = -(-min(u.minibatch_size, r.prompts_per_step * r.num_generations) // world)
    vocab = int(getattr(stack.lm.config.get_text_config(), "vocab_size", 0) or 0)
    chunk = chunk_positions(config.model.logits_chunk_mib, vocab) if vocab else 2**62
    row, free = longest_prompt + response_tokens, have - _held(costs)
    a = probe_bytes_per_token(stack)
    micro = lambda fit: min(minibatch, u.micro_batch_size or max(1, fit.rows))  # noqa: E731  (rows it runs at once)
    whole = _fit(a + 2 * 4 * vocab * response_tokens / row, row, free, minibatch)
    if micro(whole) * response_tokens <= chunk:  # models/logprobs.token_stats' one-chunk case
        return whole
    chunked = _fit(a, row, free - 3 * 4 * vocab * chunk, minibatch)
    if micro(chunked) * response_tokens > chunk:
        return chunked
    return replace(whole, rows=chunk // response_tokens)


def fit_update(cfg: UpdateConfig, fit: UpdateFit) -> UpdateConfig:
    """The update settings this run takes: micro-batches of `fit.rows` where unset and the minibatch does
    not fit; refused where one row's saved tensors alone exceed the memory left, or where micro-batches
    would be needed under update.on_policy_values=on (module docstring)."""
    what = (f"a row of {fit.row_tokens:,} tokens keeps ≈ {size_text(fit.row_bytes * SLACK)} of activations in the "
            f"update, and {size_text(max(fit.free, 0))} are left beside the weights")
    if fit.row_bytes > fit.free:
        hint = "" if cfg.activation_checkpointing else "update.activation_checkpointing=true keeps only each layer's input, and "
        raise ConfigError(f"This run cannot update even one row at a time: {what}; {hint}fewer new tokens, shorter "
                          "prompts or model.quantize=nf4 leave more room.")
    rows = max(1, fit.rows)
    if cfg.micro_batch_size is None and fit.minibatch_rows > rows:
        if cfg.on_policy_values == "on":  # its single pass would hold every row's activations at once
            raise ConfigError(f"'update.on_policy_values' (on) keeps the critic's graph of the step's "
                              f"{fit.minibatch_rows} rows for one update pass, but {what}, room for {rows} at once; "
                              "use update.on_policy_values=auto, which takes the values from a forward before the "
                              "update here and updates in micro-batches.")
        print(f"llmrl: update.micro_batch_size set to {rows}: {what}, room for {rows} of the minibatch's "
              f"{fit.minibatch_rows} rows (set update.micro_batch_size to choose).", file=sys.stderr)
        return replace(cfg, micro_batch_size=rows)
    if cfg.micro_batch_size is not None and min(cfg.micro_batch_size, fit.minibatch_rows) > rows:
        print(f"llmrl: update.micro_batch_size={cfg.micro_batch_size} may not fit in memory: {what}, room for about "
              f"{rows} rows at once; the run goes on as set.", file=sys.stderr)
    return cfg
