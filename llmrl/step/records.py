"""The records of one training step: each is made by one verb, frozen, and never changed later.

    generate ─▶ Samples ─score─▶ Scores ─forward─▶ Forwards ─estimate─▶ Targets ─update─▶ UpdateResult

B prompts, G samples per prompt, N = B·G rows; rows [g·G, (g+1)·G) share prompt g. P = prompt
length (left-padded), T = response length (right-padded). Every (N, T) tensor holds 0 where the
response mask is False. `StepPlan` says which optional fields a step computes; it is derived from
the estimator's `needs` and the settings, never from an algorithm's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class StepPlan:
    """What a step computes besides the samples (read by the verb named in each comment)."""

    reference: bool  # forward: ref_logprobs (any KL with β > 0)
    critic: bool  # forward: values from a no-grad critic forward
    greedy: bool  # generate + score: the greedy response to each prompt and its reward (ReMax)
    old_logprobs: bool = True  # False: the update's own forward gives log π_old (update.on_policy_logprobs)
    from_generation: bool = False  # generate: log π_old from the decoding logits, not a second actor forward
    critic_in_update: bool = False  # forward: values with their graph for the critic pass (update.on_policy_values)
    base_hidden: bool = False  # forward: keep the base's hidden state at the critic's first layer (lora.critic_layers)
    behaviour: bool = False  # generate: record the engine's log μ, a policy of its own (update: IS correction)


@dataclass(frozen=True)
class EpisodeLog:
    """What each of N episodes did (step/episodes.py): turns (N,) assistant turns taken, tool_calls
    and tool_errors (N,) counts, env_reward (N,) float32 Σ of the environment's per-turn rewards,
    env_tokens (N,) the environment's tokens in the row, env_time_s wall seconds in the environment.
    early_rewards (N, T) float32, aligned with the response: the environment's reward for each turn
    but the episode's last, at that turn's last sampled token (0 elsewhere; its row sum is part of
    env_reward). The last turn's reward stays in the episode's score, on its last token
    (step/estimate.shape_rewards), so an environment that rewards only the end changes nothing.
    decode_slots: Σ over turns of (episodes still playing × the turn's longest sampled run): the token
    slots the engine decoded, of which the model's tokens are the used ones (`episode_stats`' idle share).
    turn_rewards (N, K) float32, K = rollout.max_turns: the environment's reward for each turn taken, NaN
    for a turn the episode did not reach (`episode_stats`' per-turn means).
    turn_index (N, T) long, aligned with the response: k on the tokens of the model's turn k (1-based), 0 on
    the environment's and on padding; it tells two model turns apart where the environment's answer between
    them is empty (`episode_view`) and gives the last turn's length (`step/overlong.py`).
    repeated_calls (N,) turns whose every tool call repeats one the episode had made (`episode_stats`)."""

    turns: Tensor
    tool_calls: Tensor
    tool_errors: Tensor
    env_reward: Tensor
    env_tokens: Tensor
    env_time_s: float
    early_rewards: Tensor | None = None
    decode_slots: int = 0
    turn_rewards: Tensor | None = None
    turn_index: Tensor | None = None
    repeated_calls: Tensor | None = None


@dataclass(frozen=True)
class Samples:
    """`generate`: the sampled responses to B prompts, G each.

    rows                B dataset rows ({'prompt', extra columns}) in the order of the prompts
    prompt_ids          (N, P) long, left-padded with the pad id
    prompt_mask         (N, P) bool, True = a real prompt token
    response_ids        (N, T) long, cut after the first stop token, right-padded with the pad id
    response_mask       (N, T) bool, True = a generated token that is trained on (the stop token included)
    group_size          G
    prompt_index        (N,) long, the dataset index of each row's prompt
    completions         N texts, without the stop token and padding
    behaviour_logprobs  (N, T) log μ(a_t|s_t) of the drawn tokens at the sampling temperature, from the
                        engine's own decoding, when it gave them; else None
    greedy_completions  B texts: the greedy response to each prompt (StepPlan.greedy); else None
    context_mask        episodes only (rollout.env, step/episodes.py): (N, T) bool, True on every real
                        token of the episode after the prompt, the model's and the environment's (the
                        attention); `response_mask` is then the action mask, True on the model's sampled
                        tokens only, so everything that reads it trains on those alone. None: one turn
    episodes            episodes only: what each episode did (`EpisodeLog`); else None
    """

    rows: tuple[dict[str, Any], ...]
    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    group_size: int
    prompt_index: Tensor
    completions: tuple[str, ...]
    behaviour_logprobs: Tensor | None = None
    greedy_completions: tuple[str, ...] | None = None
    context_mask: Tensor | None = None
    episodes: EpisodeLog | None = None

    @property
    def n(self) -> int:
        """N, the number of rows."""
        return self.response_ids.shape[0]

    def expanded_rows(self) -> list[dict[str, Any]]:
        """The dataset row of each of the N rows (row i answers rows[i // G])."""
        return [r for r in self.rows for _ in range(self.group_size)]


@dataclass(frozen=True)
class Scores:
    """`score`: the reward of every response.

    scores    (N,) float32, the (weighted) reward of each response
    parts     {label: (N,)} each term of a weighted reward (scores = Σ weight · term); {} for one reward
    baseline  (N,) the reward of the greedy response to the row's prompt (ReMax); else None
    """

    scores: Tensor
    parts: dict[str, Tensor] = field(default_factory=dict)
    baseline: Tensor | None = None


@dataclass(frozen=True)
class Forwards:
    """`forward`: what the no-grad (or kept-graph) forwards of the frozen sample computed.

    dtype         the float dtype of every log-prob tensor (at least float32)
    old_logprobs  (N, T) log π_old(a_t|s_t) at the sampling temperature; None when the update's own
                  forward provides them (StepPlan.old_logprobs False: `UpdateResult.old_logprobs`)
    ref_logprobs  (N, T) log π_ref, adapters disabled; None when no KL is used
    values        (N, T) V_old(s_t) from the critic, detached; None when the estimator needs no critic
    value_graph   (N, T) the same values with their graph, kept for the critic's backward
                  (StepPlan.critic_in_update); else None
    base_hidden   (N, P+T, H) the frozen base's hidden state entering the critic's first layer L−k
                  (a top-k critic's shortcut, `lora.critic_layers`); else None
    """

    dtype: torch.dtype
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    value_graph: Tensor | None = None
    base_hidden: Tensor | None = None


@dataclass(frozen=True)
class Targets:
    """`estimate`: what the update fits.

    token_rewards  (N, T) r_t = score on the last token − β·KL_t when the KL is in the reward
    advantages     (N, T) A_t for the actor (whitened over the batch when estimator.whiten)
    returns        (N, T) critic targets, or None without a critic
    stats          scalar diagnostics of the estimator (e.g. frac_zero_std_groups)
    """

    token_rewards: Tensor
    advantages: Tensor
    returns: Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class UpdateResult:
    """`update`: stats (minibatch means of the losses, gradient norms, skipped passes, gradient
    noise) and old_logprobs (N, T), the log π_old the update's own forward computed when it
    provided them (on-policy), else None."""

    stats: dict[str, float]
    old_logprobs: Tensor | None = None


@dataclass(frozen=True)
class TrainRows:
    """The per-row tensors the update's losses read, joined from Samples and Forwards; `select`
    cuts a minibatch or micro-batch of them. Fields as in Samples and Forwards, except
    `behaviour_logprobs`: log μ only where it is not π_old itself (an engine whose decoding is not the
    trainer's, e.g. vLLM), so the update corrects for μ ≠ π_old (llmrl/corrections.py); None when the
    engine gave none or when its log-probs are the very log π_old tensor (StepPlan.from_generation)."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    base_hidden: Tensor | None = None
    behaviour_logprobs: Tensor | None = None
    context_mask: Tensor | None = None  # episodes: the tokens attended to (Samples.context_mask)

    @classmethod
    def of(cls, samples: Samples, forwards: Forwards) -> "TrainRows":
        mu = samples.behaviour_logprobs
        return cls(samples.prompt_ids, samples.prompt_mask, samples.response_ids, samples.response_mask,
                   forwards.old_logprobs, forwards.ref_logprobs, forwards.values, forwards.base_hidden,
                   mu if mu is not None and forwards.old_logprobs is not mu else None, samples.context_mask)

    @property
    def n(self) -> int:
        return self.response_ids.shape[0]

    def select(self, rows: Tensor) -> "TrainRows":
        """The rows with the given indices (every tensor field indexed on dim 0)."""
        picked = {f.name: getattr(self, f.name)[rows] for f in fields(self) if getattr(self, f.name) is not None}
        return replace(self, **picked)


def check_shapes(samples: Samples, forwards: Forwards | None = None, scores: Scores | None = None) -> None:
    """Check shapes, mask dtype/polarity and that masked positions hold 0."""
    n, t = samples.response_ids.shape
    mask = samples.response_mask
    assert mask.shape == (n, t) and mask.dtype == torch.bool
    assert samples.prompt_ids.shape[0] == n and samples.prompt_mask.shape == samples.prompt_ids.shape
    assert n % samples.group_size == 0, f"{n} rows do not split into groups of {samples.group_size}"
    assert len(samples.completions) == n and samples.prompt_index.shape == (n,)
    per_token = {"behaviour_logprobs": samples.behaviour_logprobs}
    if forwards is not None:
        per_token.update(old_logprobs=forwards.old_logprobs, ref_logprobs=forwards.ref_logprobs, values=forwards.values)
    for name, x in per_token.items():
        if x is None:
            continue
        assert x.shape == (n, t), f"{name} has shape {tuple(x.shape)}, expected {(n, t)}"
        assert not x.masked_select(~mask).any(), f"{name} is non-zero where masked"
    if scores is not None:
        for name, x in (("scores", scores.scores), ("baseline", scores.baseline)):
            assert x is None or x.shape == (n,), f"{name} has shape {tuple(x.shape)}, expected {(n,)}"
