"""evaluate: greedy accuracy and mean reward of the actor on held-out prompts; evaluate_sampled:
K sampled completions per prompt and the unbiased pass@k estimator. Both generate through an
engine (engines/), like the training step."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from ..engines.base import GenerationEngine, GenerationRequest, SamplingSettings, row_keys
from ..ops import ends_with_stop
from ..config.schema import RolloutConfig
from ..envs import EnvSpec
from ..models.prompts import Prompt
from ..step.episodes import generate_episodes
from ..step.generate import decode, encode_prompts
from ..step.score import score_texts, with_env_rewards


@dataclass(frozen=True)
class EvalResult:
    """accuracy: share of completions whose reward ≥ the task's success threshold; metrics: the
    task's own metrics (`Task.metrics`, e.g. strict_accuracy) and, for every task,
    eos_rate = share of completions that ended with a stop token (not cut at max_new_tokens) and
    response_len = mean completion length in tokens (the stop token counted)."""

    accuracy: float
    reward_mean: float
    completions: list[str]
    metrics: dict[str, float] = field(default_factory=dict)
    env_rewards: list[float] | None = None
    """Episodes: each row's Σ of the environment's rewards, part of its reward (None: one turn)."""


@torch.no_grad()
def evaluate(
    engine: GenerationEngine,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, Any]],
    reward_fn: Callable[..., Sequence[float]],
    *,
    max_new_tokens: int,
    success: float = 1.0,
    batch_size: int = 256,
    role: str = "actor",
    metrics: Mapping[str, Callable[..., Sequence[float]]] | None = None,
    stop_ids: int | Sequence[int] = (),
) -> EvalResult:
    """Greedy-decode every row's prompt in batches (under `role`; rows that share an opening batched
    together: `batch_order`) and score the completions, returned in row order; the task's `metrics`
    are means of their 0/1 values; eos_rate counts the completions whose last token is one of
    `stop_ids`."""
    order = batch_order([r["prompt"] for r in rows], batch_size)
    texts: list[str] = []
    lengths, ended = [], []
    for start in range(0, len(rows), batch_size):
        chunk = [rows[i] for i in order[start : start + batch_size]]
        ids, mask = encode_prompts(tokenizer, [r["prompt"] for r in chunk], torch.device("cpu"))
        gen = engine.generate(GenerationRequest(ids, mask, 1, SamplingSettings(max_new_tokens), role=role))
        texts += decode(tokenizer, gen.response_ids, gen.response_mask)
        lengths.append(gen.response_mask.sum(-1).cpu())
        ended.append(ends_with_stop(gen.response_ids, gen.response_mask, stop_ids).cpu())
    completions = in_row_order(texts, order)
    rewards = score_texts(reward_fn, rows, completions) if rows else torch.zeros(0)
    n = max(len(rows), 1)
    extra = {name: float(score_texts(fn, rows, completions).sum()) / n for name, fn in (metrics or {}).items()} if rows else {}
    if rows:
        extra["eos_rate"] = float(torch.cat(ended).sum()) / n
        extra["response_len"] = float(torch.cat(lengths).sum()) / n
    return EvalResult(float((rewards >= success).sum()) / n, float(rewards.sum()) / n, completions, extra)


def batch_order(prompts: Sequence[Prompt], batch_size: int) -> list[int]:
    """The order in which the rows of an evaluation are batched: as given when they fit one batch (the
    plain batch, bit for bit); otherwise sorted by their prompt's text, so that rows sharing an opening
    share a batch. The engine prefills the opening every row of a batch starts with once
    (models/prefix.py), and a mixture's tasks differ after the chat template's first tokens: batched in
    turn (1, 2, 3, 1, …) every batch pads to the longest task and shares no task's instructions."""
    if len(prompts) <= batch_size:
        return list(range(len(prompts)))
    text = [p if isinstance(p, str) else json.dumps(p, sort_keys=True, ensure_ascii=False) for p in prompts]
    return sorted(range(len(prompts)), key=text.__getitem__)


def in_row_order(values: Sequence[Any], order: Sequence[int]) -> list[Any]:
    """values[j] belongs to row order[j]: the values in row order (the inverse of `batch_order`)."""
    out: list[Any] = [None] * len(order)
    for j, i in enumerate(order):
        out[i] = values[j]
    return out


