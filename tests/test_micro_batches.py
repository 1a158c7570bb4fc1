"""Property: the whole update (epochs × minibatches × actor and critic passes, AdamW, clipping)
gives the same adapters whether each minibatch runs as one forward/backward or as micro-batches.

Gradient accumulation normalises every micro-batch by its minibatch's totals (tokens, sequences),
so only float summation order may differ. In float32 the accumulated gradients agree to 1e-6; the
weights after several AdamW steps do not quite: AdamW's first steps are ≈ lr·g/(|g| + 1e-8), so on a
coordinate whose gradient is a near-cancelling sum, a 1e-7 relative rounding difference moves the
weight by up to ~4e-5 (measured, lr 1e-2). The whole-update property is therefore checked in float64,
where rounding is 1e-16 and any real difference (a micro-batch normalised by its own totals, a
dropped micro-batch) would show at 1e-3: the weights must agree to 1e-9."""

from __future__ import annotations

import functools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrl import load_config
from llmrl.run.checkpoint import trainable_state
from llmrl.step.estimate import estimate, shape_rewards
from llmrl.step.records import StepPlan
from llmrl.run.session import resolve_estimator
from llmrl.step.forward import sequences
from llmrl.step.update import make_optimizers, update
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.tasks import get_task
from tests.helpers import digit_share as _digit_share
from tests.conftest import make_tiny_model
from tests.steps import rollout

SETUPS = {
    # ppo: critic + GAE, KL (k1) in the reward; grpo: groups of 4, KL (k3) in the loss, no critic
    "ppo": {"rollout.prompts_per_step": 8, "rollout.num_generations": 1},
    "grpo": {"rollout.prompts_per_step": 2, "rollout.num_generations": 4},
}




@functools.lru_cache(maxsize=None)
def _fixture(algo: str, dtype: torch.dtype = torch.float64):
    """(stack, initial trainable weights, batch, targets, config): one real rollout on a random model."""
    config = load_config(overrides={"algo": algo, "update.lr_actor": 1e-2, "update.lr_critic": 1e-2,
                                    "update.minibatch_size": 8, **SETUPS[algo]})
    spec = resolve_estimator(config)
    torch.manual_seed(0)
    # prompt sharing off: it changes float32 rounding in the norms (tests/test_prefix.py), not the math
    stack = PolicyStack(make_tiny_model().to(dtype), config.lora, with_critic=spec.needs.critic, share_prompts=False)
    assert {p.dtype for r in stack.trainable_roles() for p in stack.parameters_of(r)} == {dtype}
    rows = get_task("arithmetic").train[: config.rollout.prompts_per_step]
    plan = StepPlan(reference=config.kl.beta > 0, critic=spec.needs.critic, greedy=spec.needs.greedy)
    r = rollout(stack, build_char_tokenizer(), rows, torch.arange(len(rows)), cfg=config.rollout, plan=plan,
                reward_fn=_digit_share, seed=0, step=0)
    targets = estimate(spec, *r, shape_rewards(*r, config.kl.beta, config.kl), config.estimator)
    return stack, trainable_state(stack), r.rows, targets, config


