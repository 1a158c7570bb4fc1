"""update: `TrainRows` + `Targets` → `UpdateResult`: PPO epochs × minibatches, an actor pass and a
critic pass per minibatch.

Each pass runs under its own adapter (`stack.use(role)`), splits its minibatch into micro-batches
(gradient accumulation with exact normalisation), clips the gradient norm and steps its own AdamW.
A pass whose loss or gradient is not finite is skipped and counted.

LoRA dropout (`lora.dropout`) is active in the update's gradient forwards only (`stack.dropout_active()`
around each pass, and around the kept-graph critic forward of `forward.forward`); the rollout's forwards ran without it. So with
dropout > 0 and separate rollout forwards, the first minibatch's ratio π_θ/π_old is that of a
dropout-masked forward to the deterministic policy that sampled (not exactly 1), and its values are
a masked forward's. The on-policy shortcuts take π_old and V_old from the masked update forward
itself: the ratio stays exactly 1 and the value clip sees V = V_old, while log π_old (and the logged
KL) and the advantages' baseline carry that forward's dropout mask.

Data-parallel runs (see ../distributed.py): the minibatches are cut from one permutation of the
global N rows, drawn from the same generator on every rank; each rank runs the rows of a minibatch
that it holds, normalised by the minibatch's global token and row counts, so its loss is its share
of the single-process minibatch loss; the gradients are summed over ranks before clipping. With
world size 1 all of this is the single-process update.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from ..config.schema import KLConfig, UpdateConfig
from ..corrections import get_correction
from ..losses import aggregate, check_policy_loss, get_policy_loss, kl_penalty, value_loss
from ..models.stack import PolicyStack, at_least_float32
from ..ops import masked_sum
from ..parallel.distributed import SINGLE, DistContext
from .forward import sequences
from .grad_stats import GradMoments
from .records import Targets, TrainRows, UpdateResult


def make_optimizers(stack: PolicyStack, cfg: UpdateConfig) -> dict[str, torch.optim.Optimizer]:
    """One AdamW per trainable role, over that role's adapter (and value head) parameters only."""
    opts = {"actor": torch.optim.AdamW(stack.parameters_of("actor"), lr=cfg.lr_actor, weight_decay=cfg.weight_decay)}
    if stack.has_critic:
        opts["critic"] = torch.optim.AdamW(stack.parameters_of("critic"), lr=cfg.lr_critic, weight_decay=cfg.weight_decay)
    return opts


# the statistics each loss returns; a data-parallel update sums exactly these over ranks (a rank
# holding no row of a minibatch has none to report), so a new statistic is added here too
ACTOR_STATS = ("policy_loss", "entropy", "clip_frac", "approx_kl")
CRITIC_STATS = ("value_loss",)


def _micro_batches(rows: Tensor, size: int | None) -> list[Tensor]:
    """`rows` in chunks of `size` (all at once when None); none when `rows` is empty (a rank that
    holds no row of a minibatch)."""
    return [m for m in (rows.split(size) if size else [rows]) if len(m)]


