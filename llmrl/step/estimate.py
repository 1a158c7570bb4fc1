"""estimate: `Scores` and `Forwards` → per-token rewards → `Targets` (advantages, returns).

    r_t = score·[t = last token] − β·KL_t (the KL term only when kl.placement = 'reward')
          episodes: an environment's reward for a turn before the last moves from the score to that
          turn's last token (EpisodeLog.early_rewards): Σ_t r_t is the same, GAE discounts it by γ per
          model token from where it was earned
    advantages, returns = estimator(r, mask, groups, V_old, greedy baseline, γ, λ, n)   (registry, by name)
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config.schema import EstimatorConfig, KLConfig
from ..estimators import EstimatorInput, EstimatorSpec, checked_estimate
from ..estimators.episodes import over_model_tokens
from ..losses import kl_penalty
from ..ops import last_token_index, masked_sum
from ..parallel.distributed import SINGLE, DistContext
from .records import Forwards, Samples, Scores, Targets


def token_kl(logprobs: Tensor | None, ref_logprobs: Tensor | None, mask: Tensor, estimator: str) -> Tensor | None:
    """(N, T) per-token KL(π‖π_ref) estimate of the sampled tokens, 0 where masked; None without
    reference (or policy) log-probs."""
    if ref_logprobs is None or logprobs is None:
        return None
    kl = kl_penalty(logprobs, ref_logprobs, estimator)
    return torch.where(mask, kl, torch.zeros_like(kl))


def shape_rewards(samples: Samples, scores: Scores, forwards: Forwards, beta: float, kl: KLConfig) -> Tensor:
    """r_t = score·[t = last token] − β·KL_t(π_old‖π_ref) (the KL term only when `kl.placement ==
    'reward'`): (N, T) in the log-probs' dtype. An episode's early rewards (EpisodeLog.early_rewards:
    its environment's rewards for turns before the last, part of the score) are moved to the end of
    their own turn; with none (every built-in environment) nothing changes."""
    mask = samples.response_mask
    rewards = torch.zeros(mask.shape, dtype=forwards.dtype, device=mask.device)
    rows = torch.arange(samples.n, device=rewards.device)
    rewards[rows, last_token_index(mask)] = scores.scores.to(rewards.dtype)
    early = None if samples.episodes is None else samples.episodes.early_rewards
    if early is not None and bool(early.any()):  # an episode's earlier turns' rewards at their own turn's end
        early = early.to(device=rewards.device, dtype=rewards.dtype)
        rewards[rows, last_token_index(mask)] -= early.sum(-1)
        rewards = rewards + early
    if kl.placement == "reward" and beta > 0:
        per_token = token_kl(forwards.old_logprobs, forwards.ref_logprobs, mask, kl.estimator)
        if per_token is not None:
            rewards = rewards - beta * per_token
    return torch.where(mask, rewards, torch.zeros_like(rewards))


def estimate(spec: EstimatorSpec, samples: Samples, scores: Scores, forwards: Forwards, token_rewards: Tensor,
             cfg: EstimatorConfig, dist: DistContext = SINGLE) -> Targets:
    """Run the estimator on the step; whiten the advantages over the batch when asked (over the
    global batch of every rank in a data-parallel run: estimators themselves are per row or per
    group, and a group never spans ranks). An episode's row (`samples.context_mask`) is estimated
    over the model's tokens only, the environment's spans skipped (estimators/episodes.py). What the
    estimator returns is checked where it arrives (`estimators.checked_estimate`: a plug-in's bad output
    stops the run naming it)."""
    fn = lambda x: checked_estimate(spec, x)  # noqa: E731
    run = fn if samples.context_mask is None else lambda x: over_model_tokens(fn, x)
    out = run(
        EstimatorInput(
            token_rewards=token_rewards,
            response_mask=samples.response_mask,
            group_size=samples.group_size,
            values=forwards.values,
            baseline_scores=scores.baseline,
            gamma=cfg.gamma,
            lam=cfg.lam,
            n_step=cfg.n_step,
        )
    )
    advantages = dist.whiten(out.advantages, samples.response_mask) if cfg.whiten else out.advantages
    return Targets(token_rewards, advantages, out.returns, out.stats)


def sequence_kl(logprobs: Tensor | None, ref_logprobs: Tensor | None, mask: Tensor) -> float | None:
    """Mean over rows of Σ_t k1_t: the per-sequence KL to the reference that is logged and controlled
    (one process; `DistContext.sequence_kl` is the global one)."""
    per_token = token_kl(logprobs, ref_logprobs, mask, "k1")
    return None if per_token is None else masked_sum(per_token, mask, dim=-1).mean().item()
