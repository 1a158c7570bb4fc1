"""Scores of preference pairs and what they say: the Bradley–Terry loss, pairwise accuracy, mean margin.

    r_w = r(x, y_w), r_l = r(x, y_l)           (models/scorer.py)
    loss = mean_i −log σ(r_w,i − r_l,i − m_i) + c · mean_i (r_w,i + r_l,i)²      (losses.bradley_terry)
    accuracy = share of pairs with r_w > r_l (a tie counts half), margin = mean(r_w − r_l)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from ..losses import bradley_terry, pair_stats
from ..models.scorer import RewardScorer, tokenized
from ..tasks.preferences import Pair


@dataclass(frozen=True)
class PairScores:
    """r_w and r_l of a list of pairs, (P,) each, float32, on the CPU."""

    chosen: Tensor
    rejected: Tensor

    def metrics(self, prefix: str, margins: Tensor | None = None, center: float = 0.0) -> dict[str, float]:
        """{prefix}loss, accuracy, margin, chosen_score, rejected_score (means)."""
        stats = pair_stats(self.chosen, self.rejected)
        loss = bradley_terry(self.chosen, self.rejected, margins, center)
        return {f"{prefix}loss": float(loss), f"{prefix}accuracy": float(stats["accuracy"]),
                f"{prefix}margin": float(stats["margin"]), f"{prefix}chosen_score": float(self.chosen.mean()),
                f"{prefix}rejected_score": float(self.rejected.mean())}


def pair_forward(scorer: RewardScorer, tokenizer: Any, pairs: Sequence[Pair]) -> tuple[Tensor, Tensor]:
    """(r_w, r_l), (P,) each, of `pairs` in one forward of 2P right-padded rows (chosen first): the graph
    kept, for the update."""
    device = next(scorer.head.parameters()).device
    ids, mask = tokenized(tokenizer, [p.chosen for p in pairs] + [p.rejected for p in pairs], device)
    r = scorer(ids, mask, tokenizer.pad_token_id)
    return r[: len(pairs)], r[len(pairs):]


@torch.no_grad()
def score_pairs(scorer: RewardScorer, tokenizer: Any, pairs: Sequence[Pair], batch_size: int) -> PairScores:
    """Every pair scored under no_grad, `batch_size` pairs per forward."""
    chosen, rejected = [], []
    for start in range(0, len(pairs), batch_size):
        w, lose = pair_forward(scorer, tokenizer, pairs[start:start + batch_size])
        chosen.append(w.cpu())
        rejected.append(lose.cpu())
    empty = torch.zeros(0)
    return PairScores(torch.cat(chosen) if chosen else empty, torch.cat(rejected) if rejected else empty)


def margins_of(pairs: Sequence[Pair]) -> Tensor | None:
    """(P,) the pairs' margins m_i, None when every one is 0 (no margin column)."""
    m = torch.tensor([p.margin for p in pairs], dtype=torch.float32)
    return m if bool((m != 0).any()) else None
