"""Sizes a run cannot hold, refused before the model stack is built (exit 2).

Every size setting's schema domain is what the code can represent (int64, `config/domains.py`); what
a machine can hold depends on the model, so it is checked here, once the base model is loaded, with
lower bounds (what one step needs at the least, never an estimate of the peak):

    threads         ≤ the machine's CPUs: more torch threads than cores only wait on each other (1024 on
                    2 cores turn a step of a second into minutes)
    lora.r          ≤ the model's hidden size H: ΔW = B·A of a layer has rank ≤ min(in, out) ≤ H, so a
                    larger rank only adds parameters (and lora.r = 2^40 would allocate them)
    rows per step   N = (B + K)·G rows (B prompts, K = rollout.oversample, G samples each) decode
                    together; their KV cache alone, 2 · L · N · (1 + T) · n_kv · d_head · bytes (L layers,
                    T = rollout.max_new_tokens, at least one prompt token), plus one step's float32 logits
                    N · V · 4, must fit in the run's budget (memory/budget.py: --max-memory, else the
                    device's memory)
    what it holds   once the stack and engine are built (`check_memory`): the base as held (4-bit codes and
                    scales, or `model.dtype`), the adapters, value head and AdamW state, the `hf` engine's
                    copies while it generates (merged and prepacked weights; vLLM's weights and KV cache),
                    and that KV cache and logits, all at once during the generate phase: more than the
                    budget (shared by the processes of one machine on the CPU) is refused, naming
                    the parts and the settings that drop the largest
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from ..config import Config
from ..errors import ConfigError
from ..memory.budget import Budget, size_text
from ..models.load import torch_dtype


def decode_floor(config: Config, model_config: Any) -> tuple[int, int]:
    """(N, bytes): the rows one step decodes together and their KV cache and float32 logits at the least,
    N · (2 · L · (1 + T) · n_kv · d_head · bytes + V · 4) (the module docstring)."""
    text = model_config.get_text_config()
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    r = config.rollout
    rows = (r.prompts_per_step + r.oversample) * r.num_generations
    layers = int(getattr(text, "num_hidden_layers", 1) or 1)
    heads = int(getattr(text, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or (hidden // heads if hidden else 1))
    vocab = int(getattr(text, "vocab_size", 1) or 1)
    size = torch.finfo(torch_dtype(config.model.dtype, config.model.device, config.model.name)).bits // 8
    return rows, rows * (2 * layers * (1 + r.max_new_tokens) * kv_heads * head_dim * size + vocab * 4)


def check_memory(config: Config, costs: Sequence[Any], model_config: Any, budget: Budget) -> None:
    """Refuse a run whose parts held at once while it generates exceed `budget` (one process's share):
    `costs` the (role, params, bytes) rows of the start-up table (run/memory.py: the base as held,
    adapters, value head, AdamW state, the engine's copies) plus `decode_floor`. A lower bound (no
    activation, no allocator slack): a refused run could never have generated. The sentence names the
    parts and the settings that drop the largest."""
    have = budget.bytes
    rows, floor = decode_floor(config, model_config)
    if any("KV cache" in c.role for c in costs):  # the engine holds its own (vLLM's, already allocated): not twice
        floor = 0
    need = sum(c.bytes for c in costs) + floor
    if need <= have:
        return
    parts = sorted([(c.bytes, c.role) for c in costs if c.bytes]
                   + ([(floor, f"the KV cache and logits of {rows:,} rows")] if floor else []), reverse=True)
    named = ", ".join(f"{what} {size_text(b)}" for b, what in parts[:4])
    copies = sum(c.bytes for c in costs if c.role.startswith("hf engine"))
    fixes = []
    if copies:
        fixes.append(f"engine.pack_weights=false and engine.merge_lora=false drop the engine's {size_text(copies)} of "
                     "copies (slower decoding)")
    if config.model.quantize == "none":
        fixes.append("model.quantize=nf4 holds the base's linear layers in 4 bits (pip install -e '.[quant]')")
    fixes.append("fewer rows or new tokens shrink the KV cache" if floor * 4 > need else "a smaller model fits")
    raise ConfigError(f"This run holds at least {size_text(need)} at once while it generates ({named}), more than the "
                      f"{budget.describe()}: {'; '.join(fixes)}.")


def check_sizes(config: Config, model_config: Any, device: torch.device, budget: Budget) -> None:
    """Raise a ConfigError for a lora.r above the hidden size, or rows per step whose KV cache and
    logits alone exceed `budget` (see the module docstring)."""
    cpus = os.cpu_count() or 1
    if config.threads and config.threads > cpus and device.type == "cpu":
        raise ConfigError(f"'threads' ({config.threads}) exceeds the {cpus} CPUs of this machine; more torch threads "
                          f"than cores only wait on each other.")
    text = model_config.get_text_config()
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    if hidden and config.lora.r > hidden:
        raise ConfigError(f"'lora.r' ({config.lora.r}) exceeds the model's hidden size ({hidden}): a LoRA update of a "
                          f"layer has rank at most its width, so a larger rank only adds parameters.")
    rows, need = decode_floor(config, model_config)
    if need > budget.bytes:
        raise ConfigError(f"One step decodes {rows:,} rows ((rollout.prompts_per_step + rollout.oversample) × "
                          f"rollout.num_generations); their KV cache and logits alone need {size_text(need)}, more than "
                          f"the {budget.describe()}: lower them.")
