"""Policy, value and entropy losses, KL estimators, loss aggregation, and the reward model's
Bradley–Terry loss over preference pairs.

All per-token tensors are (N, T) with a bool `mask` (True = trained token); masked positions never
influence a result, whatever they hold.

Policy losses are registered by name (`update.policy_loss`): ppo, gspo, cispo, and any a user
registers with `@register_policy_loss(name, ...)` in a module named by `update.policy_loss_module`.
Every one takes (log π_θ, log π_old, A, mask, ε_low, ε_high, dual clip c, agg, **totals), all
per-token tensors (N, T), and returns a `PolicyLoss`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from .errors import ConfigError, PluginError, is_builtin, plugin_name, shown
from .ops import masked_mean, masked_sum

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def aggregate(
    loss: Tensor, mask: Tensor, mode: str, total_tokens: float | None = None, total_seqs: float | None = None
) -> Tensor:
    """Reduce a per-token loss (N, T) to a scalar.

    token-mean:          Σ_it ℓ_it / Σ_it m_it                  (every token weighs the same)
    seq-mean-token-mean: mean_i (Σ_t ℓ_it / Σ_t m_it)           (every sequence weighs the same)
    seq-mean-token-sum:  mean_i Σ_t ℓ_it                        (Dr. GRPO: no length normalisation)
    Example ℓ = [[1, 1, ·], [3, ·, ·]]: token-mean 5/3, seq-mean-token-mean 2, seq-mean-token-sum 2.5.

    When a minibatch is split into micro-batches, pass the minibatch's `total_tokens` (Σ m) and
    `total_seqs` (rows) so that the micro-batch losses add up to the minibatch loss exactly.
    """
    if mode == "token-mean":
        denom = mask.sum().clamp(min=1) if total_tokens is None else total_tokens
        return masked_sum(loss, mask) / denom
    per_seq = masked_sum(loss, mask, dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown aggregation '{mode}'; valid: {', '.join(AGGREGATIONS)}")
    return per_seq.sum() / (per_seq.shape[0] if total_seqs is None else total_seqs)


@dataclass(frozen=True)
class PolicyLoss:
    loss: Tensor  # scalar to minimise
    clip_frac: Tensor  # share of kept tokens where the clipped branch was taken
    approx_kl: Tensor  # mean of k3(π_old‖π_θ) over kept tokens, a drift diagnostic


PolicyLossFn = Callable[..., PolicyLoss]


@dataclass(frozen=True)
class PolicyLossSpec:
    name: str
    fn: PolicyLossFn
    formula: str  # one line, shown by `llmrl losses`
    paper: str
    dual_clip: bool  # whether `update.dual_clip` applies to it


POLICY_LOSSES: dict[str, PolicyLossSpec] = {}


def register_policy_loss(name: str, *, formula: str, paper: str = "", dual_clip: bool = False
                         ) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register a policy loss under `name`. A duplicate name is an error."""

    def wrap(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss '{name}' is already registered")
        POLICY_LOSSES[name] = PolicyLossSpec(name, fn, formula, paper, dual_clip)
        return fn

    return wrap


def get_policy_loss(name: str) -> PolicyLossSpec:
    """The spec registered under `name`; unknown names list the valid ones."""
    if name not in POLICY_LOSSES:
        raise ConfigError(f"Unknown policy loss '{name}'; valid policy losses: {', '.join(sorted(POLICY_LOSSES))}.")
    return POLICY_LOSSES[name]


@register_policy_loss("ppo", formula="max(−A·ρ_t, −A·clip(ρ_t, 1−ε_low, 1+ε_high)), ρ_t = π_θ/π_old per token",
                      paper="Schulman et al. 2017; clip-higher: Yu et al. 2025; dual clip: Ye et al. 2020",
                      dual_clip=True)
def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    **totals: float | None,
) -> PolicyLoss:
    """PPO clipped surrogate (Schulman et al. 2017), with clip-higher (DAPO) and dual clip (Ye et al. 2020).

    ρ_t = exp(log π_θ − log π_old);  ℓ_t = max(−A_t ρ_t, −A_t clip(ρ_t, 1 − ε_low, 1 + ε_high));
    with dual clip c and A_t < 0: ℓ_t = min(ℓ_t, −c A_t).
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    per_token, was_clipped = _clipped_surrogate(torch.exp(log_ratio), advantages, clip_low, clip_high)
    if dual_clip is not None:
        per_token = torch.where(advantages < 0, torch.minimum(per_token, -dual_clip * advantages), per_token)
    return _policy_loss(per_token, was_clipped, logprobs, old_logprobs, mask, agg, totals)


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """(ℓ_t = max(−A_t ρ_t, −A_t clip(ρ_t, 1 − ε_low, 1 + ε_high)), where the clipped branch was taken), (N, T) each."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _policy_loss(per_token: Tensor, was_clipped: Tensor, logprobs: Tensor, old_logprobs: Tensor, mask: Tensor,
                 agg: str, totals: dict[str, float | None]) -> PolicyLoss:
    """The aggregated loss with its diagnostics: the share of kept tokens `was_clipped` marks, and the
    mean of k3(π_old‖π_θ) over kept tokens."""
    with torch.no_grad():
        clip_frac = masked_mean(was_clipped.float(), mask)
        approx_kl = masked_mean(kl_penalty(old_logprobs, logprobs, "k3"), mask)
    return PolicyLoss(aggregate(per_token, mask, agg, **totals), clip_frac, approx_kl)


