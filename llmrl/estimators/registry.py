"""The estimator registry: name → pure function plus what the engine must compute for it.

An estimator maps one `EstimatorInput` to one `EstimatorOutput`. The engine never branches on an
estimator's name; it reads `spec.needs` and computes only that (critic values, G samples per prompt,
a greedy rollout). Users add their own with `@register(...)` in a module they name with
`--set estimator.module=my_pkg.my_mod`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from torch import Tensor

from ..errors import ConfigError


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
