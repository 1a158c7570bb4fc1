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
                    N · V · 4, must fit in the device's memory (physical memory on the CPU)
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..config import Config
from ..errors import ConfigError
from ..models.load import device_memory, torch_dtype


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_sizes(config: Config, model_config: Any, device: torch.device) -> None:
    """Raise a ConfigError for a lora.r above the hidden size, or rows per step whose KV cache and
    logits alone exceed the device's memory (see the module docstring)."""
    cpus = os.cpu_count() or 1
    if config.threads and config.threads > cpus and device.type == "cpu":
        raise ConfigError(f"'threads' ({config.threads}) exceeds the {cpus} CPUs of this machine; more torch threads "
                          f"than cores only wait on each other.")
    text = model_config.get_text_config()
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    if hidden and config.lora.r > hidden:
        raise ConfigError(f"'lora.r' ({config.lora.r}) exceeds the model's hidden size ({hidden}): a LoRA update of a "
                          f"layer has rank at most its width, so a larger rank only adds parameters.")
    r = config.rollout
    rows = (r.prompts_per_step + r.oversample) * r.num_generations
    layers = int(getattr(text, "num_hidden_layers", 1) or 1)
    heads = int(getattr(text, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or (hidden // heads if hidden else 1))
    vocab = int(getattr(text, "vocab_size", 1) or 1)
    size = torch.finfo(torch_dtype(config.model.dtype, config.model.device, config.model.name)).bits // 8
    need = rows * (2 * layers * (1 + r.max_new_tokens) * kv_heads * head_dim * size + vocab * 4)
    have = device_memory(device)
    if need > have:
        raise ConfigError(f"One step decodes {rows:,} rows ((rollout.prompts_per_step + rollout.oversample) × "
                          f"rollout.num_generations); their KV cache and logits alone need {_gib(need)}, more than "
                          f"the {_gib(have)} of memory of {device.type}: lower them.")
