"""A data-parallel step's logged numbers over the global batch (all ranks), from per-rank sums.

Each rank holds N/W rows; the logged means are Σ over ranks of the sums divided by Σ of the counts:

    reward_mean  = mean of the gathered (N,) scores (the very tensor one process would average);
                   likewise each reward/<part> of a weighted sum of rewards
    kl           = Σ_i Σ_t k1_it / N
    tokens       = Σ m                               response_len = tokens / N
    adv_mean     = Σ m·A / Σ m                       adv_std     = sqrt((Σ m·A² − Σm·mean²) / (Σ m − 1))
    zero_advantage: no kept token has A ≠ 0 on any rank
    estimator stats (e.g. frac_zero_std_groups): the mean of the ranks' values (every rank holds the
    same number of rows and groups, so this is the global mean)

Only used when the world size is > 1; the single-process trainer keeps its own expressions.
"""

from __future__ import annotations

from typing import Any

from ..step.records import RolloutBatch
from .distributed import DistContext
from ..estimators import EstimatorOutput
from ..ops import masked_sum
from ..step.estimate import token_kl


def global_kl(dist: DistContext, batch: RolloutBatch) -> float | None:
    """Mean over the global rows of Σ_t k1_t (what `sequence_kl` is for one process); None without a reference."""
    per_token = token_kl(batch, "k1")
    if per_token is None:
        return None
    total, rows = dist.sum_floats([float(masked_sum(per_token.double(), batch.response_mask)), float(batch.rows)])
    return total / rows


def global_row(dist: DistContext, batch: RolloutBatch, out: EstimatorOutput) -> dict[str, Any]:
    """The metrics-row entries that are means or counts over the batch, over every rank's rows."""
    assert batch.scores is not None
    mask = batch.response_mask
    adv = out.advantages.double()
    keys = sorted(out.stats)
    sums = dist.sum_floats([
        float(batch.rows), float(mask.sum()),
        float(masked_sum(adv, mask)), float(masked_sum(adv * adv, mask)),
        float(masked_sum((adv != 0).double(), mask)),
        *[float(out.stats[k]) for k in keys],
    ])
    rows, tokens, a_sum, a_sq, nonzero, *est = sums
    mean = a_sum / tokens if tokens else 0.0
    var = (a_sq - tokens * mean * mean) / (tokens - 1) if tokens > 1 else 0.0
    return {
        "reward_mean": dist.gather_rows(batch.scores).mean().item(),
        **{f"reward/{k}": dist.gather_rows(v).mean().item() for k, v in sorted((batch.reward_parts or {}).items())},
        "zero_advantage": nonzero == 0,
        "adv_mean": mean,
        "adv_std": max(var, 0.0) ** 0.5,
        "response_len": tokens / rows,
        "tokens": int(tokens),
        **{k: v / dist.world_size for k, v in zip(keys, est)},
    }
