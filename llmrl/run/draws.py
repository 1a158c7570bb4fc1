"""The generate and score verbs of a step, in rounds when dynamic sampling is on (`step/groups.py`).

    round 0:  the stream's B prompts → generate → score        (always; its rewards are the step's
                                                                 `reward_mean`, comparable across runs)
              + K more prompts in the same batch                (rollout.oversample = K, with the filter:
                                                                 extra_prompts seeded by (seed, step, 0))
    filter:   keep the groups whose G rewards differ            (rollout.filter_groups; the rewards the
                                                                 estimator sees, score + overlong penalty,
                                                                 or the scores alone: rollout.filter_on)
    round d:  n_d more prompts (extra_prompts, seeded by (seed, step, d)), their samples keyed from
              sample index d·G → generate → score → filter      (d = 1 … rollout.max_draws, while
                                                                 fewer than B groups are kept)

The K oversampled prompts cost one wider decode instead of a second round: a CPU decodes 48 rows
in about 1.2× the time of 32 (the skinny matmuls of a decoding step run far below the CPU's peak,
so more rows cost little; ae998e2:bench/probes/decode_width.py).
Round 0 keeps at most B informative groups, the stream's first.
n_d = B − kept when nothing was kept yet is B, else min(B, ⌈(B − kept) · drawn / kept⌉): the
rounds so far predict how many prompts yield the missing groups. When no round keeps a group the
step carries round 0 unfiltered to its metrics and skips the update (one_step.py: no optimizer
step, so AdamW's momentum does not move the adapter on a batch without signal).
Logged (only with filter_groups): ds_draws (extra rounds run), ds_prompts (prompts generated),
groups_dropped (all-equal groups seen), groups_kept (groups trained on), kept_share (groups_kept / B,
the actor loss's scale with rollout.filter_scale), reward_mean_trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, ContextManager

import torch

from ..models.tokenizer import stop_token_ids
from ..step.episodes import episode_stats, generate_episodes
from ..step.generate import generate
from ..step.groups import extra_prompts, informative, join_samples, join_scores, select_groups
from ..step.overlong import sequence_rewards
from ..step.records import Samples, Scores
from ..step.score import score, score_texts, with_env_rewards
from .session import Session, episode_context


@dataclass(frozen=True)
class Drawn:
    """What the rounds left: the samples and scores the step trains on, round 0's scores (the
    stream's prompts, unfiltered) and the dynamic-sampling stats ({} when it is off)."""

    samples: Samples
    scores: Scores
    stream_scores: Scores
    stats: dict[str, Any]


def draw(s: Session, step: int, rows: list[dict[str, Any]], index: torch.Tensor,
         clock: Callable[[str], ContextManager[None]]) -> Drawn:
    """Round 0, and with `rollout.filter_groups` the filter and the refill rounds."""
    cfg, plan, device = s.config, s.plan, s.stack.lm.device
    g = cfg.rollout.num_generations

    def one_round(rows: list[dict[str, Any]], index: torch.Tensor, d: int) -> tuple[Samples, Scores]:
        if s.env is not None:  # episodes (rollout.env): the episode-aware generate
            return _episodes(s, step, rows, index, clock, d * g)
        with clock("generate"):
            samples = generate(s.engine, s.tokenizer, rows, index, cfg=cfg.rollout, seed=cfg.seed, step=step,
                               device=device, logprobs=(plan.old_logprobs and plan.from_generation) or plan.behaviour,
                               greedy=plan.greedy, first_sample=d * g)
        with clock("score"):
            scores = s.dist.agree(lambda: score(samples, s.task.reward, device))
        return samples, scores

    if not cfg.rollout.filter_groups:
        first = one_round(rows, index, 0)
        return Drawn(first[0], first[1], first[1], _rollout_stats(first[0], [first[0]]))
    want, taken = len(rows), set(index.tolist())
    stops = stop_token_ids(s.tokenizer, s.stack.lm)
    more = extra_prompts(len(s.task.train), taken, cfg.rollout.oversample, cfg.seed, step, 0)
    taken |= set(more.tolist())
    current = one_round(rows + [s.task.train[i] for i in more.tolist()], torch.cat([index, more]), 0)
    first = select_groups(*current, torch.arange(want)) if len(more) else current  # the stream's B groups
    kept: list[tuple[Samples, Scores]] = []
    n_kept = dropped = extra = 0
    drawn = want + len(more)
    rounds = [current[0]]
    for d in range(cfg.rollout.max_draws + 1):
        if d > 0:
            count = want if n_kept == 0 else min(want, math.ceil((want - n_kept) * drawn / n_kept))
            more = extra_prompts(len(s.task.train), taken, count, cfg.seed, step, d)
            if not len(more):
                break
            taken |= set(more.tolist())
            drawn, extra = drawn + len(more), extra + 1
            current = one_round([s.task.train[i] for i in more.tolist()], more, d)
            rounds.append(current[0])
        raw = current[1].scores
        seen = raw if cfg.rollout.filter_on == "score" else sequence_rewards(current[0], raw, cfg, stops)
        ok = informative(seen, g)
        dropped += int((~ok).sum())
        chosen = ok.nonzero().squeeze(1)[: want - n_kept]
        if len(chosen):
            kept.append(select_groups(*current, chosen))
            n_kept += len(chosen)
        if n_kept >= want:
            break
    if kept:
        samples, scores = join_samples([k[0] for k in kept], s.tokenizer.pad_token_id), join_scores([k[1] for k in kept])
    else:  # nothing informative in any round: round 0 as drawn, for the metrics (the update is skipped)
        samples, scores = first
    stats = {"ds_draws": extra, "ds_prompts": drawn, "groups_dropped": dropped, "groups_kept": n_kept,
             "kept_share": n_kept / want, "reward_mean_trained": scores.scores.mean().item()}
    return Drawn(samples, scores, first[1], {**stats, **_rollout_stats(first[0], rounds)})


