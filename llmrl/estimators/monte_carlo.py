"""REINFORCE (Williams 1992) without and with a learned baseline."""

from __future__ import annotations

import torch

from .registry import EstimatorInput, EstimatorOutput, register
from .returns import reward_to_go


@register("reinforce", q_estimate="Monte Carlo return G_t", baseline="none")
def reinforce(x: EstimatorInput) -> EstimatorOutput:
    """A_t = G_t = Σ_k γ^k r_{t+k}. No baseline, so the highest-variance estimator of the table."""
    return EstimatorOutput(advantages=reward_to_go(x.token_rewards, x.response_mask, x.gamma))


@register("reinforce_baseline", q_estimate="Monte Carlo return G_t", baseline="learned V(s_t)", critic=True)
def reinforce_baseline(x: EstimatorInput) -> EstimatorOutput:
    """A_t = G_t − V(s_t); the critic regresses on G_t (returns = A + V_old = G_t)."""
    assert x.values is not None
    returns = reward_to_go(x.token_rewards, x.response_mask, x.gamma)
    adv = torch.where(x.response_mask, returns - x.values, torch.zeros_like(returns))
    return EstimatorOutput(advantages=adv, returns=returns)
