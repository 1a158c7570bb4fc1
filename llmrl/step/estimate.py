"""shape + estimate: scores and KL → per-token rewards → advantages and returns."""

from __future__ import annotations

import torch
from torch import Tensor

from .records import RolloutBatch
from ..config.schema import EstimatorConfig, KLConfig
from ..parallel.distributed import SINGLE, DistContext
from ..estimators import EstimatorInput, EstimatorOutput, EstimatorSpec
from ..losses import kl_penalty
from ..ops import last_token_index, masked_sum, whiten


def token_kl(batch: RolloutBatch, estimator: str) -> Tensor | None:
    """(N, T) per-token KL(π_old‖π_ref) estimate, 0 where masked; None without reference log-probs."""
    if batch.ref_logprobs is None:
        return None
    kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, estimator)
    return torch.where(batch.response_mask, kl, torch.zeros_like(kl))


def shape_rewards(batch: RolloutBatch, beta: float, kl: KLConfig) -> Tensor:
    """r_t = score·[t = last token] − β·KL_t (the KL term only when `kl.placement == 'reward'`): (N, T)."""
    assert batch.scores is not None
    rewards = torch.zeros_like(batch.old_logprobs)
    rows = torch.arange(batch.rows, device=rewards.device)
    rewards[rows, last_token_index(batch.response_mask)] = batch.scores.to(rewards.dtype)
    per_token = token_kl(batch, kl.estimator)
    if kl.placement == "reward" and per_token is not None and beta > 0:
        rewards = rewards - beta * per_token
    return torch.where(batch.response_mask, rewards, torch.zeros_like(rewards))


def estimate(spec: EstimatorSpec, batch: RolloutBatch, token_rewards: Tensor, cfg: EstimatorConfig,
             dist: DistContext = SINGLE) -> EstimatorOutput:
    """Run the estimator on the batch; whiten the advantages over the batch when asked (over the
    global batch of every rank in a data-parallel run: estimators themselves are per row or per
    group, and a group never spans ranks)."""
    out = spec.fn(
        EstimatorInput(
            token_rewards=token_rewards,
            response_mask=batch.response_mask,
            group_size=batch.group_size,
            values=batch.values,
            baseline_scores=batch.baseline_scores,
            gamma=cfg.gamma,
            lam=cfg.lam,
            n_step=cfg.n_step,
        )
    )
    if cfg.whiten:
        white = dist.whiten(out.advantages, batch.response_mask) if dist.active else whiten(out.advantages, batch.response_mask)
        out = EstimatorOutput(white, out.returns, out.stats)
    return out


def sequence_kl(batch: RolloutBatch) -> float | None:
    """Mean over rows of Σ_t k1_t: the per-sequence KL to the reference that is logged and controlled."""
    per_token = token_kl(batch, "k1")
    return None if per_token is None else masked_sum(per_token, batch.response_mask, dim=-1).mean().item()
