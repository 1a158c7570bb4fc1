"""score: `Samples` → `Scores`, one float per completion through the task's reward function, checked."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ..errors import RunFailed
from .records import Samples, Scores


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class RewardFailed(RunFailed):
    """The reward function misbehaved before any update of the step: the state is consistent."""

    consistent = True


def score(samples: Samples, reward_fn: Callable[..., Sequence[float]], device: torch.device) -> Scores:
    """The reward of every sampled completion, its terms, and of each greedy completion when the
    samples hold them (repeated over the prompt's G rows): the `Scores` of the step, on `device`."""
    total, parts = score_parts(reward_fn, samples.expanded_rows(), samples.completions)
    baseline = None
    if samples.greedy_completions is not None:
        greedy = score_texts(reward_fn, samples.rows, samples.greedy_completions)
        baseline = greedy.repeat_interleave(samples.group_size).to(device)
    return Scores(total.to(device), parts, baseline)


def score_texts(reward_fn: Callable[..., Sequence[float]], rows: Sequence[dict[str, Any]], completions: Sequence[str]) -> Tensor:
    """(N,) float32 rewards for row-aligned `rows` (dicts with 'prompt' and extra columns).

    The reward function is called as `reward_fn(prompts, completions, **columns)`. A function that
    raises, returns the wrong count or a non-finite value stops the run with a `RunFailed`.
    """
    return score_parts(reward_fn, rows, completions)[0]


def score_parts(reward_fn: Callable[..., Sequence[float]], rows: Sequence[dict[str, Any]],
                completions: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
    """(total (N,), {label: (N,)}): a reward with `components` (llmrl.rewards.WeightedReward) is
    scored term by term, each checked and named on its own, and totalled as Σ_k weight_k · r_k;
    any other callable is one unnamed term ({} parts)."""
    prompts = [r["prompt"] for r in rows]
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
    components = getattr(reward_fn, "components", None)
    if components is None:
        return _checked(_name(reward_fn), reward_fn, prompts, completions, columns), {}
    parts = {c.label: _checked(c.label, c, prompts, completions, columns) for c in components}
    total = torch.zeros(len(completions), dtype=torch.float32)
    for c in components:
        total = total + c.weight * parts[c.label]
    return total, parts


def _checked(name: str, fn: Callable[..., Sequence[float]], prompts: list[Any], completions: Sequence[str],
             columns: dict[str, list[Any]]) -> Tensor:
    try:
        values = list(fn(prompts, list(completions), **columns))
    except Exception as exc:  # a user's function: report it, never a traceback
        raise RewardFailed(f"Reward function '{name}' raised {type(exc).__name__}: {exc}.") from exc
    if len(values) != len(completions):
        raise RewardFailed(f"Reward function '{name}' returned {len(values)} values for {len(completions)} completions.")
    try:
        floats = [float(v) for v in values]
    except (TypeError, ValueError):
        raise RewardFailed(f"Reward function '{name}' returned a value that is not a number.") from None
    if not all(math.isfinite(v) for v in floats):
        raise RewardFailed(f"Reward function '{name}' returned NaN or infinity.")
    return torch.tensor(floats, dtype=torch.float32)
