"""update: PPO epochs × minibatches, an actor pass and a critic pass per minibatch.

Each pass runs under its own adapter (`stack.use(role)`), splits its minibatch into micro-batches
(gradient accumulation with exact normalisation), clips the gradient norm and steps its own AdamW.
A pass whose loss or gradient is not finite is skipped and counted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import Tensor

from ..batch import RolloutBatch
from ..config.schema import KLConfig, UpdateConfig
from ..losses import aggregate, entropy_from_logits, kl_penalty, policy_loss, value_loss
from ..models.stack import PolicyStack, layout, token_logprobs
from .grad_stats import GradMoments


@dataclass
class Targets:
    """What the update fits: advantages (N, T) for the actor, returns (N, T) | None for the critic."""

    advantages: Tensor
    returns: Tensor | None


def make_optimizers(stack: PolicyStack, cfg: UpdateConfig) -> dict[str, torch.optim.Optimizer]:
    """One AdamW per trainable role, over that role's adapter (and value head) parameters only."""
    opts = {"actor": torch.optim.AdamW(stack.parameters_of("actor"), lr=cfg.lr_actor, weight_decay=cfg.weight_decay)}
    if stack.has_critic:
        opts["critic"] = torch.optim.AdamW(stack.parameters_of("critic"), lr=cfg.lr_critic, weight_decay=cfg.weight_decay)
    return opts


def _micro_batches(rows: Tensor, size: int | None) -> list[Tensor]:
    return list(rows.split(size)) if size else [rows]


def _actor_loss(stack: PolicyStack, mb: RolloutBatch, adv: Tensor, cfg: UpdateConfig, kl: KLConfig,
                beta: float, temperature: float, totals: dict[str, float]) -> tuple[Tensor, dict[str, float]]:
    seq = layout(mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask)
    logits = stack.response_logits(seq, temperature)
    lp = token_logprobs(logits, mb.response_ids)
    mask = mb.response_mask
    if cfg.on_policy_logprobs:  # exactly on-policy: π_old = the current policy, detached
        mb.old_logprobs = torch.where(mask, lp.detach(), torch.zeros_like(lp))
    pl = policy_loss(lp, mb.old_logprobs, adv, mask, cfg.clip_eps, cfg.clip_eps_high, cfg.dual_clip, cfg.loss_agg, **totals)
    loss = pl.loss
    entropy = entropy_from_logits(logits) if cfg.ent_coef > 0 else entropy_from_logits(logits.detach())
    ent = aggregate(entropy, mask, cfg.loss_agg, **totals)
    loss = loss - cfg.ent_coef * ent
    if kl.placement == "loss" and beta > 0 and mb.ref_logprobs is not None:
        loss = loss + beta * aggregate(kl_penalty(lp, mb.ref_logprobs, kl.estimator), mask, cfg.loss_agg, **totals)
    stats = {"policy_loss": pl.loss.item(), "entropy": ent.item(), "clip_frac": pl.clip_frac.item(),
             "approx_kl": pl.approx_kl.item()}
    return loss, stats


def _critic_loss(stack: PolicyStack, mb: RolloutBatch, returns: Tensor, cfg: UpdateConfig,
                 totals: dict[str, float]) -> tuple[Tensor, dict[str, float]]:
    assert mb.values is not None
    seq = layout(mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask)
    v = stack.values(seq)
    vl = value_loss(v, mb.values, returns, mb.response_mask, cfg.value_clip, cfg.loss_agg, **totals)
    return cfg.vf_coef * vl, {"value_loss": vl.item()}


def _pass(role: str, stack: PolicyStack, opt: torch.optim.Optimizer, batch: RolloutBatch, rows: Tensor,
          target: Tensor, cfg: UpdateConfig, loss_fn, moments: GradMoments | None = None) -> dict[str, float]:
    """Accumulate gradients over micro-batches of `rows`, then one clipped optimizer step.

    `moments`, when given, records the finite pre-clip gradient (see grad_stats.py)."""
    opt.zero_grad(set_to_none=True)
    totals = {"total_tokens": float(batch.response_mask[rows].sum().clamp(min=1)), "total_seqs": float(len(rows))}
    stats: dict[str, float] = defaultdict(float)
    finite = True
    with stack.use(role):
        for micro in _micro_batches(rows, cfg.micro_batch_size):
            mb = batch.select(micro)
            loss, s = loss_fn(mb, target[micro], totals)
            if role == "actor" and cfg.on_policy_logprobs:
                batch.old_logprobs[micro] = mb.old_logprobs.to(batch.old_logprobs.dtype)
            finite &= bool(torch.isfinite(loss))
            if finite:
                loss.backward()
            for k, v in s.items():
                stats[k] += v * len(micro) / len(rows)
        params = [p for p in stack.parameters_of(role) if p.grad is not None]
        if moments is not None and finite and params:
            moments.add(params)
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.tensor(0.0)
        finite &= bool(torch.isfinite(norm))
        if finite:
            opt.step()
        opt.zero_grad(set_to_none=True)
    stats[f"{role}_grad_norm"] = float(norm)
    stats[f"{role}_skipped"] = 0.0 if finite else 1.0
    return stats


def update(stack: PolicyStack, opts: dict[str, torch.optim.Optimizer], batch: RolloutBatch, targets: Targets,
           cfg: UpdateConfig, kl: KLConfig, beta: float, temperature: float, generator: torch.Generator) -> dict[str, float]:
    """Fit the actor (and critic) to one rollout batch; returns minibatch-averaged statistics
    plus the actor's gradient noise across minibatches (grad_stats.py)."""
    history: dict[str, list[float]] = defaultdict(list)
    moments = GradMoments()
    actor_fn = lambda mb, adv, totals: _actor_loss(stack, mb, adv, cfg, kl, beta, temperature, totals)  # noqa: E731
    critic_fn = lambda mb, ret, totals: _critic_loss(stack, mb, ret, cfg, totals)  # noqa: E731
    for _ in range(cfg.epochs):
        order = torch.randperm(batch.rows, generator=generator).to(batch.response_ids.device)
        for rows in order.split(cfg.minibatch_size):
            for k, v in _pass("actor", stack, opts["actor"], batch, rows, targets.advantages, cfg, actor_fn, moments).items():
                history[k].append(v)
            if "critic" in opts and targets.returns is not None:
                for k, v in _pass("critic", stack, opts["critic"], batch, rows, targets.returns, cfg, critic_fn).items():
                    history[k].append(v)
    stats = {k: sum(v) / len(v) for k, v in history.items() if not k.endswith("_skipped")}
    stats["skipped_updates"] = sum(sum(v) for k, v in history.items() if k.endswith("_skipped"))
    return {**stats, **moments.stats("actor")}
