"""Masked tensor helpers shared by estimators and losses. `mask` is bool, True = trained token."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·mask, ignoring whatever x holds at masked positions (even NaN or inf)."""
    zeros = torch.zeros((), dtype=x.dtype, device=x.device)
    kept = torch.where(mask, x, zeros)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·mask / Σ mask (0 where nothing is kept)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Biased variance of the kept entries of x (a scalar)."""
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask)


def whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x − mean) / sqrt(var + eps) over the kept entries; masked entries become 0."""
    out = (x - masked_mean(x, mask)) * torch.rsqrt(masked_var(x, mask) + eps)
    return torch.where(mask, out, torch.zeros_like(out))


def last_token_index(mask: Tensor) -> Tensor:
    """(N,) index of the last True of each row of an (N, T) mask; 0 for empty rows. The mask may have
    gaps (an episode's action mask: the environment's tokens lie between the model's), so this is
    T − 1 − (the first True of the reversed row), not Σ mask − 1 (the same for a right-padded row)."""
    if mask.shape[-1] == 0:
        return torch.zeros(mask.shape[:-1], dtype=torch.long, device=mask.device)
    last = mask.shape[-1] - 1 - mask.flip(-1).long().argmax(-1)  # argmax: the first maximum
    return torch.where(mask.any(-1), last, torch.zeros_like(last))


def ends_with_stop(ids: Tensor, mask: Tensor, stop_ids: int | Sequence[int]) -> Tensor:
    """(N,) bool: the right-padded response (N, T) is non-empty and its last token is a stop id."""
    last = ids.gather(1, last_token_index(mask)[:, None]).squeeze(1)
    stop = torch.as_tensor(stop_ids, dtype=last.dtype, device=last.device).reshape(-1)
    return torch.isin(last, stop) & mask.any(-1)
