"""The estimator registry: name → pure function plus what the engine must compute for it.

An estimator maps one `EstimatorInput` to one `EstimatorOutput`. The engine never branches on an
estimator's name; it reads `spec.needs` and computes only that (critic values, G samples per prompt,
a greedy rollout). Users add their own with `@register(...)` in a module they name with
`--set estimator.module=my_pkg.my_mod`.
"""

from __future__ import annotations

import importlib
import math
import numbers
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from ..errors import ConfigError, PluginError, is_builtin, plugin_name, shown


@dataclass(frozen=True)
class EstimatorInput:
    """What every estimator receives (shapes as in `llmrl.step.records`).

    token_rewards   (N, T) r_t: the score on each response's last token, plus −β·KL_t when the KL
                    is in the reward; 0 where masked
    response_mask   (N, T) bool
    group_size      G; rows [g·G, (g+1)·G) answer the same prompt
    values          (N, T) V_old(s_t) or None
    baseline_scores (N,) greedy-response reward (ReMax) or None
    gamma, lam      discount γ and GAE λ
    n_step          n of the A2C return
    """

    token_rewards: Tensor
    response_mask: Tensor
    group_size: int = 1
    values: Tensor | None = None
    baseline_scores: Tensor | None = None
    gamma: float = 1.0
    lam: float = 0.95
    n_step: int = 3


@dataclass(frozen=True)
class EstimatorOutput:
    """advantages (N, T), 0 where masked; returns (N, T) = critic targets, or None without a critic;
    stats: scalar diagnostics to log (for example `frac_zero_std_groups`)."""

    advantages: Tensor
    returns: Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Needs:
    """What an estimator needs the engine to compute besides rewards."""

    critic: bool = False
    groups: bool = False
    greedy: bool = False


Estimator = Callable[[EstimatorInput], EstimatorOutput]


@dataclass(frozen=True)
class EstimatorSpec:
    name: str
    fn: Estimator
    needs: Needs
    q_estimate: str
    baseline: str


ESTIMATORS: dict[str, EstimatorSpec] = {}


def register(
    name: str,
    *,
    q_estimate: str,
    baseline: str,
    critic: bool = False,
    groups: bool = False,
    greedy: bool = False,
) -> Callable[[Estimator], Estimator]:
    """Decorator: register `fn` under `name` with its needs. A duplicate name is an error."""

    def wrap(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"estimator '{name}' is already registered")
        ESTIMATORS[name] = EstimatorSpec(name, fn, Needs(critic, groups, greedy), q_estimate, baseline)
        return fn

    return wrap


def get_estimator(name: str) -> EstimatorSpec:
    """The spec registered under `name`; unknown names list the valid ones."""
    if name not in ESTIMATORS:
        raise ConfigError(f"Unknown estimator '{name}'; valid estimators: {', '.join(sorted(ESTIMATORS))}.")
    return ESTIMATORS[name]


def import_user_module(module: str, kind: str = "estimator") -> None:
    """Import a user's module so its `@register` (or `@register_policy_loss`) calls run; `kind`
    names what it registers in the error message."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"Cannot import {kind} module '{module}': {exc}.") from None


def checked_estimate(spec: EstimatorSpec, x: EstimatorInput) -> EstimatorOutput:
    """`spec.fn(x)`, its output checked where it arrives: an EstimatorOutput whose advantages are a
    floating tensor of x's (N, T) shape on its device, returns the same or None (not None when the
    estimator needs a critic: the critic's targets), stats {str: real number}; for a plug-in, finite
    advantages and returns wherever the inputs (rewards, values, baseline) are finite. Anything else
    is a PluginError naming the estimator and what it returned."""
    out = spec.fn(x)
    who = f"Estimator '{spec.name}' ({plugin_name(spec.fn)})"
    if not isinstance(out, EstimatorOutput):
        raise PluginError(f"{who} returned {shown(out)}, not an EstimatorOutput(advantages, returns, stats).")
    want = tuple(x.response_mask.shape)
    for field_name in ("advantages", "returns"):
        value = getattr(out, field_name)
        if value is None and (field_name == "returns" and not spec.needs.critic):
            continue
        if not (isinstance(value, Tensor) and value.is_floating_point() and tuple(value.shape) == want
                and value.device == x.response_mask.device):
            what = (f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
                    if isinstance(value, Tensor) else shown(value).removeprefix("the "))
            need = " (it needs a critic, which trains on them)" if field_name == "returns" else ""
            raise PluginError(f"{who} returned {field_name} that are {what}, for a batch of shape {want}; "
                              f"{field_name} must be a floating tensor of that shape on {x.response_mask.device}{need}.")
    if not isinstance(out.stats, dict):
        raise PluginError(f"{who} returned stats that are {shown(out.stats).removeprefix('the ')}; stats is "
                          "{name: real number}, logged in metrics.jsonl.")
    bad = [(k, v) for k, v in out.stats.items() if not isinstance(k, str) or isinstance(v, bool)
           or not isinstance(v, numbers.Real)]
    if bad:
        raise PluginError(f"{who} returned stats whose entry {bad[0][0]!r} is {shown(bad[0][1])}; stats is "
                          "{name: real number}, logged in metrics.jsonl.")
    if not is_builtin(spec.fn) and _finite(x):
        for field_name in ("advantages", "returns"):
            value = getattr(out, field_name)
            if value is not None and not bool(torch.isfinite(value).all()):
                row, col = (int(i) for i in (~torch.isfinite(value)).nonzero()[0])
                raise PluginError(f"{who} returned {field_name} holding {value[row, col].detach().item()} at row {row}, "
                                  f"token {col}, from finite rewards and values; {field_name} must be finite.")
    return out


def _finite(x: EstimatorInput) -> bool:
    """Whether every input tensor of `x` holds only finite numbers."""
    tensors = [t for t in (x.token_rewards, x.values, x.baseline_scores) if t is not None]
    return all(bool(torch.isfinite(t).all()) for t in tensors) and all(math.isfinite(v) for v in (x.gamma, x.lam))
