"""REINFORCE++ (Hu et al. 2025, arXiv 2501.03262): returns normalised over the whole batch.

Both estimators return the un-normalised advantage; the batch ("global") normalisation is the
engine's `estimator.whiten` (on in both presets): A ← (A − mean) / sqrt(var + 1e-8) over every kept
token of the step's batch, across all ranks in a data-parallel run (step/estimate.py). That is
OpenRLHF's normalisation exactly (biased variance over tokens); verl's `masked_whiten` uses the
unbiased variance, a factor sqrt(n/(n−1)) on the std, 1.0005 at 1000 tokens.
"""

from __future__ import annotations

from .group import grouped_rewards, zero_std_fraction
from .registry import EstimatorInput, EstimatorOutput, register
from .returns import broadcast, reward_to_go


@register("reinforce_pp", q_estimate="return G_t (KL in the reward)", baseline="batch mean (estimator.whiten)")
def reinforce_pp(x: EstimatorInput) -> EstimatorOutput:
    """A_t = G_t = Σ_{k≥t} γ^k r_k with r_k = score·[k = last] − β·KL_k (k1, `kl.placement: reward`),
    i.e. r(y) − β Σ_{k≥t} KL_k at γ = 1 (paper eq. 8; verl `compute_reinforce_plus_plus_outcome_advantage`);
    the preset then whitens over the batch (eq. 10)."""
    return EstimatorOutput(advantages=reward_to_go(x.token_rewards, x.response_mask, x.gamma))


@register("reinforce_pp_baseline", q_estimate="sequence reward R", baseline="group mean, then batch whitening",
          groups=True)
def reinforce_pp_baseline(x: EstimatorInput) -> EstimatorOutput:
    """A_i = R_i − mean_g R on every token of response i, R_i = Σ_t r_t (the KL is in the loss, k2, in
    the preset); the preset then whitens over the batch, so the scale is the batch std of the centred
    rewards, not the group's (verl `compute_reinforce_plus_plus_baseline_outcome_advantage`)."""
    r = grouped_rewards(x)
    return EstimatorOutput(advantages=broadcast((r - r.mean(-1, keepdim=True)).reshape(-1), x.response_mask),
                           stats={"frac_zero_std_groups": zero_std_fraction(r)})
