"""Which of a step's forwards the update's own forward can stand in for: the on-policy shortcuts
(`update.on_policy_logprobs`, `update.on_policy_values`) resolved from the settings, and why one
cannot hold. The one place the run learns whether to skip the rollout's no-grad actor forward."""

from __future__ import annotations

from .schema import REJECTING_CORRECTIONS, Config


def single_pass_update(config: Config) -> bool:
    """One epoch of one minibatch holding all B·G rows of the step, run as one micro-batch: the
    critic's update forward sees the same critic as the rollout, and its graph can wait for the
    advantages (tied to the values) without holding more than one forward's activations."""
    u = config.update
    rows = config.rollout.prompts_per_step * config.rollout.num_generations
    return u.epochs == 1 and u.minibatch_size >= rows and (u.micro_batch_size is None or u.micro_batch_size >= rows)


def on_policy_values(config: Config) -> bool:
    """`update.on_policy_values` resolved: 'auto'/'on' → `single_pass_update(config)` and a base that
    is not sharded (its forwards are collectives in a fixed order); 'off' → False."""
    return (config.update.on_policy_values != "off" and single_pass_update(config)
            and not config.dist.shard_base)


def exactly_on_policy(config: Config) -> bool:
    """Whether every row's log π_old equals the detached log π of the update's own forward: one
    epoch (update.epochs = 1) of one minibatch holding all B·G rows of the step, so the only
    optimizer step comes after every forward, and no −β·KL_t in the reward (which needs log π_old
    before the update, when the advantages are computed); nor `update.mask_truncated` with β > 0:
    the update's forward skips the truncated rows, whose log π_old the logged KL needs."""
    u, kl = config.update, config.kl
    rows = config.rollout.prompts_per_step * config.rollout.num_generations
    return (u.epochs == 1 and u.minibatch_size >= rows and not (kl.placement == "reward" and kl.beta > 0)
            and not (u.mask_truncated and kl.beta > 0) and not corrects_before_update(config))


def corrects_before_update(config: Config) -> bool:
    """Whether the IS correction between the vLLM engine's μ and π_old needs log π_old from a
    deterministic forward before the update: a rejecting correction (token_mask, seq_mask) drops
    tokens from the counts every micro-batch is normalised by, so it must know them first; and with
    LoRA dropout the update's own forward is dropout-masked, so weights from it would measure the
    dropout noise, not the sampler's mismatch."""
    u = config.update
    return (config.rollout.engine == "vllm" and u.is_correction != "off"
            and (u.is_correction in REJECTING_CORRECTIONS or config.lora.dropout > 0))


def on_policy_update(config: Config) -> bool:
    """`update.on_policy_logprobs` resolved: 'auto' and 'on' → `exactly_on_policy(config)` (load_config
    refuses 'on' for an update that is not), 'off' → False. The one place the engine (rollout plan,
    update) learns whether to skip the rollout's no-grad actor forward."""
    return config.update.on_policy_logprobs != "off" and exactly_on_policy(config)


def not_on_policy(config: Config, rows: int) -> str:
    """Why `update.on_policy_logprobs=on` cannot hold for this config, in one sentence."""
    u = config.update
    if corrects_before_update(config):
        dropout = "" if u.is_correction in REJECTING_CORRECTIONS else f" with lora.dropout={config.lora.dropout:g}"
        return (f"'update.on_policy_logprobs' takes log π_old from the update's own forward, but the vllm engine's "
                f"update.is_correction={u.is_correction}{dropout} needs it from a deterministic forward before the "
                "update; use update.on_policy_logprobs=auto.")
    return ("'update.on_policy_logprobs' needs one exactly on-policy update: update.epochs=1, "
            f"update.minibatch_size={rows} (all rows of a step) and no KL in the reward (kl.placement=loss or kl.beta=0)"
            + (", and kl.beta=0 with update.mask_truncated." if u.mask_truncated else "."))