class RecordingAdamW(torch.optim.AdamW):
    """AdamW that keeps a copy of the (accumulated, clipped) gradients it steps with."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[list[torch.Tensor]] = []

    def step(self, closure=None):  # type: ignore[override]
        self.seen.append([p.grad.clone() for g in self.param_groups for p in g["params"] if p.grad is not None])
        return super().step(closure)


def _train(algo: str, micro: int | None, minibatch: int, epochs: int, agg: str,
           dtype: torch.dtype = torch.float64, actor_scale: float = 1.0,
           max_grad_norm: float | None = 1.0) -> tuple[dict[str, torch.Tensor], dict[str, RecordingAdamW]]:
    """Reset the stack to its initial weights, run `update` once: (trainable weights, optimizers)."""
    stack, initial, batch, targets, config = _fixture(algo, dtype)
    named = dict(stack.named_parameters())
    with torch.no_grad():
        for name, value in initial.items():
            named[name].copy_(value)
    cfg = config.update.__class__(**{**config.update.__dict__, "micro_batch_size": micro,
                                     "minibatch_size": minibatch, "epochs": epochs, "loss_agg": agg,
                                     "max_grad_norm": max_grad_norm})
    opts = {role: RecordingAdamW(stack.parameters_of(role), lr=opt.defaults["lr"], weight_decay=cfg.weight_decay)
            for role, opt in make_optimizers(stack, cfg).items()}
    update(stack, opts, batch, targets, cfg, config.kl, config.kl.beta,
           config.rollout.temperature, torch.Generator().manual_seed(7), actor_scale=actor_scale)
    return trainable_state(stack), opts


@settings(max_examples=12, deadline=None)
@given(
    algo=st.sampled_from(sorted(SETUPS)),
    minibatch=st.sampled_from([4, 8]),
    micro=st.integers(1, 8),
    epochs=st.integers(1, 2),
    agg=st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]),
)
def test_micro_batch_split_does_not_change_the_update(algo: str, minibatch: int, micro: int, epochs: int, agg: str) -> None:
    whole, _ = _train(algo, None, minibatch, epochs, agg)
    split, _ = _train(algo, min(micro, minibatch), minibatch, epochs, agg)
    initial = _fixture(algo)[1]
    moved = max(float((whole[k] - initial[k]).abs().max()) for k in whole)
    assert moved > 1e-3, "the update did not move the weights: the comparison could not fail"
    assert whole.keys() == split.keys()
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=1e-9, rtol=0)


@settings(max_examples=8, deadline=None)
@given(algo=st.sampled_from(sorted(SETUPS)), micro=st.integers(1, 7),
       agg=st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]))
def test_float32_accumulated_gradients_match(algo: str, micro: int, agg: str) -> None:
    """The first optimizer step of each role (same starting weights) sees the same gradient in float32."""
    _, whole = _train(algo, None, 8, 1, agg, torch.float32)
    _, split = _train(algo, micro, 8, 1, agg, torch.float32)
    for role in whole:
        first_whole, first_split = whole[role].seen[0], split[role].seen[0]
        assert len(first_whole) == len(first_split) > 0
        assert max(float(g.abs().max()) for g in first_whole) > 1e-3
        for a, b in zip(first_split, first_whole):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_both_roles_are_covered() -> None:
    """ppo trains the critic adapter and value head too; grpo only the actor."""
    assert any(".critic." in k for k in _fixture("ppo")[1]) and any(k.startswith("value_head") for k in _fixture("ppo")[1])
    assert _train("ppo", 3, 8, 1, "token-mean")[1].keys() == {"actor", "critic"}
    assert not any(".critic." in k for k in _fixture("grpo")[1])


def test_actor_scale_scales_the_actor_gradient_only() -> None:
    """rollout.filter_scale: a kept share of 1/4 makes every actor gradient a quarter (float64, no
    clipping: d(s·L)/dθ = s·dL/dθ exactly up to rounding); the critic's gradient is untouched."""
    _, plain = _train("ppo", None, 8, 1, "token-mean", actor_scale=1.0, max_grad_norm=None)
    _, scaled = _train("ppo", None, 8, 1, "token-mean", actor_scale=0.25, max_grad_norm=None)
    for role, factor in (("actor", 0.25), ("critic", 1.0)):
        first_plain, first_scaled = plain[role].seen[0], scaled[role].seen[0]
        assert len(first_plain) == len(first_scaled) > 0 and max(float(g.abs().max()) for g in first_plain) > 1e-3
        for a, b in zip(first_scaled, first_plain):
            torch.testing.assert_close(a, factor * b, atol=1e-12, rtol=0)


def test_the_logged_entropy_is_the_per_token_mean_whatever_the_loss_aggregation() -> None:
    """The `entropy` stat is Σ_it H_it·m_it / Σ_it m_it for every `update.loss_agg` (Dr. GRPO's
    seq-mean-token-sum trains on per-completion sums, but a metric ≈ T× larger would not compare
    across algorithms). One epoch of one minibatch of all 8 rows: the forward sees the initial
    weights, so the three runs log the same number, and it is the mean computed here (float64)."""
    stack, initial, batch, targets, config = _fixture("grpo")
    named = dict(stack.named_parameters())
    logged = {}
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        with torch.no_grad():
            for name, value in initial.items():
                named[name].copy_(value)
        cfg = config.update.__class__(**{**config.update.__dict__, "minibatch_size": 8, "epochs": 1,
                                         "micro_batch_size": 3, "loss_agg": agg})
        result = update(stack, make_optimizers(stack, cfg), batch, targets, cfg, config.kl, config.kl.beta,
                        config.rollout.temperature, torch.Generator().manual_seed(7))
        logged[agg] = result.stats["entropy"]
    with torch.no_grad():
        for name, value in initial.items():
            named[name].copy_(value)
        with stack.use("actor"):
            _, h = stack.response_stats(sequences(batch), batch.response_ids, batch.response_mask,
                                        config.rollout.temperature, entropy="logged")
    mask = batch.response_mask
    expected = float(h[mask].sum() / mask.sum())
    lengths = mask.sum(-1).double()
    assert float(lengths.mean()) > 2  # a per-completion sum would be more than twice the mean
    for agg, value in logged.items():
        assert abs(value - expected) <= 1e-9, (agg, value, expected)
