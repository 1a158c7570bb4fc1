"""DAPO's overlong handling (Yu et al. 2025, §3.4): a soft length penalty near `rollout.max_new_tokens`
(`reward.overlong_buffer`) and leaving truncated completions out of the losses (`update.mask_truncated`).
Both are off by default; the `dapo` preset turns both on.

A completion is truncated when it holds L_max = `rollout.max_new_tokens` tokens and the last is not
EOS: generation was cut, so its reward judges an unfinished answer.

Episodes (rollout.env, step/episodes.py): L_max is a limit per turn, and a turn that ends without a
stop token ends the episode, so only an episode's last turn can have been cut. Both settings judge
that turn: an episode is truncated when its last turn ends without a stop token (cut at
max_new_tokens, at rollout.max_episode_tokens or at the context), and its length for the penalty is
the last turn's tokens, or L_max when it was cut (the full penalty, as a cut single-turn answer
gets). The earlier turns all ended with a stop token within L_max and are not penalised: e.g. a
calculator call of 8 tokens (at L_max = 8) then an answer of 6 is judged by its 6.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from ..config import Config
from ..ops import ends_with_stop, last_token_index
from ..parallel.distributed import SINGLE, DistContext
from .records import Samples


def truncated_rows(samples: Samples, stop_ids: int | Sequence[int], max_new_tokens: int) -> Tensor:
    """(N,) bool: the response has `max_new_tokens` tokens and its last token is not a stop token;
    an episode: its last turn's last token is not a stop token (however the turn was cut)."""
    mask = samples.response_mask
    cut = ~ends_with_stop(samples.response_ids, mask, stop_ids)
    return cut if samples.episodes is not None else (mask.sum(-1) >= max_new_tokens) & cut


def judged_lengths(samples: Samples, stop_ids: int | Sequence[int], max_new_tokens: int, dtype: torch.dtype) -> Tensor:
    """(N,) the |y| the overlong penalty judges: the response's tokens; an episode's last turn's tokens
    (EpisodeLog.turn_index == its turn count), or max_new_tokens when that turn was cut."""
    log = samples.episodes
    if log is None or log.turn_index is None:
        return samples.response_mask.sum(-1).to(dtype)
    last = (log.turn_index == log.turns.to(log.turn_index.device)[:, None]).sum(-1).to(dtype)
    cut = truncated_rows(samples, stop_ids, max_new_tokens).to(last.device)
    return torch.where(cut, torch.full_like(last, float(max_new_tokens)), last)


def eos_rate(samples: Samples, stop_ids: int | Sequence[int], dist: DistContext = SINGLE) -> float:
    """Share of the global batch's responses that end with a stop token (the rest were cut at
    `rollout.max_new_tokens`): Σ_i [last token of i is a stop id] / N, logged as `eos_rate`."""
    ended = ends_with_stop(samples.response_ids, samples.response_mask, stop_ids)
    ended, rows = dist.sum_floats([float(ended.sum()), float(ended.shape[0])])
    return ended / rows if rows else 0.0


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer: float, penalty: float) -> Tensor:
    """R_length(|y|) = −penalty · clamp((|y| − (L_max − L_cache)) / L_cache, 0, 1), L_cache = buffer · L_max.

    0 up to L_max − L_cache tokens, then linear down to −penalty at L_max (DAPO eq. 13 with the
    generation capped at L_max). (N,) lengths (EOS counted) → (N,). Example L_max = 10, buffer 0.2
    (L_cache = 2), penalty 1: |y| = 8 → 0, 9 → −0.5, 10 → −1.
    """
    cache = buffer * max_new_tokens
    ratio = ((lengths - (max_new_tokens - cache)) / cache).clamp(0.0, 1.0)
    # at L_max the ratio is 1 (clamped): said outright, since a buffer so small that L_cache is 0 in the lengths'
    # dtype gives 0/0 = NaN there (the limit L_cache → 0 is a step to −penalty at L_max), a NaN reward
    return -penalty * torch.where(lengths >= max_new_tokens, torch.ones_like(ratio), ratio)


def sequence_rewards(samples: Samples, scores: Tensor, config: Config, stop_ids: int | Sequence[int] = ()) -> Tensor:
    """(N,) what a group estimator sees as each response's reward before the forwards: the score plus
    the overlong penalty of its length (`reward.overlong_buffer`; `apply_overlong` adds the same
    number on the last token). Dynamic sampling compares these within a group (run/draws.py): a
    group of equal scores whose lengths differ inside the buffer has non-zero advantages. (KL in the
    reward, known only after the forwards, is refused with rollout.filter_groups: config/load.py.)"""
    buffer = config.reward.overlong_buffer
    if buffer is None:
        return scores
    lengths = judged_lengths(samples, stop_ids, config.rollout.max_new_tokens, scores.dtype).to(scores.device)
    return scores + overlong_penalty(lengths, config.rollout.max_new_tokens, buffer, config.reward.overlong_penalty)


def apply_overlong(samples: Samples, rewards: Tensor, config: Config, stop_ids: int | Sequence[int],
                   dist: DistContext = SINGLE) -> tuple[Tensor, Tensor | None, dict[str, Any]]:
    """(rewards, the response mask the update trains on or None, logged stats) after the overlong
    settings.

    rewards (N, T): the length penalty is added on each response's last token (where the score is),
    so every estimator sees it as part of the reward; the update's mask (N, T) has the truncated
    rows cleared (`update.mask_truncated`): they weigh nothing in any loss and count in no token
    total (None: train on every row). Stats, over the global batch: `truncated_frac` (share of
    truncated rows) and `overlong_penalty` (mean penalty). With both settings off, the rewards are
    returned as given, with None and no stats.
    """
    buffer, mask_cut = config.reward.overlong_buffer, config.update.mask_truncated
    if buffer is None and not mask_cut:
        return rewards, None, {}
    max_new = config.rollout.max_new_tokens
    cut = truncated_rows(samples, stop_ids, max_new)
    sums = [float(cut.sum())]
    if buffer is not None:
        mask = samples.response_mask
        lengths = judged_lengths(samples, stop_ids, max_new, rewards.dtype).to(rewards.device)
        pen = overlong_penalty(lengths, max_new, buffer, config.reward.overlong_penalty)
        rows = torch.arange(samples.n, device=rewards.device)
        rewards = rewards.clone()
        rewards[rows, last_token_index(mask)] += pen
        rewards = torch.where(mask, rewards, torch.zeros_like(rewards))
        sums.append(float(pen.sum()))
    trained = samples.response_mask & ~cut[:, None] if mask_cut else None
    n = float(samples.n)
    if dist.active:
        *sums, n = dist.sum_floats([*sums, n])
    stats = {"truncated_frac": sums[0] / n}
    if buffer is not None:
        stats["overlong_penalty"] = sums[1] / n
    return rewards, trained, stats
