"""A step's logged numbers and an evaluation over the global batch: one process's expressions when
it runs alone, sums over ranks when there are several (so the loop never asks which).

Each rank holds N/W rows; the logged means are Σ over ranks of the sums divided by Σ of the counts:

    reward_mean  = mean of the gathered (N,) scores (the very tensor one process would average);
                   likewise each reward/<part> of a weighted sum of rewards
    kl           = Σ_i Σ_t k1_it / N
    tokens       = Σ m                               response_len = tokens / N
    adv_mean     = Σ m·A / Σ m                       adv_std     = sqrt((Σ m·A² − Σm·mean²) / (Σ m − 1))
    zero_advantage: no kept token has A ≠ 0 on any rank
    is_* and sampler_kl (a behaviour policy μ ≠ π_old): sums over kept tokens / Σ m, maxima over ranks
    estimator stats (e.g. frac_zero_std_groups): the mean of the ranks' values (every rank holds the
    same number of rows and groups, so this is the global mean)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

import torch
from torch import Tensor

from ..ops import masked_sum
from .distributed import DistContext

R = TypeVar("R")


def sequence_kl(dist: DistContext, per_token: Tensor | None, mask: Tensor) -> float | None:
    """Mean over the (global) rows of Σ_t KL_t; None without a per-token KL."""
    if per_token is None:
        return None
    if not dist.active:
        return masked_sum(per_token, mask, dim=-1).mean().item()
    total, rows = dist.sum_floats([float(masked_sum(per_token.double(), mask)), float(mask.shape[0])])
    return total / rows


def sampler_mismatch(dist: DistContext, old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor,
                     weights: Tensor, truncated: Tensor) -> dict[str, float]:
    """How far the sampler μ is from the trainer's π_old over the kept tokens of the (global) batch,
    with d_t = log π_old_t − log μ_t, ρ_t = exp(d_t) and the correction's weights w_t (all (N, T)):

        is_logprob_diff_mean  Σ m·|d| / Σ m            is_logprob_diff_max  max over kept tokens of |d|
        is_weight_mean        Σ m·w / Σ m              is_weight_max        max over kept tokens of w
        is_truncated_frac     Σ m·truncated / Σ m      (share of tokens whose weight was cut or zeroed)
        sampler_kl            Σ m·((ρ − 1) − d) / Σ m  (k3 estimate of KL(μ‖π_old) per token, samples from μ, ≥ 0)

    Every mean is 0 (and every max 0) when no token is kept."""
    zero = torch.zeros((), dtype=torch.float64, device=mask.device)
    d = torch.where(mask, old_logprobs.double() - behaviour_logprobs.double(), zero)
    w = torch.where(mask, weights.double(), zero)
    sums = dist.sum_floats([float(mask.sum()), float(d.abs().sum()), float(w.sum()),
                            float((truncated & mask).sum()), float((torch.expm1(d) - d).sum())])
    tokens, diff, weight, cut, k3 = sums
    diff_max, weight_max = dist.max_floats([float(d.abs().max()) if d.numel() else 0.0,
                                            float(w.max()) if w.numel() else 0.0])
    per = 1.0 / tokens if tokens else 0.0
    return {"is_logprob_diff_mean": diff * per, "is_logprob_diff_max": diff_max, "is_weight_mean": weight * per,
            "is_weight_max": weight_max, "is_truncated_frac": cut * per, "sampler_kl": k3 * per}


def batch_means(dist: DistContext, scores: Tensor, parts: dict[str, Tensor], mask: Tensor, advantages: Tensor,
                estimator_stats: dict[str, float]) -> dict[str, Any]:
    """The metrics-row entries that are means or counts over the step's rows (of every rank):
    `scores`/`parts` are the rewards of the stream's prompts (dynamic sampling's round 0, run/draws.py),
    `mask` and `advantages` those of the rows trained on."""
    if dist.active:
        return _global_means(dist, scores, parts, mask, advantages, estimator_stats)
    n_tokens = int(mask.sum())
    adv = advantages[mask]
    return {
        "reward_mean": scores.mean().item(),
        **{f"reward/{k}": v.mean().item() for k, v in parts.items()},
        **estimator_stats,
        "zero_advantage": bool(adv.numel() == 0 or adv.abs().max() == 0),
        "adv_mean": adv.mean().item() if adv.numel() else 0.0,
        "adv_std": adv.std().item() if adv.numel() > 1 else 0.0,
        "response_len": n_tokens / mask.shape[0],
        "tokens": n_tokens,
    }


def _global_means(dist: DistContext, scores: Tensor, parts: dict[str, Tensor], mask: Tensor, advantages: Tensor,
                  estimator_stats: dict[str, float]) -> dict[str, Any]:
    adv = advantages.double()
    keys = sorted(estimator_stats)
    sums = dist.sum_floats([
        float(mask.shape[0]), float(mask.sum()),
        float(masked_sum(adv, mask)), float(masked_sum(adv * adv, mask)),
        float(masked_sum((adv != 0).double(), mask)),
        *[float(estimator_stats[k]) for k in keys],
    ])
    rows, tokens, a_sum, a_sq, nonzero, *est = sums
    mean = a_sum / tokens if tokens else 0.0
    var = (a_sq - tokens * mean * mean) / (tokens - 1) if tokens > 1 else 0.0
    return {
        "reward_mean": dist.gather_rows(scores).mean().item(),
        **{f"reward/{k}": dist.gather_rows(v).mean().item() for k, v in sorted(parts.items())},
        **{k: v / dist.world_size for k, v in zip(keys, est)},
        "zero_advantage": nonzero == 0,
        "adv_mean": mean,
        "adv_std": max(var, 0.0) ** 0.5,
        "response_len": tokens / rows,
        "tokens": int(tokens),
    }


def shared_evaluation(dist: DistContext, rows: Sequence[Any],
                      evaluate: Callable[[Sequence[Any]], tuple[float, float, list[str], dict[str, float]]]
                      ) -> tuple[float, float, list[str], dict[str, float]]:
    """(accuracy, mean reward, completions, {metric: mean}) of `evaluate` over all `rows`. Several
    processes share the rows: each evaluates rows[r::W]; the correct counts, reward sums and
    metric sums (mean × rows) are summed over ranks and the completions gathered back into the
    rows' order; with a sharded base (`lockstep`) every rank evaluates every row, because each
    forward is a collective."""
    if not dist.active or dist.lockstep:
        return evaluate(rows)
    w, r = dist.world_size, dist.rank
    mine = rows[r::w]
    accuracy, reward, completions, metrics = dist.agree(lambda: evaluate(mine))
    keys = sorted(metrics)  # every rank evaluates the same task: the same metric names
    correct, total, *sums = dist.sum_floats([round(accuracy * len(mine)), reward * len(mine),
                                             *[metrics[k] * len(mine) for k in keys]])
    parts = dist.gather_objects(completions)
    return (correct / len(rows), total / len(rows), [parts[i % w][i // w] for i in range(len(rows))],
            {k: v / len(rows) for k, v in zip(keys, sums)})
