"""Dynamic sampling (DAPO, Yu et al. 2025, §3.2): train only on groups whose rewards differ.

A group of G responses to one prompt whose G rewards are all equal has the group-relative
advantage A_i = R_i − mean_g R = 0 for every row: it moves no group estimator and only costs a
forward and a backward. With `rollout.filter_groups` the step drops such groups before the
forward; with `rollout.max_draws` = D > 0 it then draws more prompts, up to D extra rounds, until
B informative groups are kept (DAPO's "over-sample and filter"; the surplus of the last round is
left out). These are the pure pieces; `run/draws.draw` runs the rounds.

    informative(scores, G)        (B,) bool: max_g R − min_g R > 0
    select_groups(s, r, keep)     the Samples and Scores of the kept groups, padding trimmed
    join_samples / join_scores    several rounds' Samples / Scores as one batch
    extra_prompts(...)            round d's prompts: a seeded permutation of the train rows not yet
                                  drawn in this step, keyed by (seed, step, d), so a resumed run draws
                                  the same ones
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Sequence

import torch
from torch import Tensor

from .records import EpisodeLog, Samples, Scores


def informative(scores: Tensor, group_size: int) -> Tensor:
    """(N,) rewards in groups of G contiguous rows → (B,) bool, True where the group's rewards are
    not all equal (max − min > 0)."""
    grouped = scores.view(-1, group_size)
    return grouped.amax(1) > grouped.amin(1)


def _group_rows(groups: Tensor, g: int) -> Tensor:
    """The row indices of the given groups: group k holds rows [k·G, (k+1)·G)."""
    return (groups[:, None] * g + torch.arange(g, device=groups.device)).reshape(-1)


def _trim(samples: Samples) -> Samples:
    """Drop the prompt columns that no row uses (left padding) and the response columns after the
    longest response: all of them are padding, so nothing a forward computes changes."""
    p_used = samples.prompt_mask.any(0).nonzero()
    real = samples.response_mask if samples.context_mask is None else samples.context_mask  # episodes: env tokens too
    t_used = real.any(0).nonzero()
    p0 = int(p_used[0]) if len(p_used) else samples.prompt_mask.shape[1]
    t1 = int(t_used[-1]) + 1 if len(t_used) else 1
    mu, context, log = samples.behaviour_logprobs, samples.context_mask, samples.episodes
    if log is not None and log.early_rewards is not None:
        log = replace(log, early_rewards=log.early_rewards[:, :t1])
    if log is not None and log.turn_index is not None:
        log = replace(log, turn_index=log.turn_index[:, :t1])
    return replace(samples, prompt_ids=samples.prompt_ids[:, p0:], prompt_mask=samples.prompt_mask[:, p0:],
                   response_ids=samples.response_ids[:, :t1], response_mask=samples.response_mask[:, :t1],
                   behaviour_logprobs=None if mu is None else mu[:, :t1],
                   context_mask=None if context is None else context[:, :t1], episodes=log)


def _log_rows(log: EpisodeLog | None, rows: list[int]) -> EpisodeLog | None:
    """The episode log of the given rows (env_time_s stays the round's: the time was spent either way)."""
    if log is None:
        return None
    early = None if log.early_rewards is None else log.early_rewards[rows]
    per_turn = None if log.turn_rewards is None else log.turn_rewards[rows]
    index = None if log.turn_index is None else log.turn_index[rows]
    repeated = None if log.repeated_calls is None else log.repeated_calls[rows]
    return EpisodeLog(log.turns[rows], log.tool_calls[rows], log.tool_errors[rows], log.env_reward[rows],
                      log.env_tokens[rows], log.env_time_s, early, log.decode_slots, per_turn, index, repeated)


def _join_logs(logs: Sequence[EpisodeLog | None], width: int) -> EpisodeLog | None:
    """Several rounds' episode logs as one, in order (None unless every round ran episodes); the early
    rewards right-padded with 0 to the joined response width."""
    if any(x is None for x in logs):
        return None
    cat = lambda get: torch.cat([get(x) for x in logs])  # noqa: E731
    early, index = [x.early_rewards for x in logs], [x.turn_index for x in logs]
    return EpisodeLog(cat(lambda x: x.turns), cat(lambda x: x.tool_calls), cat(lambda x: x.tool_errors),
                      cat(lambda x: x.env_reward), cat(lambda x: x.env_tokens), sum(x.env_time_s for x in logs),
                      None if any(e is None for e in early) else torch.cat([_pad(e, width, 0.0, False) for e in early]),
                      sum(x.decode_slots for x in logs),
                      None if any(x.turn_rewards is None for x in logs) else cat(lambda x: x.turn_rewards),
                      None if any(i is None for i in index) else torch.cat([_pad(i, width, 0, False) for i in index]),
                      None if any(x.repeated_calls is None for x in logs) else cat(lambda x: x.repeated_calls))


def select_groups(samples: Samples, scores: Scores, keep: Tensor) -> tuple[Samples, Scores]:
    """The records of the groups `keep` (group indices, in that order), as new records."""
    g = samples.group_size
    keep = keep.to(torch.long)
    rows = _group_rows(keep.to(samples.response_ids.device), g)
    rows_cpu = rows.cpu().tolist()
    picked = lambda x: None if x is None else x[rows.to(x.device)]  # noqa: E731
    greedy = samples.greedy_completions
    kept = replace(
        samples, rows=tuple(samples.rows[k] for k in keep.tolist()), prompt_ids=samples.prompt_ids[rows],
        prompt_mask=samples.prompt_mask[rows], response_ids=samples.response_ids[rows],
        response_mask=samples.response_mask[rows], prompt_index=samples.prompt_index[rows],
        completions=tuple(samples.completions[i] for i in rows_cpu), behaviour_logprobs=picked(samples.behaviour_logprobs),
        greedy_completions=None if greedy is None else tuple(greedy[k] for k in keep.tolist()),
        context_mask=picked(samples.context_mask), episodes=_log_rows(samples.episodes, rows_cpu))
    return _trim(kept), Scores(scores.scores[rows.to(scores.scores.device)],
                               {k: v[rows.to(v.device)] for k, v in scores.parts.items()}, picked(scores.baseline))


def _pad(x: Tensor, width: int, value: float | int | bool, left: bool) -> Tensor:
    """(N, w) → (N, width), the new columns filled with `value` on the left or the right."""
    extra = width - x.shape[1]
    if extra == 0:
        return x
    fill = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
    return torch.cat([fill, x] if left else [x, fill], dim=1)


def join_samples(parts: Sequence[Samples], pad_id: int) -> Samples:
    """Several rounds' samples (same G) as one batch, in order: prompts left-padded and responses
    right-padded to the longest of any round."""
    if len(parts) == 1:
        return parts[0]
    p = max(s.prompt_ids.shape[1] for s in parts)
    t = max(s.response_ids.shape[1] for s in parts)
    cat = lambda get, width, value, left: torch.cat([_pad(get(s), width, value, left) for s in parts])  # noqa: E731
    mus = [s.behaviour_logprobs for s in parts]
    greedy = [s.greedy_completions for s in parts]
    contexts = [s.context_mask for s in parts]
    return Samples(
        rows=tuple(r for s in parts for r in s.rows),
        prompt_ids=cat(lambda s: s.prompt_ids, p, pad_id, True), prompt_mask=cat(lambda s: s.prompt_mask, p, False, True),
        response_ids=cat(lambda s: s.response_ids, t, pad_id, False),
        response_mask=cat(lambda s: s.response_mask, t, False, False), group_size=parts[0].group_size,
        prompt_index=torch.cat([s.prompt_index for s in parts]),
        completions=tuple(c for s in parts for c in s.completions),
        behaviour_logprobs=None if any(m is None for m in mus) else torch.cat([_pad(m, t, 0.0, False) for m in mus]),
        greedy_completions=None if any(x is None for x in greedy) else tuple(c for x in greedy for c in x),
        context_mask=None if any(c is None for c in contexts) else torch.cat([_pad(c, t, False, False) for c in contexts]),
        episodes=_join_logs([s.episodes for s in parts], t),
    )


def join_scores(parts: Sequence[Scores]) -> Scores:
    """Several rounds' scores as one batch, in order."""
    if len(parts) == 1:
        return parts[0]
    baselines = [s.baseline for s in parts]
    return Scores(torch.cat([s.scores for s in parts]),
                  {k: torch.cat([s.parts[k] for s in parts]) for k in parts[0].parts},
                  None if any(b is None for b in baselines) else torch.cat(baselines))


def extra_prompts(n_rows: int, taken: set[int], count: int, seed: int, step: int, draw: int) -> Tensor:
    """(≤ count,) long: the first `count` train rows, in a permutation seeded by (seed, step, draw),
    that this step has not drawn yet (`taken`); fewer when the split runs out."""
    key = int.from_bytes(hashlib.blake2b(f"{seed}:{step}:{draw}".encode(), digest_size=8).digest(), "little") >> 1
    perm = torch.randperm(n_rows, generator=torch.Generator().manual_seed(key)).tolist()
    return torch.tensor([i for i in perm if i not in taken][:count], dtype=torch.long)
