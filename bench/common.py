"""Helpers shared by the decoding benchmarks (engine_copies.py and the probes under probes/): a LoRA
stack on a local model and a seeded random generation request."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from llmrl.config.schema import LoraConfig
from llmrl.engines.base import GenerationRequest, SamplingSettings, row_keys
from llmrl.models.stack import PolicyStack


def lora_stack(path: str, dtype: torch.dtype, targets: list[str]) -> PolicyStack:
    """A PolicyStack on the model at `path` with LoRA r=16 on `targets`, the actor's B ~ N(0, 0.01²)
    (a trained-looking adapter), seed 0."""
    torch.manual_seed(0)
    stack = PolicyStack(AutoModelForCausalLM.from_pretrained(path, dtype=dtype), LoraConfig(r=16, target_modules=targets),
                        with_critic=False)
    for name, p in stack.peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.01)
    return stack


def random_request(vocab: int, rows: int, tokens: int, rep: int) -> GenerationRequest:
    """`rows` rows (groups of up to 8 samples of rows // g prompts) of 50 random token ids seeded by
    `rep`, `tokens` new tokens each, with log-probs."""
    g = max(1, rows // 8)
    b = rows // g
    ids = torch.randint(100, vocab, (b, 50), generator=torch.Generator().manual_seed(rep))
    keys = row_keys(rep, 0, torch.arange(b).repeat_interleave(g), torch.arange(g).repeat(b))
    return GenerationRequest(ids, torch.ones_like(ids, dtype=torch.bool), g, SamplingSettings(tokens), keys, logprobs=True)