@register_policy_loss("gspo", formula="max(−A·s_i, −A·clip(s_i, 1−ε_low, 1+ε_high)), s_i = exp(mean_t log ρ_t) per sequence",
                      paper="Zheng et al. 2025 (GSPO)")
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 3e-4,
    clip_high: float | None = 4e-4,
    dual_clip: float | None = None,
    agg: str = "seq-mean-token-mean",
    **totals: float | None,
) -> PolicyLoss:
    """Group Sequence Policy Optimization, GSPO-token form (Zheng et al. 2025, eq. 10-11).

    log s_i = (1/|y_i|) Σ_t (log π_θ − log π_old)_it   (the geometric mean of the token ratios);
    s_it = sg(s_i) · π_θ(y_it) / sg(π_θ(y_it))         (value s_i; ∇s_it = s_i ∇log π_θ(y_it));
    ℓ_it = max(−A_it s_it, −A_it clip(s_it, 1 − ε_low, 1 + ε_high)).
    With A_it = A_i and seq-mean-token-mean this is GSPO's sequence objective exactly: the gradient
    mean_i A_i s_i (1/|y_i|) Σ_t ∇log π_θ(y_it) = mean_i A_i ∇s_i (as verl `compute_policy_loss_gspo`).
    `dual_clip` does not apply (refused by `resolve_policy_loss`).
    """
    clip_high = clip_low if clip_high is None else clip_high
    zeros = torch.zeros_like(logprobs)
    logprobs = torch.where(mask, logprobs, zeros)  # junk at masked positions must not reach the gradient
    log_ratio = torch.where(mask, logprobs - old_logprobs, zeros)
    seq_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)  # (N,)
    ratio = torch.exp(logprobs - logprobs.detach() + seq_log_ratio.detach()[:, None])  # s_it, (N, T)
    per_token, was_clipped = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    return _policy_loss(per_token, was_clipped, logprobs, old_logprobs, mask, agg, totals)


@register_policy_loss("cispo", formula="−sg(clip(ρ_t, 1−ε_low, 1+ε_high))·A·log π_θ(a_t), ρ_t = π_θ/π_old per token",
                      paper="MiniMax 2025 (MiniMax-M1, CISPO)")
def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 1.0,
    clip_high: float | None = 3.0,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    **totals: float | None,
) -> PolicyLoss:
    """Clipped IS-weight Policy Optimization (MiniMax-M1, eq. 4-5).

    ρ_t = exp(log π_θ − log π_old);  ℓ_t = −sg(clip(ρ_t, 1 − ε_low, 1 + ε_high)) · A_t · log π_θ(a_t).
    The clipped weight is a constant, so every token keeps its REINFORCE gradient −w_t A_t ∇log π_θ
    (PPO zeroes the clipped ones). ε_low = 1 puts no lower bound on ρ (the paper's choice). The loss
    value is not the surrogate's (it carries log π_θ); its gradient is. `clip_frac`: share of kept
    tokens whose weight was clipped. `dual_clip` does not apply (refused by `resolve_policy_loss`).
    """
    clip_high = clip_low if clip_high is None else clip_high
    zeros = torch.zeros_like(logprobs)
    logprobs = torch.where(mask, logprobs, zeros)  # junk at masked positions must not reach the gradient
    ratio = torch.exp(torch.where(mask, logprobs - old_logprobs, zeros)).detach()
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = -weight * advantages * logprobs
    return _policy_loss(per_token, weight != ratio, logprobs, old_logprobs, mask, agg, totals)


def resolve_policy_loss(name: str, module: str | None, dual_clip: float | None) -> PolicyLossSpec:
    """Import `module` (it may register losses), look `name` up and check the settings it uses."""
    if module:
        from .estimators.registry import import_user_module  # late: estimators import nothing from here

        import_user_module(module, "policy-loss")
    spec = get_policy_loss(name)
    if dual_clip is not None and not spec.dual_clip:
        raise ConfigError(f"update.dual_clip does not apply to the '{name}' policy loss; unset it (null).")
    return spec


