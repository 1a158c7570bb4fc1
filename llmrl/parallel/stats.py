"""A step's logged numbers and an evaluation over the global batch: one process's expressions when
it runs alone, sums over ranks when there are several (so the loop never asks which).

Each rank holds N/W rows; the logged means are Σ over ranks of the sums divided by Σ of the counts:

    reward_mean  = mean of the gathered (N,) scores (the very tensor one process would average);
                   likewise each reward/<part> of a weighted sum of rewards
    kl           = Σ_i Σ_t k1_it / N
    tokens       = Σ m                               response_len = tokens / N
    adv_mean     = Σ m·A / Σ m                       adv_std     = sqrt((Σ m·A² − Σm·mean²) / (Σ m − 1))
    zero_advantage: no kept token has A ≠ 0 on any rank
    estimator stats (e.g. frac_zero_std_groups): the mean of the ranks' values (every rank holds the
    same number of rows and groups, so this is the global mean)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

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


def batch_means(dist: DistContext, scores: Tensor, parts: dict[str, Tensor], mask: Tensor, advantages: Tensor,
                estimator_stats: dict[str, float]) -> dict[str, Any]:
    """The metrics-row entries that are means or counts over the step's rows (of every rank)."""
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
                      evaluate: Callable[[Sequence[Any]], tuple[float, float, list[str]]]) -> tuple[float, float, list[str]]:
    """(accuracy, mean reward, completions) of `evaluate` over all `rows`. Several processes share
    the rows: each evaluates rows[r::W], the correct counts and reward sums are summed over ranks
    and the completions gathered back into the rows' order; with a sharded base (`lockstep`) every
    rank evaluates every row, because each forward is a collective."""
    if not dist.active or dist.lockstep:
        return evaluate(rows)
    w, r = dist.world_size, dist.rank
    mine = rows[r::w]
    accuracy, reward, completions = dist.agree(lambda: evaluate(mine))
    correct, total = dist.sum_floats([round(accuracy * len(mine)), reward * len(mine)])
    parts = dist.gather_objects(completions)
    return correct / len(rows), total / len(rows), [parts[i % w][i // w] for i in range(len(rows))]
