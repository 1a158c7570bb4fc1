"""score: completions → one float each, through the task's reward function, checked."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ..errors import RunFailed


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class RewardFailed(RunFailed):
    """The reward function misbehaved before any update of the step: the state is consistent."""

    consistent = True


def score(reward_fn: Callable[..., Sequence[float]], rows: Sequence[dict[str, Any]], completions: Sequence[str]) -> Tensor:
    """(N,) float32 rewards for row-aligned `rows` (dicts with 'prompt' and extra columns).

    The reward function is called as `reward_fn(prompts, completions, **columns)`. A function that
    raises, returns the wrong count or a non-finite value stops the run with a `RunFailed`.
    """
    prompts = [r["prompt"] for r in rows]
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
    try:
        values = list(reward_fn(prompts, list(completions), **columns))
    except Exception as exc:  # a user's function: report it, never a traceback
        raise RewardFailed(f"Reward function '{_name(reward_fn)}' raised {type(exc).__name__}: {exc}.") from exc
    if len(values) != len(completions):
        raise RewardFailed(
            f"Reward function '{_name(reward_fn)}' returned {len(values)} values for {len(completions)} completions."
        )
    try:
        floats = [float(v) for v in values]
    except (TypeError, ValueError):
        raise RewardFailed(f"Reward function '{_name(reward_fn)}' returned a value that is not a number.") from None
    if not all(math.isfinite(v) for v in floats):
        raise RewardFailed(f"Reward function '{_name(reward_fn)}' returned NaN or infinity.")
    return torch.tensor(floats, dtype=torch.float32)
