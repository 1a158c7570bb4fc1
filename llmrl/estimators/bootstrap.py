"""Critic-bootstrapped estimators: A2C's n-step return and PPO's GAE (Schulman et al. 2016)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .registry import EstimatorInput, EstimatorOutput, register


@register("gae", q_estimate="λ-return (GAE)", baseline="learned V(s_t)", critic=True)
def gae(x: EstimatorInput) -> EstimatorOutput:
    """Generalized Advantage Estimation.

    δ_t = r_t + γ V(s_{t+1}) − V(s_t), with V = 0 after the last response token;
    A_t = δ_t + γλ A_{t+1} = Σ_k (γλ)^k δ_{t+k};  returns_t = A_t + V_old(s_t) (the λ-return).
    λ = 1 gives G_t − V(s_t) (Monte Carlo), λ = 0 the one-step TD error.
    """
    assert x.values is not None
    mask = x.response_mask
    values = torch.where(mask, x.values, torch.zeros_like(x.values))
    rewards = torch.where(mask, x.token_rewards, torch.zeros_like(x.token_rewards))
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    n_tokens = rewards.shape[1]
    for t in reversed(range(n_tokens)):
        next_value = values[:, t + 1] if t + 1 < n_tokens else torch.zeros_like(running)
        delta = rewards[:, t] + x.gamma * next_value - values[:, t]
        running = torch.where(mask[:, t], delta + x.gamma * x.lam * running, torch.zeros_like(running))
        adv[:, t] = running
    return EstimatorOutput(advantages=adv, returns=torch.where(mask, adv + values, torch.zeros_like(adv)))


@register("a2c", q_estimate="n-step return", baseline="learned V(s_t)", critic=True)
def a2c(x: EstimatorInput) -> EstimatorOutput:
    """Q_t = r_t + γ r_{t+1} + … + γ^(n−1) r_{t+n−1} + γ^n V(s_{t+n}) (V = 0 past the end);
    A_t = Q_t − V(s_t); returns_t = Q_t. n = `estimator.n_step`."""
    assert x.values is not None
    mask, n = x.response_mask, x.n_step
    values = torch.where(mask, x.values, torch.zeros_like(x.values))
    rewards = torch.where(mask, x.token_rewards, torch.zeros_like(x.token_rewards))
    n_tokens = rewards.shape[1]
    padded_r = F.pad(rewards, (0, n))
    padded_v = F.pad(values, (0, n))
    q = (x.gamma**n) * padded_v[:, n : n + n_tokens]
    for k in range(n):
        q = q + (x.gamma**k) * padded_r[:, k : k + n_tokens]
    q = torch.where(mask, q, torch.zeros_like(q))
    return EstimatorOutput(advantages=torch.where(mask, q - values, torch.zeros_like(q)), returns=q)