def check_policy_loss(spec: PolicyLossSpec, out: object, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                      mask: Tensor) -> PolicyLoss:
    """What a registered policy loss returned, checked where it arrives: a PolicyLoss whose loss is a
    floating 0-d tensor (with the log-probs' graph when they have one) and whose clip_frac and approx_kl
    are one-element tensors; for a plug-in, a finite loss wherever its inputs are finite on the mask.
    Anything else is a PluginError naming the loss and what it returned."""
    who = f"Policy loss '{spec.name}' ({plugin_name(spec.fn)})"
    if not isinstance(out, PolicyLoss):
        raise PluginError(f"{who} returned {shown(out)}, not a PolicyLoss(loss, clip_frac, approx_kl).")
    loss = out.loss
    if not (isinstance(loss, Tensor) and loss.is_floating_point() and loss.ndim == 0):
        what = f"a {loss.dtype} tensor of shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else shown(loss)
        raise PluginError(f"{who} returned a loss that is {what}, not a scalar (a floating 0-d tensor).")
    if torch.is_grad_enabled() and logprobs.requires_grad and not loss.requires_grad:
        raise PluginError(f"{who} returned a loss without a gradient (detached, or not computed from the log-probs "
                          "it was given); the update backpropagates through it.")
    for name in ("clip_frac", "approx_kl"):
        value = getattr(out, name)
        if not (isinstance(value, Tensor) and value.numel() == 1):
            raise PluginError(f"{who} returned {name} that is {shown(value)}, not a one-element tensor.")
    if not is_builtin(spec.fn) and not bool(torch.isfinite(loss)):
        inputs = (logprobs, old_logprobs, advantages)
        if all(bool(torch.isfinite(torch.where(mask, t, torch.zeros_like(t))).all()) for t in inputs):
            raise PluginError(f"{who} returned the loss {loss.detach().item()} from finite log-probs and advantages; the loss "
                              "must be finite.")
    return out


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    **totals: float | None,
) -> Tensor:
    """½ max((V − R)², (V_clip − R)²) with V_clip = V_old + clip(V − V_old, −c, c); no clip when c is None."""
    zeros = torch.zeros_like(values)
    values = torch.where(mask, values, zeros)  # junk at masked positions must not reach the gradient
    returns = torch.where(mask, returns, zeros)
    old_values = torch.where(mask, old_values, zeros)
    err = (values - returns) ** 2
    if clip is not None:
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err = torch.maximum(err, (v_clipped - returns) ** 2)
    return 0.5 * aggregate(err, mask, agg, **totals)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H_t = −Σ_v p_v log p_v, (…, V) → (…)."""
    return entropy_from_logprobs(torch.log_softmax(logits.float(), dim=-1))


def entropy_from_logprobs(logp: Tensor) -> Tensor:
    """H_t = −Σ_v exp(log p_v) log p_v from log-probabilities already computed, (…, V) → (…)."""
    return -(logp.exp() * logp).sum(-1)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(π_θ‖π_ref) from samples of π_θ (Schulman, "Approximating KL").

    k1 = log π − log π_ref;  k2 = ½ (log π − log π_ref)²;  k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1.
    k1 is unbiased but can be negative; k3 is unbiased and ≥ 0; k2 is biased, ≥ 0, low variance.
    """
    diff = logprobs - ref_logprobs
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff**2
    if estimator == "k3":
        return torch.expm1(-diff) + diff
    raise ValueError(f"unknown KL estimator '{estimator}'; valid: k1, k2, k3")


def bradley_terry(r_chosen: Tensor, r_rejected: Tensor, margin: Tensor | None = None, center: float = 0.0) -> Tensor:
    """The reward model's loss over P preference pairs (Bradley & Terry 1952; Ouyang et al. 2022, eq. 1):

        L = mean_i −log σ(r_w,i − r_l,i − m_i)  +  c · mean_i (r_w,i + r_l,i)²

    r_chosen r_w, r_rejected r_l, margin m: (P,); m = 0 when None. The margin (Touvron et al. 2023, Llama 2)
    asks r_w to lead by m; the second term, c = `center`, is the reward centering of Eisenstein et al. 2023.
    Exactly TRL's RewardTrainer.compute_loss with its `margin` column and `center_rewards_coefficient`.
    log σ is F.logsigmoid, finite for any difference. Returns a 0-dim tensor."""
    diff = r_chosen - r_rejected
    if margin is not None:
        diff = diff - margin
    loss = -torch.nn.functional.logsigmoid(diff).mean()
    if center:
        loss = loss + center * ((r_chosen + r_rejected) ** 2).mean()
    return loss


def pair_stats(r_chosen: Tensor, r_rejected: Tensor) -> dict[str, float]:
    """{accuracy: share of the P pairs with r_w > r_l, a tie counting half; margin: mean(r_w − r_l)}, (P,)
    each (NaN for P = 0). TRL's RewardTrainer counts a tie as wrong (its `accuracy` is the share with
    r_w > r_l); half is what a coin flip between the two would score."""
    diff = (r_chosen - r_rejected).detach().float()
    accuracy = ((diff > 0).float() + 0.5 * (diff == 0).float()).mean()
    return {"accuracy": float(accuracy), "margin": float(diff.mean())}