def _episodes(s: Session, step: int, rows: list[dict[str, Any]], index: torch.Tensor,
              clock: Callable[[str], ContextManager[None]], first_sample: int = 0) -> tuple[Samples, Scores]:
    """One round of episodes in the environment `s.env` (step/episodes.py), scored: the task's reward of
    each episode's last turn plus the environment's summed per-turn rewards."""
    cfg, plan, device = s.config, s.plan, s.stack.lm.device
    assert s.env is not None
    with clock("generate"):
        samples = generate_episodes(s.engine, s.tokenizer, s.env, rows, index, cfg=cfg.rollout, seed=cfg.seed,
                                    step=step, device=device, stop_ids=stop_token_ids(s.tokenizer, s.stack.lm),
                                    logprobs=(plan.old_logprobs and plan.from_generation) or plan.behaviour,
                                    context=episode_context(s),
                                    first_sample=first_sample)
    with clock("score"):
        scores = score(samples, s.task.reward, device)
    assert samples.episodes is not None
    scores = replace(scores, scores=with_env_rewards(scores.scores, samples.episodes.env_reward))
    if plan.greedy:  # ReMax: each row's greedy episode's score is the baseline of its G episodes
        baseline = _greedy_episode_scores(s, step, rows, index, clock)
        scores = replace(scores, baseline=baseline.repeat_interleave(cfg.rollout.num_generations).to(device))
    return samples, scores


def _greedy_episode_scores(s: Session, step: int, rows: list[dict[str, Any]], index: torch.Tensor,
                           clock: Callable[[str], ContextManager[None]]) -> torch.Tensor:
    """(B,) the score of one greedy episode from each row, by the actor (ReMax's baseline): the task's reward
    of its last turn + the environment's rewards. Its `reset` seeds are the row's first sample's."""
    assert s.env is not None
    with clock("generate"):
        greedy = generate_episodes(s.engine, s.tokenizer, s.env, rows, index,
                                   cfg=replace(s.config.rollout, num_generations=1), seed=s.config.seed, step=step,
                                   device=torch.device("cpu"), stop_ids=stop_token_ids(s.tokenizer, s.stack.lm),
                                   context=episode_context(s), greedy=True)
    with clock("score"):
        assert greedy.episodes is not None
        return with_env_rewards(score_texts(s.task.reward, rows, greedy.completions), greedy.episodes.env_reward)


def _rollout_stats(stream: Samples, rounds: list[Samples]) -> dict[str, Any]:
    """One-turn samples: generate_useful_frac = Σ m / Σ rows × T over every round's (N, T) response
    masks m: the share of rows × decoding steps that drew a token of an answer (a batch decoded with
    every row to its longest answer would spend the rest on finished rows; the `hf` engine's finished
    rows leave the batch instead, engines/hf_decode.py). Episodes: the stream's prompts' episode
    metrics (round 0, as `reward_mean`), with env_time_s, decode_idle_share and generate_useful_frac (the
    model's tokens / the turns' decode slots, 1 − decode_idle_share: one-turn episodes give the one-turn
    value) over every round's episodes (the time and slots were spent on all of them). Both are this
    process's batch: with several processes each decodes its own rows to its own longest answer."""
    if stream.episodes is None:
        slots = sum(r.response_mask.numel() for r in rounds)
        return {"generate_useful_frac": sum(float(r.response_mask.sum()) for r in rounds) / slots if slots else 0.0}
    logs = [(r.episodes, float(r.response_mask.sum())) for r in rounds if r.episodes is not None]
    slots = sum(log.decode_slots for log, _ in logs)
    useful = sum(acted for _, acted in logs) / slots if slots else 1.0
    return {**episode_stats(stream), "env_time_s": sum(log.env_time_s for log, _ in logs),
            "decode_idle_share": 1.0 - useful if slots else 0.0, "generate_useful_frac": useful if slots else 0.0}