def _most_micro_batches(rows: Tensor, n_local: int, world: int, size: int | None) -> int:
    """The most micro-batches any rank runs for the global minibatch `rows` (rank q holds rows
    [q·n_local, (q+1)·n_local)); every rank knows the permutation, so no communication is needed."""
    counts = [int(((rows >= q * n_local) & (rows < (q + 1) * n_local)).sum()) for q in range(world)]
    return max(-(-c // size) if size else int(c > 0) for c in counts)


def _totals(row_tokens: Tensor, rows: Tensor) -> dict[str, float]:
    """The minibatch `rows`' (global indices) trained tokens and trained rows, from the (N_global,)
    tokens per row: a row left with no token (update.mask_truncated, a rejecting IS correction) is
    out of both counts, so the losses are those of the minibatch without it."""
    tokens = row_tokens[rows]
    return {"total_tokens": float(tokens.sum().clamp(min=1)), "total_seqs": float((tokens > 0).sum().clamp(min=1))}


def _token_share(mask: Tensor, totals: dict[str, float]) -> float:
    """This micro-batch's share of the minibatch's tokens (1.0 for a whole single-process minibatch)."""
    return float(mask.sum()) / totals["total_tokens"]


def _corrected(batch: TrainRows, advantages: Tensor, cfg: UpdateConfig, on_policy: bool) -> tuple[Tensor, Tensor | None]:
    """(the actor's advantages w_t·A_t, the tokens the actor trains on or None for every response token)
    under `update.is_correction`, for the whole (local) batch at once: π_old and μ are fixed for the
    step, and every correction is per token or per row, so this is what each micro-batch would compute.
    Unchanged without a behaviour policy μ, with the correction off, or on-policy (π_old comes from the
    update's own forward: `_actor_loss` weights each micro-batch then)."""
    if batch.behaviour_logprobs is None or cfg.is_correction == "off" or on_policy:
        return advantages, None
    assert batch.old_logprobs is not None
    c = get_correction(cfg.is_correction)(batch.old_logprobs, batch.behaviour_logprobs, batch.response_mask,
                                          cfg.is_clip, tuple(cfg.is_band))
    return advantages * c.weights.to(advantages.dtype), c.kept


def _actor_loss(stack: PolicyStack, mb: TrainRows, adv: Tensor, cfg: UpdateConfig, kl: KLConfig,
                beta: float, temperature: float, totals: dict[str, float],
                on_policy: bool = False, kept: Tensor | None = None) -> tuple[Tensor, dict[str, float], Tensor]:
    """The micro-batch's actor loss, its stats, and the log π_old it used (N_mb, T). `kept` (N_mb, T):
    the tokens a rejecting IS correction left in the batch (`_corrected`); the others are out of every
    term (policy loss, GSPO's sequence ratio, entropy, KL in the loss), as the totals already are.

    With a behaviour policy μ ≠ π_old (`mb.behaviour_logprobs`) and `update.is_correction` not off,
    each token's advantage becomes w_t·A_t, w the correction's weights from (log π_old, log μ)
    (llmrl/corrections.py; detached, ≥ 0; applied by `_corrected` before the passes, or here for an
    on-policy update). That is exactly w_t times the token's policy-gradient term,
    because every built-in loss is positively homogeneous of degree 1 in A_t per token:
      ppo   max(−wAρ, −wA clip(ρ)) = w·max(−Aρ, −A clip(ρ)) for w ≥ 0; dual clip
            min(w·ℓ, −c·wA) = w·min(ℓ, −cA), and wA < 0 ⇔ A < 0 wherever w > 0 (w = 0 gives 0 either way);
      gspo  the same clipped max with the sequence ratio s_it, which does not depend on A;
      cispo −sg(clip(ρ))·(wA)·log π_θ = w·(−sg(clip(ρ))·A·log π_θ), linear in A.
    (A loss registered with @register_policy_loss gets w·A too, which scales its terms only if it has
    the same property.) The aggregation is linear in the per-token losses, so the loss is Σ_t w_t ℓ_t / (the same totals).
    Only `clip_frac` can move: a token with w = 0 counts as unclipped. The entropy bonus and β·KL in
    the loss are not reweighted: they regularise the current policy, not an estimate over μ's samples.
    """
    # (N, T) each; the logits only chunk by chunk (models/logprobs.py); the entropy's graph only when trained
    lp, entropy = stack.response_stats(sequences(mb), mb.response_ids, mb.response_mask, temperature,
                                       entropy="trained" if cfg.ent_coef > 0 else "logged")
    mask = mb.response_mask if kept is None else mb.response_mask & kept
    # exactly on-policy: π_old = the current policy, detached
    old = torch.where(mb.response_mask, lp.detach(), torch.zeros_like(lp)) if on_policy else mb.old_logprobs
    if on_policy and mb.behaviour_logprobs is not None and cfg.is_correction != "off":
        w = get_correction(cfg.is_correction)(old, mb.behaviour_logprobs, mask, cfg.is_clip, tuple(cfg.is_band))
        if w.kept is not None:  # config.on_policy.exactly_on_policy turns the shortcut off for these
            raise ValueError(f"update.is_correction={cfg.is_correction} drops tokens, which needs log π_old before the update")
        adv = adv * w.weights.to(adv.dtype)
    spec = get_policy_loss(cfg.policy_loss)
    pl = check_policy_loss(spec, spec.fn(lp, old, adv, mask, cfg.clip_eps, cfg.clip_eps_high, cfg.dual_clip,
                                         cfg.loss_agg, **totals), lp, old, adv, mask)
    loss = pl.loss
    ent = aggregate(entropy, mask, cfg.loss_agg, **totals)
    loss = loss - cfg.ent_coef * ent
    if kl.placement == "loss" and beta > 0 and mb.ref_logprobs is not None:
        loss = loss + beta * aggregate(kl_penalty(lp, mb.ref_logprobs, kl.estimator), mask, cfg.loss_agg, **totals)
    # every stat is this micro-batch's share of the minibatch value, so shares add up (over
    # micro-batches and ranks): losses are already normalised by the totals, token means are weighted
    share = _token_share(mask, totals)
    # the logged entropy is the per-token mean whatever loss_agg trains on (this micro-batch's share)
    logged = masked_sum(entropy.detach(), mask) / totals["total_tokens"]
    stats = {"policy_loss": pl.loss.item(), "entropy": logged.item(), "clip_frac": pl.clip_frac.item() * share,
             "approx_kl": pl.approx_kl.item() * share}
    return loss, stats, old


def _critic_loss(stack: PolicyStack, mb: TrainRows, returns: Tensor, cfg: UpdateConfig,
                 totals: dict[str, float], v: Tensor | None = None) -> tuple[Tensor, dict[str, float], None]:
    """vf_coef · value loss of the micro-batch; `v`: its values already computed (with graph)."""
    assert mb.values is not None
    if v is None:
        v = stack.values(sequences(mb), mb.base_hidden)
    vl = value_loss(v, mb.values, returns, mb.response_mask, cfg.value_clip, cfg.loss_agg, **totals)
    return cfg.vf_coef * vl, {"value_loss": vl.item()}, None


def _pass(role: str, stack: PolicyStack, opt: torch.optim.Optimizer, batch: TrainRows, rows: Tensor,
          totals: dict[str, float], target: Tensor, cfg: UpdateConfig, loss_fn, keys: tuple[str, ...],
          moments: GradMoments | None = None, dist: DistContext = SINGLE, lockstep: int = 0,
          fill_old: Tensor | None = None, scale: float = 1.0) -> dict[str, float]:
    """Accumulate gradients over micro-batches of `rows` (this rank's rows of the minibatch, whose
    global token and row counts are `totals`), sum them over ranks, then one clipped optimizer step.

    `moments`, when given, records the finite pre-clip gradient (see grad_stats.py). `lockstep`
    (sharded base only): run zero-weight micro-batches until this many forwards/backwards ran.
    `fill_old` (N, T): copy each micro-batch's old log-probs (an on-policy loss computes them) into it.
    `scale`: the loss is multiplied by it before the backward (rollout.filter_scale); the logged
    statistics are the unscaled ones."""
    opt.zero_grad(set_to_none=True)
    stats: dict[str, float] = defaultdict(float)
    finite = True
    with stack.use(role), stack.dropout_active():  # the update's forwards alone use LoRA dropout
        micros = _micro_batches(rows, cfg.micro_batch_size)
        for _ in range(lockstep - len(micros)):  # keep the sharded forwards of all ranks in step
            one = torch.zeros(1, dtype=torch.long, device=rows.device)
            (0.0 * loss_fn(batch.select(one), target[one], totals, one)[0]).backward()
        for micro in micros:
            mb = batch.select(micro)
            loss, s, old = loss_fn(mb, target[micro], totals, micro)
            if fill_old is not None:
                fill_old[micro] = old.to(fill_old.dtype)
            finite &= bool(torch.isfinite(loss))
            if finite or dist.lockstep:  # a sharded backward is a collective: run it (its grads are dropped)
                (loss * scale if scale != 1.0 else loss).backward()
            for k, v in s.items():
                stats[k] += v
        if dist.active:
            finite = dist.sum_gradients(stack.parameters_of(role), finite)
            stats = dict(zip(keys, dist.sum_floats([stats.get(k, 0.0) for k in keys])))
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


def no_update() -> UpdateResult:
    """The record of a step with nothing to train on (dynamic sampling kept no group): no forward,
    no backward, no optimizer step, so AdamW's moments stay as they were; `skipped_updates` counts
    only passes dropped for a non-finite loss, so it is 0."""
    return UpdateResult({"skipped_updates": 0.0})


def update(stack: PolicyStack, opts: dict[str, torch.optim.Optimizer], batch: TrainRows, targets: Targets,
           cfg: UpdateConfig, kl: KLConfig, beta: float, temperature: float, generator: torch.Generator,
           dist: DistContext = SINGLE, on_policy: bool = False, critic_values: Tensor | None = None,
           actor_scale: float = 1.0) -> UpdateResult:
    """Fit the actor (and critic) to one step's rows; returns minibatch-averaged statistics plus the
    actor's gradient noise across minibatches (grad_stats.py).

    In a data-parallel run `batch` is this rank's rows [r·n, (r+1)·n) of the global batch of
    n·W rows, and every rank must call this with the same generator state. `on_policy` (see
    `config.on_policy.on_policy_update`; then `batch.old_logprobs` is None): the actor's own forward
    provides log π_old, detached, returned in `UpdateResult.old_logprobs` (for the logged KL);
    with LoRA dropout that forward's mask is in it, and the ratio is still exactly 1.
    `critic_values` (N, T) with graph (`Forwards.value_graph`, one pass of all rows only): the critic
    pass runs first and backpropagates through these values instead of a new forward.
    `actor_scale` multiplies the actor's loss (rollout.filter_scale: the kept share of the batch)."""
    history: dict[str, list[float]] = defaultdict(list)
    moments = GradMoments()
    advantages, kept = _corrected(batch, targets.advantages, cfg, on_policy)
    actor_fn = lambda mb, adv, totals, rows: _actor_loss(  # noqa: E731
        stack, mb, adv, cfg, kl, beta, temperature, totals, on_policy, None if kept is None else kept[rows])
    critic_fn = lambda mb, ret, totals, rows: _critic_loss(  # noqa: E731
        stack, mb, ret, cfg, totals, None if critic_values is None else critic_values[rows])
    row_tokens = dist.gather_rows(batch.response_mask.sum(-1))  # (N_global,) tokens per row
    actor_tokens = row_tokens if kept is None else dist.gather_rows((batch.response_mask & kept).sum(-1))
    micros = lambda rows: _most_micro_batches(rows, batch.n, dist.world_size, cfg.micro_batch_size) if dist.lockstep else 0  # noqa: E731
    computed = (torch.zeros(batch.response_ids.shape, dtype=at_least_float32(stack.lm.dtype),
                            device=batch.response_ids.device) if on_policy else None)
    for _ in range(cfg.epochs):
        order = torch.randperm(batch.n * dist.world_size, generator=generator).to(batch.response_ids.device)
        for rows in order.split(cfg.minibatch_size):
            mine = dist.local_rows(rows, batch.n)
            most = micros(rows)
            actor = lambda: _pass("actor", stack, opts["actor"], batch, mine, _totals(actor_tokens, rows),  # noqa: E731
                                  advantages, cfg, actor_fn, ACTOR_STATS, moments, dist, most, fill_old=computed,
                                  scale=actor_scale)
            critic = lambda: _pass("critic", stack, opts["critic"], batch, mine, _totals(row_tokens, rows),  # noqa: E731
                                   targets.returns, cfg, critic_fn, CRITIC_STATS, None, dist, most)
            with_critic = "critic" in opts and targets.returns is not None
            # independent parameters: the order changes nothing but when the held critic graph is freed
            passes = [critic, actor] if critic_values is not None else [actor] + ([critic] if with_critic else [])
            for run in passes:
                for k, v in run().items():
                    history[k].append(v)
    stats = {k: sum(v) / len(v) for k, v in history.items() if not k.endswith("_skipped")}
    stats["skipped_updates"] = sum(sum(v) for k, v in history.items() if k.endswith("_skipped"))
    return UpdateResult({**stats, **moments.stats("actor")}, computed)
