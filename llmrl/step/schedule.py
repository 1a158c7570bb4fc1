"""schedule: the learning rate of each step, a pure function of the step index.

With s the 0-based step, S = `steps` and W = `update.warmup_steps`, the factor f(s) multiplies
`update.lr_actor` and `update.lr_critic` for every optimizer step of step s (all its epochs and
minibatches):

    warm-up   (s < W)   f = (s + 1) / (W + 1)
    constant            f = 1
    linear              f = (S − s) / (S − W)                 1 at s = W, 1/(S − W) at the last step
    cosine              f = ½ (1 + cos(π (s − W) / (S − W)))  1 at s = W, ≈ 0 at the last step

`linear` is the schedule of transformers' `get_linear_schedule_with_warmup` (TRL's default),
counted in RL steps instead of optimizer steps. Because f depends on s alone, a resumed run sets
the same rates as an uninterrupted one; extending a run (`--resume --steps N`) stretches the rest
of the schedule to the new S.
"""

from __future__ import annotations

import math

import torch

from ..config.schema import UpdateConfig


def lr_factor(step: int, steps: int, schedule: str, warmup: int) -> float:
    """f(s) above; `step` 0-based, `steps` = S ≥ 1."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant" or steps <= warmup:
        return 1.0
    progress = (step - warmup) / (steps - warmup)  # in [0, 1)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown update.lr_schedule {schedule!r}")


def set_learning_rates(opts: dict[str, torch.optim.Optimizer], cfg: UpdateConfig, step: int,
                       steps: int) -> dict[str, float]:
    """Set every role's rate for `step`; returns {'lr_actor': …, 'lr_critic': … (with a critic)}."""
    factor = lr_factor(step, steps, cfg.lr_schedule, cfg.warmup_steps)
    base = {"actor": cfg.lr_actor, "critic": cfg.lr_critic}
    rates = {}
    for role, opt in opts.items():
        rates[f"lr_{role}"] = base[role] * factor
        for group in opt.param_groups:
            group["lr"] = rates[f"lr_{role}"]
    return rates
