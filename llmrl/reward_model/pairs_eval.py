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
from ..engines.turns import left_pad
from ..models.prefix import PromptGroups
from ..models.scorer import PairBatch, RewardScorer, tokenized
from ..models.sequences import layout
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


def pair_forward(scorer: RewardScorer, tokenizer: Any, pairs: Sequence[Pair], share: bool = True) -> tuple[Tensor, Tensor]:
    """(r_w, r_l), (P,) each, of `pairs` (chosen rows first), the graph kept for the update: with `share`, the
    tokens both texts of a pair start with run once (`shared_pairs`), else one plain forward of 2P right-padded
    whole texts. LoRA dropout drawing masks in a gradient forward keeps the plain one: a prefix run once would
    give both texts one mask where each draws its own."""
    device = next(scorer.head.parameters()).device
    texts = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    dropping = torch.is_grad_enabled() and any(d.training and d.p > 0 for d in scorer.dropouts)
    batch = shared_pairs(tokenizer, texts, device) if share and not dropping else None
    if batch is None:
        ids, mask = tokenized(tokenizer, texts, device)
        r = scorer(ids, mask, tokenizer.pad_token_id)
    else:
        r = scorer.shared(batch)
    return r[: len(pairs)], r[len(pairs):]


def shared_pairs(tokenizer: Any, texts: Sequence[str], device: torch.device) -> PairBatch | None:
    """The 2P texts (P chosen, then their P rejected) laid out to share each pair's common token prefix:
    prompt part (2P, S) left-padded, the pair's c_i ≤ min(|w_i|, |l_i|) − 1 common tokens (every text keeps a
    last token of its own); response part (2P, T) right-padded, the rest of each text; `ends` each row's ℓ
    (models/scorer.last_token's rule over the whole text) − c_i. None when a pair has no common token (nothing
    to share) or a text's ℓ lies in its shared prefix (a text ending in pad tokens)."""
    rows = [tokenizer(t)["input_ids"] for t in texts]
    n = len(rows) // 2
    common = [_common(rows[i], rows[i + n]) for i in range(n)] * 2
    last = [_last(r, tokenizer.pad_token_id) - c for r, c in zip(rows, common)]
    if min(common, default=0) == 0 or min(last) < 0:
        return None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompt_ids, prompt_mask = left_pad([r[:c] for r, c in zip(rows, common)], pad)
    rest = [r[c:] for r, c in zip(rows, common)]
    width = max(len(r) for r in rest)
    resp_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rest], dtype=torch.long)
    resp_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rest], dtype=torch.long)
    seq = layout(prompt_ids.to(device), prompt_mask.to(device), resp_ids.to(device), resp_mask.to(device))
    arange = torch.arange(n, device=device)
    ends = torch.tensor(last, dtype=torch.long, device=device)
    return PairBatch(seq, PromptGroups(arange, arange.repeat(2)), ends)


def _last(row: list[int], pad: int | None) -> int:
    """ℓ of one unpadded row: its rightmost token that is not `pad` (0 for none; the last without a pad token)."""
    return next((j for j in range(len(row) - 1, -1, -1) if row[j] != pad), 0) if pad is not None else len(row) - 1


def _common(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share, at most min(|a|, |b|) − 1."""
    limit, c = min(len(a), len(b)) - 1, 0
    while c < limit and a[c] == b[c]:
        c += 1
    return c


@torch.no_grad()
def score_pairs(scorer: RewardScorer, tokenizer: Any, pairs: Sequence[Pair], batch_size: int,
                share: bool = True) -> PairScores:
    """Every pair scored under no_grad, `batch_size` pairs per forward (`pair_forward`)."""
    chosen, rejected = [], []
    for start in range(0, len(pairs), batch_size):
        w, lose = pair_forward(scorer, tokenizer, pairs[start:start + batch_size], share)
        chosen.append(w.cpu())
        rejected.append(lose.cpu())
    empty = torch.zeros(0)
    return PairScores(torch.cat(chosen) if chosen else empty, torch.cat(rejected) if rejected else empty)


def margins_of(pairs: Sequence[Pair]) -> Tensor | None:
    """(P,) the pairs' margins m_i, None when every one is 0 (no margin column)."""
    m = torch.tensor([p.margin for p in pairs], dtype=torch.float32)
    return m if bool((m != 0).any()) else None
