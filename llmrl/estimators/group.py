"""Critic-free estimators on the sequence reward R with a baseline from the other samples.

Every token of a response gets the same advantage. Rows [g·G, (g+1)·G) form group g.
"""

from __future__ import annotations

from torch import Tensor

from .registry import EstimatorInput, EstimatorOutput, register
from .returns import broadcast, sequence_reward

GRPO_EPS = 1e-6


def grouped_rewards(x: EstimatorInput) -> Tensor:
    """R reshaped to (B, G)."""
    return sequence_reward(x.token_rewards, x.response_mask).view(-1, x.group_size)


def zero_std_fraction(groups: Tensor) -> float:
    """Share of groups whose rewards are all equal (they carry no learning signal)."""
    return (groups.max(-1).values == groups.min(-1).values).float().mean().item()


def _output(per_row: Tensor, x: EstimatorInput, groups: Tensor) -> EstimatorOutput:
    return EstimatorOutput(
        advantages=broadcast(per_row.reshape(-1), x.response_mask),
        stats={"frac_zero_std_groups": zero_std_fraction(groups)},
    )


@register("grpo", q_estimate="sequence reward R", baseline="group mean, divided by group std", groups=True)
def grpo(x: EstimatorInput) -> EstimatorOutput:
    """A_i = (R_i − mean_g R) / (std_g R + 1e-6), std unbiased (Shao et al. 2024, DeepSeekMath)."""
    r = grouped_rewards(x)
    adv = (r - r.mean(-1, keepdim=True)) / (r.std(-1, correction=1, keepdim=True) + GRPO_EPS)
    return _output(adv, x, r)


@register("dr_grpo", q_estimate="sequence reward R", baseline="group mean (no std division)", groups=True)
def dr_grpo(x: EstimatorInput) -> EstimatorOutput:
    """A_i = R_i − mean_g R (Liu et al. 2025, "Understanding R1-Zero-Like Training")."""
    r = grouped_rewards(x)
    return _output(r - r.mean(-1, keepdim=True), x, r)


@register("rloo", q_estimate="sequence reward R", baseline="mean of the other G−1 samples", groups=True)
def rloo(x: EstimatorInput) -> EstimatorOutput:
    """A_i = R_i − (Σ_j R_j − R_i)/(G − 1) (Ahmadian et al. 2024, "Back to Basics")."""
    r = grouped_rewards(x)
    g = r.shape[-1]
    baseline = (r.sum(-1, keepdim=True) - r) / (g - 1)
    return _output(r - baseline, x, r)


@register("remax", q_estimate="sequence reward R", baseline="reward of the greedy response", greedy=True)
def remax(x: EstimatorInput) -> EstimatorOutput:
    """A_i = R_i − R(greedy response to the same prompt) (Li et al. 2023, ReMax)."""
    assert x.baseline_scores is not None
    r = sequence_reward(x.token_rewards, x.response_mask)
    adv = r - x.baseline_scores.to(r.dtype)
    same = (adv == 0).float().mean().item()
    return EstimatorOutput(advantages=broadcast(adv, x.response_mask), stats={"frac_zero_adv": same})

