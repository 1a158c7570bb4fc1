"""Activation checkpointing of the decoder layers in the update's gradient forwards
(`update.activation_checkpointing`).

A gradient forward keeps every decoder layer's intermediate tensors for the backward: on
Qwen2.5-0.5B with LoRA on every linear layer about 190 KB per position per layer (its MLP is 5.4×
the hidden size wide, and each adapted layer keeps its input), 2.4–3.4 GiB for 8 rows of 94
positions. With checkpointing each layer keeps only its input hidden state (H numbers per position)
and runs its forward again, one layer at a time, during the backward (`torch.utils.checkpoint`,
non-reentrant, the random state restored so LoRA dropout draws the same mask): the update's
activations shrink to about one layer's, for one more forward of the decoder per update pass.

Forwards without gradients (generation, the no-grad log-prob forwards, evaluation) run the layers
as they are. A checkpointed forward must not write into a KV cache (its recomputation would write
again), so the stack runs such forwards without prompt sharing (`PolicyStack.hidden`).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def _forward(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The layer's own forward, under a checkpoint when gradients are on."""
    if not torch.is_grad_enabled():
        return original(*args, **kwargs)
    return checkpoint(original, *args, use_reentrant=False, **kwargs)


def checkpoint_layers(layers: nn.ModuleList) -> None:
    """From now on each of `layers` runs its gradient forwards under a checkpoint (see the module)."""
    for layer in layers:
        layer.forward = partial(_forward, type(layer).forward.__get__(layer))
