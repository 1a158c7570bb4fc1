"""score: `Samples` → `Scores`, one float per completion through the task's reward function, checked."""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ..errors import PluginError
from .records import Samples, Scores


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class RewardFailed(PluginError):
    """The reward function (or model) misbehaved before any update of the step: the state is consistent."""


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
    raises or calls sys.exit, returns something other than one real number per completion, or a
    value that float32 cannot hold (NaN, ±inf, |r| > 3.4e38) stops the run with a `RunFailed`.
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
    parts = {c.label: _checked(c.label, c, prompts, completions, columns, getattr(c, "kind", "Reward function"))
             for c in components}
    total = torch.zeros(len(completions), dtype=torch.float32)
    for c in components:
        total = total + c.weight * parts[c.label]
    if not torch.isfinite(total).all():
        i = int((~torch.isfinite(total)).nonzero()[0])
        raise RewardFailed(f"The weighted reward Σ weight·r of completion {i} overflows float32 "
                           f"({', '.join(f'{c.label}: {float(parts[c.label][i]):g}' for c in components)}); "
                           "scale the terms or their weights down.")
    return total, parts


F32_MAX = torch.finfo(torch.float32).max  # ≈ 3.4028e38: rewards are float32 tensors from here on


def with_env_rewards(task: Tensor, env: Tensor) -> Tensor:
    """(N,) float32 episode rewards: the task's reward of each episode's last turn `task` (N,) plus the
    environment's summed rewards `env` (N,). Each is within float32's range (`_checked`, and the
    environment's sum in step/episodes.py) but their sum may not be: a RewardFailed names the episode."""
    total = task + env.to(device=task.device, dtype=task.dtype)
    if not torch.isfinite(total).all():
        i = int((~torch.isfinite(total)).nonzero()[0])
        raise RewardFailed(f"The reward of episode {i} overflows float32: the task's reward {float(task[i]):g} plus "
                           f"the environment's {float(env[i]):g}; scale one of them down.")
    return total


def _checked(name: str, fn: Callable[..., Sequence[float]], prompts: list[Any], completions: Sequence[str],
             columns: dict[str, list[Any]], kind: str = "Reward function") -> Tensor:
    """(N,) float32: one real number per completion, each finite in float32, or a RewardFailed
    naming the function (`kind`: 'Reward function' or 'Reward model') and saying what it did (raised,
    called sys.exit, returned something else)."""
    try:
        returned = fn(prompts, list(completions), **columns)
    except PluginError as exc:  # a reward model's own check (rewards/model.check_logits)
        raise RewardFailed(str(exc)) from None
    except (Exception, SystemExit) as exc:  # a user's function: report it, never a traceback or its exit
        how = f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else f"raised {type(exc).__name__}: {exc}"
        raise RewardFailed(f"{kind} '{name}' {how}.") from exc
    return checked_rewards(name, returned, len(completions), kind)


def checked_rewards(name: str, returned: Any, n: int, kind: str = "Reward function") -> Tensor:
    """(n,) float32 of what a reward returned for n completions, or a RewardFailed saying what is wrong:
    one real number (not a bool) per completion, each finite within float32's range."""
    values = _as_list(name, returned, kind)
    if len(values) != n:
        raise RewardFailed(f"{kind} '{name}' returned {len(values)} values for {n} completions.")
    floats = []
    for i, v in enumerate(values):
        x = _number(v)
        if x is None:
            raise RewardFailed(f"{kind} '{name}' returned {_what(v)} for completion {i}, not a number.")
        if not math.isfinite(x):
            raise RewardFailed(f"{kind} '{name}' returned NaN or infinity ({x} for completion {i}).")
        if abs(x) > F32_MAX:
            raise RewardFailed(f"{kind} '{name}' returned {x:g} for completion {i}, beyond the float32 "
                               f"range (|r| ≤ {F32_MAX:.4g}) rewards are trained in; scale it down.")
        floats.append(x)
    return torch.tensor(floats, dtype=torch.float32)


def _as_list(name: str, returned: Any, kind: str = "Reward function") -> list[Any]:
    """A list, tuple (any non-text Sequence) or 1-D tensor/array as a list; anything else refused."""
    if hasattr(returned, "tolist") and hasattr(returned, "ndim"):  # torch.Tensor, numpy.ndarray
        if returned.ndim != 1:
            raise RewardFailed(f"{kind} '{name}' returned an array of shape {tuple(returned.shape)}, "
                               "not one number per completion.")
        return list(returned.tolist())
    if isinstance(returned, Sequence) and not isinstance(returned, (str, bytes)):
        return list(returned)
    raise RewardFailed(f"{kind} '{name}' returned {_what(returned)}, not a list of numbers.")


def _number(v: Any) -> float | None:
    """`v` as a float when it is a real number (int, float, a numpy or 0-d tensor one), not a bool."""
    if getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    return float(v)


def _what(v: Any) -> str:
    """A short description of a returned object for an error message."""
    if v is None:
        return "None"
    if isinstance(v, (str, bytes)):
        return f"the {type(v).__name__} {v[:40]!r}"
    return f"a {type(v).__name__}"
