"""Policy, value and entropy losses, KL estimators and loss aggregation.

All per-token tensors are (N, T) with a bool `mask` (True = trained token); masked positions never
influence a result, whatever they hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .ops import masked_mean, masked_sum

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def aggregate(
    loss: Tensor, mask: Tensor, mode: str, total_tokens: float | None = None, total_seqs: float | None = None
) -> Tensor:
    """Reduce a per-token loss (N, T) to a scalar.

    token-mean:          Σ_it ℓ_it / Σ_it m_it                  (every token weighs the same)
    seq-mean-token-mean: mean_i (Σ_t ℓ_it / Σ_t m_it)           (every sequence weighs the same)
    seq-mean-token-sum:  mean_i Σ_t ℓ_it                        (Dr. GRPO: no length normalisation)
    Example ℓ = [[1, 1, ·], [3, ·, ·]]: token-mean 5/3, seq-mean-token-mean 2, seq-mean-token-sum 2.5.

    When a minibatch is split into micro-batches, pass the minibatch's `total_tokens` (Σ m) and
    `total_seqs` (rows) so that the micro-batch losses add up to the minibatch loss exactly.
    """
    if mode == "token-mean":
        denom = mask.sum().clamp(min=1) if total_tokens is None else total_tokens
        return masked_sum(loss, mask) / denom
    per_seq = masked_sum(loss, mask, dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown aggregation '{mode}'; valid: {', '.join(AGGREGATIONS)}")
    return per_seq.sum() / (per_seq.shape[0] if total_seqs is None else total_seqs)


@dataclass(frozen=True)
class PolicyLoss:
    loss: Tensor  # scalar to minimise
    clip_frac: Tensor  # share of kept tokens where the clipped branch was taken
    approx_kl: Tensor  # mean of k3(π_old‖π_θ) over kept tokens, a drift diagnostic


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    **totals: float | None,
) -> PolicyLoss:
    """PPO clipped surrogate (Schulman et al. 2017), with clip-higher (DAPO) and dual clip (Ye et al. 2020).

    ρ_t = exp(log π_θ − log π_old);  ℓ_t = max(−A_t ρ_t, −A_t clip(ρ_t, 1 − ε_low, 1 + ε_high));
    with dual clip c and A_t < 0: ℓ_t = min(ℓ_t, −c A_t).
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        per_token = torch.where(advantages < 0, torch.minimum(per_token, -dual_clip * advantages), per_token)
    with torch.no_grad():
        clip_frac = masked_mean((clipped > unclipped).float(), mask)
        approx_kl = masked_mean(kl_penalty(old_logprobs, logprobs, "k3"), mask)
    return PolicyLoss(aggregate(per_token, mask, agg, **totals), clip_frac, approx_kl)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    **totals: float | None,
) -> Tensor:
    """½ max((V − R)², (V_clip − R)²) with V_clip = V_old + clip(V − V_old, −c, c); no clip when c is None."""
    zeros = torch.zeros_like(values)
    values = torch.where(mask, values, zeros)  # junk at masked positions must not reach the gradient
    returns = torch.where(mask, returns, zeros)
    old_values = torch.where(mask, old_values, zeros)
    err = (values - returns) ** 2
    if clip is not None:
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err = torch.maximum(err, (v_clipped - returns) ** 2)
    return 0.5 * aggregate(err, mask, agg, **totals)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H_t = −Σ_v p_v log p_v, (…, V) → (…)."""
    return entropy_from_logprobs(torch.log_softmax(logits.float(), dim=-1))


def entropy_from_logprobs(logp: Tensor) -> Tensor:
    """H_t = −Σ_v exp(log p_v) log p_v from log-probabilities already computed, (…, V) → (…)."""
    return -(logp.exp() * logp).sum(-1)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(π_θ‖π_ref) from samples of π_θ (Schulman, "Approximating KL").

    k1 = log π − log π_ref;  k2 = ½ (log π − log π_ref)²;  k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1.
    k1 is unbiased but can be negative; k3 is unbiased and ≥ 0; k2 is biased, ≥ 0, low variance.
    """
    diff = logprobs - ref_logprobs
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff**2
    if estimator == "k3":
        return torch.expm1(-diff) + diff
    raise ValueError(f"unknown KL estimator '{estimator}'; valid: k1, k2, k3")