@torch.no_grad()
def evaluate_episodes(engine: GenerationEngine, tokenizer: PreTrainedTokenizerBase, env: EnvSpec,
                      rows: Sequence[dict[str, Any]], reward_fn: Callable[..., Sequence[float]], *, cfg: RolloutConfig,
                      success: float = 1.0, batch_size: int = 256,
                      metrics: Mapping[str, Callable[..., Sequence[float]]] | None = None,
                      stop_ids: Sequence[int] = (), context: int | None = None, role: str = "actor") -> EvalResult:
    """`evaluate` in episodes (step/episodes.py): greedy turns in the environment `env`, each episode's
    reward = the task's reward of its last turn + Σ the environment's rewards. Held-out row i's `reset`
    seed is keyed by (0, EVAL_STEP, i), a step no training takes, so an environment that builds its game
    from the seed deals it another game than any train row's (and the sampled evaluation's row i, at
    seed 0, the same game). Besides the task's
    metrics: eos_rate (the last turn ended with a stop token), response_len (the model's tokens per
    episode), turns_mean, tool_calls_per_episode and tool_error_rate (failed calls / calls, 0 without calls)."""
    completions: list[str] = []
    env_rewards, lengths, ended, turns, calls, errors = [], [], [], [], [], []
    one = replace(cfg, num_generations=1)
    for start in range(0, len(rows), batch_size):
        chunk = list(rows[start : start + batch_size])
        ep = generate_episodes(engine, tokenizer, env, chunk, torch.arange(start, start + len(chunk)), cfg=one,
                               seed=0, step=EVAL_STEP, device=torch.device("cpu"), stop_ids=stop_ids, context=context,
                               greedy=True, role=role)
        assert ep.episodes is not None
        completions += ep.completions
        env_rewards.append(ep.episodes.env_reward)
        lengths.append(ep.response_mask.sum(-1).cpu())
        ended.append(ends_with_stop(ep.response_ids, ep.response_mask, stop_ids).cpu())
        turns.append(ep.episodes.turns.float())
        calls.append(ep.episodes.tool_calls.float())
        errors.append(ep.episodes.tool_errors.float())
    if not rows:
        return EvalResult(0.0, 0.0, [], {})
    rewards = with_env_rewards(score_texts(reward_fn, rows, completions), torch.cat(env_rewards))
    n = len(rows)
    extra = {name: float(score_texts(fn, rows, completions).sum()) / n for name, fn in (metrics or {}).items()}
    extra.update(eos_rate=float(torch.cat(ended).sum()) / n, response_len=float(torch.cat(lengths).sum()) / n,
                 turns_mean=float(torch.cat(turns).mean()), tool_calls_per_episode=float(torch.cat(calls).mean()),
                 tool_error_rate=float(torch.cat(errors).sum() / torch.cat(calls).sum().clamp(min=1)))
    return EvalResult(float((rewards >= success).sum()) / n, float(rewards.sum()) / n, completions, extra,
                      torch.cat(env_rewards).tolist())


