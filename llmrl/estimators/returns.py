"""Return computations shared by the estimators. Rows are right-padded; masked rewards are 0."""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops import masked_sum


def reward_to_go(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = Σ_{k≥0} γ^k r_{t+k}, (N, T) → (N, T); 0 where masked."""
    rewards = torch.where(mask, rewards, torch.zeros_like(rewards))
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        out[:, t] = running
    return torch.where(mask, out, torch.zeros_like(out))


def sequence_reward(rewards: Tensor, mask: Tensor) -> Tensor:
    """R = Σ_t r_t over the response, (N, T) → (N,): the Monte Carlo return of the whole response."""
    return masked_sum(rewards, mask, dim=-1)


def broadcast(per_row: Tensor, mask: Tensor) -> Tensor:
    """(N,) → (N, T): the same value on every kept token of a row, 0 where masked."""
    out = per_row[:, None].expand(mask.shape)
    return torch.where(mask, out, torch.zeros_like(out))
