"""Algorithms: each is an advantage estimator plus the loss/KL defaults of its paper.

`--algo NAME` applies `ALGOS[NAME].preset` on top of the schema defaults and below the recipe and
the user's overrides, so every preset value stays overridable. Rows per step stay 512 in every
preset (512 prompts × 1, or 128 prompts × 4 samples) so that algorithms see the same token budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError


@dataclass(frozen=True)
class Algo:
    name: str
    estimator: str
    paper: str
    preset: dict[str, Any] = field(default_factory=dict)


_GROUPS = {"rollout.prompts_per_step": 128, "rollout.num_generations": 4}
# One pass over each batch in two minibatches (the second is slightly off-policy; the clipped ratio
# covers it). A single 512-row step per batch left rloo at +2 points on the built-in task, two gave +11.6.
_ONE_UPDATE = {"update.epochs": 1}

ALGOS: dict[str, Algo] = {
    a.name: a
    for a in [
        Algo("ppo", "gae", "Schulman et al. 2017 (PPO); GAE: Schulman et al. 2016",
             {"kl.placement": "reward", "kl.estimator": "k1", "estimator.whiten": True}),
        Algo("reinforce", "reinforce", "Williams 1992 (REINFORCE)",
             {"kl.placement": "reward", "kl.estimator": "k1", **_ONE_UPDATE}),
        Algo("reinforce_baseline", "reinforce_baseline", "Williams 1992; Sutton & Barto 2018 §13.4",
             {"kl.placement": "reward", "kl.estimator": "k1", **_ONE_UPDATE}),
        Algo("a2c", "a2c", "Mnih et al. 2016 (A3C/A2C)",
             {"kl.placement": "reward", "kl.estimator": "k1", **_ONE_UPDATE}),
        Algo("grpo", "grpo", "Shao et al. 2024 (DeepSeekMath)",
             {"kl.placement": "loss", "kl.estimator": "k3", "kl.beta": 0.04, "update.epochs": 1, **_GROUPS}),
        Algo("dr_grpo", "dr_grpo", "Liu et al. 2025 (Dr. GRPO)",
             {"kl.placement": "loss", "kl.estimator": "k3", "kl.beta": 0.0, "update.epochs": 1,
              "update.loss_agg": "seq-mean-token-sum", **_GROUPS}),
        Algo("rloo", "rloo", "Ahmadian et al. 2024 (RLOO)",
             {"kl.placement": "reward", "kl.estimator": "k1", **_ONE_UPDATE, **_GROUPS}),
        Algo("remax", "remax", "Li et al. 2023 (ReMax)",
             {"kl.placement": "reward", "kl.estimator": "k1", **_ONE_UPDATE}),
        # REINFORCE++: k1 KL in the reward (β 0.01, OpenRLHF's example), returns whitened over the batch
        Algo("reinforce_pp", "reinforce_pp", "Hu et al. 2025 (REINFORCE++)",
             {"kl.placement": "reward", "kl.estimator": "k1", "kl.beta": 0.01, "estimator.whiten": True, **_ONE_UPDATE}),
        # REINFORCE++ w/ baseline: group mean, batch whitening, k2 KL as a loss (β 1e-3, OpenRLHF's example)
        Algo("reinforce_pp_baseline", "reinforce_pp_baseline", "Hu et al. 2025 (REINFORCE++ w/ baseline)",
             {"kl.placement": "loss", "kl.estimator": "k2", "kl.beta": 1e-3, "estimator.whiten": True,
              **_ONE_UPDATE, **_GROUPS}),
        # GSPO: the clipped sequence ratio, the paper's clip range, per-sequence loss (verl's gspo aggregation)
        Algo("gspo", "grpo", "Zheng et al. 2025 (GSPO)",
             {"update.policy_loss": "gspo", "update.clip_eps": 3e-4, "update.clip_eps_high": 4e-4,
              "update.loss_agg": "seq-mean-token-mean", "kl.beta": 0.0, **_ONE_UPDATE, **_GROUPS}),
        # DAPO: clip-higher, token-level loss over each minibatch, no KL, overlong shaping and filtering
        # (L_cache = 0.2·L_max, the paper's 4096 of 20480), dynamic sampling with at most 3 refill
        # rounds (verl's max_num_gen_batches is 10; a round is most of a step's cost on a CPU)
        Algo("dapo", "grpo", "Yu et al. 2025 (DAPO)",
             {"update.clip_eps": 0.2, "update.clip_eps_high": 0.28, "update.loss_agg": "token-mean",
              "kl.beta": 0.0, "reward.overlong_buffer": 0.2, "reward.overlong_penalty": 1.0,
              "update.mask_truncated": True, "rollout.filter_groups": True, "rollout.max_draws": 3,
              "rollout.filter_on": "score",  # the paper's filter: 0 < #correct < G, whatever the length penalty
              **_ONE_UPDATE, **_GROUPS}),
        # CISPO: the stop-gradient clipped IS weight; no lower bound (ε_low = 1, as the paper), the weight
        # capped at 4 (ε_high = 3: the paper gives no value; ScaleRL's and Tinker's cap), token-mean, no KL
        Algo("cispo", "grpo", "MiniMax 2025 (MiniMax-M1, CISPO)",
             {"update.policy_loss": "cispo", "update.clip_eps": 1.0, "update.clip_eps_high": 3.0,
              "update.loss_agg": "token-mean", "kl.beta": 0.0, **_ONE_UPDATE, **_GROUPS}),
    ]
}


def get_algo(name: str) -> Algo:
    if name not in ALGOS:
        raise ConfigError(f"Unknown algorithm '{name}'; valid algorithms: {', '.join(ALGOS)}.")
    return ALGOS[name]


def preset_for(name: str) -> dict[str, Any]:
    """The dotted-key defaults `--algo name` applies, including its estimator."""
    algo = get_algo(name)
    return {"estimator.name": algo.estimator, **algo.preset}