@torch.no_grad()
def evaluate_sampled_episodes(engine: GenerationEngine, tokenizer: PreTrainedTokenizerBase, env: EnvSpec,
                              rows: Sequence[dict[str, Any]], reward_fn: Callable[..., Sequence[float]], *,
                              cfg: RolloutConfig, samples: int, seed: int = 0, success: float = 1.0,
                              batch_size: int = 256, stop_ids: Sequence[int] = (), context: int | None = None,
                              role: str = "actor") -> SampledResult:
    """`evaluate_sampled` in episodes: K = `samples` sampled episodes per row (cfg's temperature and
    top_p), keyed by (seed, EVAL_STEP, row, sample, turn) as a training rollout, so the result does not
    depend on `batch_size`; pass@1 and pass@K over the episodes' rewards (task + environment)."""
    k_cfg = replace(cfg, num_generations=samples)
    per = max(1, batch_size // samples)
    texts: list[str] = []
    env_rewards = []
    for start in range(0, len(rows), per):
        chunk = list(rows[start : start + per])
        ep = generate_episodes(engine, tokenizer, env, chunk, torch.arange(start, start + len(chunk)), cfg=k_cfg,
                               seed=seed, step=EVAL_STEP, device=torch.device("cpu"), stop_ids=stop_ids,
                               context=context, role=role)
        assert ep.episodes is not None
        texts += ep.completions
        env_rewards.append(ep.episodes.env_reward)
    expanded = [r for r in rows for _ in range(samples)]
    rewards = with_env_rewards(score_texts(reward_fn, expanded, texts), torch.cat(env_rewards)) if rows else torch.zeros(0)
    correct = (rewards >= success).view(len(rows), samples).sum(1).tolist() if rows else []
    ks = sorted({1, samples})
    pass_at = {k: sum(pass_at_k(samples, c, k) for c in correct) / max(len(rows), 1) for k in ks}
    grouped = [texts[i * samples : (i + 1) * samples] for i in range(len(rows))]
    return SampledResult(samples, correct, float(rewards.double().mean()) if rows else 0.0, pass_at, grouped)


def per_group(rows: Sequence[dict[str, Any]], completions: Sequence[str], reward_fn: Callable[..., Sequence[float]], *,
              by: str, success: float = 1.0,
              metrics: Mapping[str, Callable[..., Sequence[float]]] | None = None,
              env_rewards: Sequence[float] | None = None) -> dict[str, float]:
    """For each value g of the rows' column `by` (a mixture's task), in order of first appearance:
    `accuracy/<g>` = share of g's rows whose reward ≥ success, the reward being the task's of the
    completion + the row's `env_rewards` (episodes: the environment's, as in the total accuracy), and
    `<metric>/<g>` = the mean of each of the task's metrics over g's rows. Scored again from the
    completions, so it holds for an evaluation shared by several processes too."""
    out: dict[str, float] = {}
    for g in dict.fromkeys(r[by] for r in rows):
        idx = [i for i, r in enumerate(rows) if r[by] == g]
        part, texts = [rows[i] for i in idx], [completions[i] for i in idx]
        rewards = score_texts(reward_fn, part, texts)
        if env_rewards is not None:
            rewards = with_env_rewards(rewards, torch.tensor([env_rewards[i] for i in idx]))
        out[f"accuracy/{g}"] = float((rewards >= success).sum()) / len(idx)
        for name, fn in (metrics or {}).items():
            out[f"{name}/{g}"] = float(score_texts(fn, part, texts).sum()) / len(idx)
    return out


def with_groups(result: EvalResult, rows: Sequence[dict[str, Any]], task: Any) -> EvalResult:
    """`result` with the per-task numbers of `per_group` among its metrics when the task has a `by` column."""
    if not getattr(task, "by", None) or not rows:
        return result
    extra = per_group(rows, result.completions, task.reward, by=task.by, success=task.success, metrics=task.metrics,
                      env_rewards=result.env_rewards)
    return replace(result, metrics={**result.metrics, **extra})


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. 2021 (Codex, eq. 1) from n samples of which c are correct:

        pass@k = 1 − C(n−c, k) / C(n, k) = 1 − ∏_{i=n−c+1}^{n} (1 − k/i)

    (the product form avoids huge binomials). 1.0 when fewer than k samples are wrong.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


@dataclass(frozen=True)
class SampledResult:
    """K sampled completions per prompt: `correct[i]` of prompt i's K reached the success threshold.
    pass_at[k] is the mean over prompts of `pass_at_k(K, correct[i], k)`."""

    samples: int
    correct: list[int]
    reward_mean: float
    pass_at: dict[int, float]
    completions: list[list[str]]


EVAL_STEP = -1
"""The `step` slot of an evaluation's per-row uniforms: never one a training step uses."""


@torch.no_grad()
def evaluate_sampled(
    engine: GenerationEngine,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, Any]],
    reward_fn: Callable[..., Sequence[float]],
    *,
    samples: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    success: float = 1.0,
    batch_size: int = 256,
    role: str = "actor",
) -> SampledResult:
    """Sample K = `samples` completions per prompt and report pass@1 and pass@K.

    Sample j of prompt i draws its uniforms from (seed, EVAL_STEP, i, j) exactly as a training
    rollout does, so the result does not depend on `batch_size` nor on the order rows are batched in
    (`batch_order`).
    """
    order = batch_order([r["prompt"] for r in rows], max(1, batch_size // samples)) if samples else list(range(len(rows)))
    prompts = [rows[i]["prompt"] for i in order for _ in range(samples)]
    prompt_index = torch.tensor(order, dtype=torch.long).repeat_interleave(samples)
    sample_index = torch.arange(samples).repeat(len(rows))
    drawn: list[str] = []
    for start in range(0, len(prompts), batch_size):
        stop = start + batch_size
        ids, mask = encode_prompts(tokenizer, prompts[start:stop], torch.device("cpu"))
        keys = row_keys(seed, EVAL_STEP, prompt_index[start:stop], sample_index[start:stop])
        settings = SamplingSettings(max_new_tokens, temperature, top_p)
        gen = engine.generate(GenerationRequest(ids, mask, 1, settings, keys, role=role))
        drawn += decode(tokenizer, gen.response_ids, gen.response_mask)
    per_row = in_row_order([drawn[j * samples : (j + 1) * samples] for j in range(len(rows))], order)
    texts = [t for group in per_row for t in group]
    expanded = [r for r in rows for _ in range(samples)]
    rewards = score_texts(reward_fn, expanded, texts) if rows else torch.zeros(0)
    correct = (rewards >= success).view(len(rows), samples).sum(1).tolist() if rows else []
    ks = sorted({1, samples})
    pass_at = {k: sum(pass_at_k(samples, c, k) for c in correct) / max(len(rows), 1) for k in ks}
    grouped = [texts[i * samples : (i + 1) * samples] for i in range(len(rows))]
    return SampledResult(samples, correct, float(rewards.double().mean()) if rows else 0.0, pass_at, grouped)
