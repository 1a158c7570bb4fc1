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
    """(N,) index of the last True of each row of a right-padded (N,T) mask; 0 for empty rows."""
    return (mask.long().sum(-1) - 1).clamp(min=0)


def ends_with_stop(ids: Tensor, mask: Tensor, stop_ids: int | Sequence[int]) -> Tensor:
    """(N,) bool: the right-padded response (N, T) is non-empty and its last token is a stop id."""
    last = ids.gather(1, last_token_index(mask)[:, None]).squeeze(1)
    stop = torch.as_tensor(stop_ids, dtype=last.dtype, device=last.device).reshape(-1)
    return torch.isin(last, stop) & mask.any(-1)
