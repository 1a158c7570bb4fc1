"""Any estimator over an episode's model tokens only: the environment's spans are skipped.

An episode's row interleaves the model's tokens (mask True) with the environment's (mask False).
Every estimator is written for a response whose trained tokens are contiguous, so the model's
tokens are packed to the left of each row, the estimator runs on the packed rows, and its outputs
go back to the tokens' places:

    packed_i = (the model tokens of row i in order, then the rest)      order_i = a stable argsort
    out      = estimator(packed);   out[i, order_i[j]] = packed_out[i, j]

So V and rewards flow across an environment span as if its two neighbouring model tokens were
adjacent, and γ (and GAE's λ) is applied once per model token, never per environment token: for
GAE, δ_t = r_t + γ V(s_next) − V(s_t) with s_next the state of the next *model* token (V = 0 after
the episode's last one). An environment token gets no advantage, return or value target. Group
estimators see Σ_t r_t over the model tokens, the episode's reward. A row whose model tokens are
already contiguous from position 0 (one turn) packs to itself: the estimator's numbers are
unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from .registry import Estimator, EstimatorInput, EstimatorOutput


def packing_order(mask: Tensor) -> Tensor:
    """(N, T) long: per row, the positions of the True entries in order, then the False ones."""
    return torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices


def pack(x: Tensor, order: Tensor) -> Tensor:
    """x (N, T) gathered into the packed order."""
    return x.gather(1, order)


def unpack(x: Tensor, order: Tensor) -> Tensor:
    """The inverse of `pack`: packed (N, T) scattered back to the original positions."""
    return torch.zeros_like(x).scatter(1, order, x)


def over_model_tokens(fn: Estimator, x: EstimatorInput) -> EstimatorOutput:
    """`fn` on `x` with the environment's tokens (response_mask False between model tokens) skipped."""
    order = packing_order(x.response_mask)
    packed = replace(x, token_rewards=pack(x.token_rewards, order), response_mask=pack(x.response_mask, order),
                     values=None if x.values is None else pack(x.values, order))
    out = fn(packed)
    mask = x.response_mask
    zeros = torch.zeros_like(out.advantages)
    advantages = torch.where(mask, unpack(out.advantages, order), zeros)
    returns = None if out.returns is None else torch.where(mask, unpack(out.returns, order), torch.zeros_like(out.returns))
    return replace(out, advantages=advantages, returns=returns)
