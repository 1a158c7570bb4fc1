"""The LM head as the model's own forward applies it: some architectures transform the logits after
the head, and the training log-probs must see the same policy the decoder samples from.

The chunked log-probs (models/logprobs.py) apply only the output embedding to the hidden states,
while decoding runs the model's forward. For a model whose forward changes the logits after the head,
π_old, π_θ and π_ref would then not be the sampler's policy, and with `rollout.generation_logprobs`
the first importance ratio would not be 1. The transforms transformers' causal LMs apply, z = W·h:

    Gemma-2, Gemma-3   final_logit_softcapping c:  z ↦ c · tanh(z / c)
    Cohere, Cohere-2   logit_scale s:              z ↦ s · z
    Granite            logits_scaling s:           z ↦ z / s

(read from the text config; a model whose config has none of them runs the plain head).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn


def logit_transform(config: Any) -> Callable[[Tensor], Tensor] | None:
    """The transform `config`'s model applies to the head's logits (the module docstring), or None."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    cap = getattr(text, "final_logit_softcapping", None)
    if cap:
        return lambda z: torch.tanh(z / cap) * cap
    scale = getattr(text, "logit_scale", None)
    if scale is not None and getattr(text, "model_type", "").startswith("cohere"):
        return lambda z: z * scale
    divide = getattr(text, "logits_scaling", None)
    if divide is not None and divide != 1.0:
        return lambda z: z / divide
    return None


class TransformedHead(nn.Module):
    """`head` followed by `transform`: (…, H) → (…, V), as the model's forward computes its logits."""

    def __init__(self, head: nn.Module, transform: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        self.head, self.transform = head, transform

    def forward(self, h: Tensor) -> Tensor:
        return self.transform(self.head(h))


def model_head(model: nn.Module) -> nn.Module:
    """The output embedding of `model`, wrapped in its logit transform where it has one."""
    head = model.get_output_embeddings()
    transform = logit_transform(model.config)
    return head if transform is None else TransformedHead(head, transform)
