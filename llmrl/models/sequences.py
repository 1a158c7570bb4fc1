"""A prompt+response batch laid out for one forward pass: the `Sequences` every forward takes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sequences:
    """A prompt+response batch laid out for one forward pass.

    ids (N, P+T) long; attention (N, P+T) long (0 at left prompt padding and right response padding);
    positions (N, P+T) long, counted from each row's first real token; prompt_len P.
    """

    ids: Tensor
    attention: Tensor
    positions: Tensor
    prompt_len: int


def layout(prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor) -> Sequences:
    """Concatenate left-padded prompts and right-padded responses into one forward-ready batch."""
    attention = torch.cat([prompt_mask, response_mask], dim=1).long()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return Sequences(torch.cat([prompt_ids, response_ids], dim=1), attention, positions, prompt_ids.shape[1])
