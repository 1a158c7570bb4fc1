"""Losses, KL estimators, the KL controller and reward shaping: hand-computed tables and properties."""

from __future__ import annotations

import math

import pytest
import torch

from llmrl.step.records import Forwards, Samples, Scores
from llmrl.config.schema import KLConfig
from llmrl.step.estimate import shape_rewards
from llmrl.kl_control import KLController
from llmrl.losses import (AGGREGATIONS, aggregate, bradley_terry, entropy_from_logits, kl_penalty, pair_stats,
                          policy_loss, value_loss)

from tests.helpers import close, m, t

NAN = math.nan


# ---------------------------------------------------------------------------------------------
# aggregate
# ---------------------------------------------------------------------------------------------

LOSS = [[1.0, 1.0, 0.0], [3.0, 0.0, 0.0]]
MASK = [[1, 1, 0], [1, 0, 0]]

AGG_TABLE = [
    # Σℓ = 1+1+3 = 5 over 3 kept tokens → 5/3.
    pytest.param("token-mean", 5 / 3, id="token-mean"),
    # Row means: (1+1)/2 = 1 and 3/1 = 3 → mean 2.
    pytest.param("seq-mean-token-mean", 2.0, id="seq-mean-token-mean"),
    # Row sums: 2 and 3 → mean 2.5.
    pytest.param("seq-mean-token-sum", 2.5, id="seq-mean-token-sum"),
]


@pytest.mark.parametrize("mode, expected", AGG_TABLE)
def test_aggregate_table(mode, expected) -> None:
    close(aggregate(t(LOSS), m(MASK), mode), expected)


@pytest.mark.parametrize("mode, expected", AGG_TABLE)
@pytest.mark.parametrize("junk", [1e6, -7.0, NAN, math.inf])
def test_aggregate_ignores_junk_at_masked_positions(mode, expected, junk) -> None:
    loss = t(LOSS)
    loss[~m(MASK)] = junk
    close(aggregate(loss, m(MASK), mode), expected)


def test_aggregate_unknown_mode_raises() -> None:
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(t(LOSS), m(MASK), "seq-sum")


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_micro_batches_sum_to_the_whole(mode) -> None:
    # 4 rows of ragged length (3, 1, 4, 2 kept tokens): one micro-batch of 4 rows vs 4 micro-batches of
    # 1 row, each given the minibatch totals (Σm = 10 tokens, 4 rows): same loss, same gradients.
    gen = torch.Generator().manual_seed(0)
    mask = torch.arange(4)[None, :] < torch.tensor([3, 1, 4, 2])[:, None]
    target = torch.randn(4, 4, generator=gen)
    theta = torch.randn(4, 4, generator=gen, requires_grad=True)
    whole = aggregate((theta - target) ** 2, mask, mode)
    (grad_whole,) = torch.autograd.grad(whole, theta)
    totals = dict(total_tokens=float(mask.sum()), total_seqs=4.0)
    parts = [aggregate((theta[i : i + 1] - target[i : i + 1]) ** 2, mask[i : i + 1], mode, **totals) for i in range(4)]
    (grad_parts,) = torch.autograd.grad(sum(parts), theta)
    close(sum(parts), whole.item())
    close(grad_parts, grad_whole.tolist())
    # Without the totals a 1-row micro-batch is normalised by itself, which is not the whole's share.
    alone = sum(aggregate((theta[i : i + 1] - target[i : i + 1]) ** 2, mask[i : i + 1], mode) for i in range(4))
    assert abs(alone.item() - whole.item()) > 1e-3


# ---------------------------------------------------------------------------------------------
# policy_loss
# ---------------------------------------------------------------------------------------------

POLICY_TABLE = [
    # ρ = 1.1 inside [0.8, 1.2], A = 2: ℓ = −A·ρ = −2.2; dℓ/dlogπ = −A·ρ = −2.2; not clipped.
    pytest.param(1.1, 2.0, {}, -2.2, -2.2, 0.0, id="inside"),
    # ρ = 1.5 > 1.2, A = 1: max(−1.5, −1.2) = −1.2 (clipped, a constant) → grad 0; clip_frac 1.
    pytest.param(1.5, 1.0, {}, -1.2, 0.0, 1.0, id="above-Apos-clipped"),
    # ρ = 1.5, A = −1: max(1.5, 1.2) = 1.5 (unclipped: pessimistic bound) → grad −A·ρ = 1.5.
    pytest.param(1.5, -1.0, {}, 1.5, 1.5, 0.0, id="above-Aneg-unclipped"),
    # ρ = 0.5 < 0.8, A = 1: max(−0.5, −0.8) = −0.5 (unclipped) → grad −0.5.
    pytest.param(0.5, 1.0, {}, -0.5, -0.5, 0.0, id="below-Apos-unclipped"),
    # ρ = 0.5, A = −1: max(0.5, 0.8) = 0.8 (clipped) → grad 0; clip_frac 1.
    pytest.param(0.5, -1.0, {}, 0.8, 0.0, 1.0, id="below-Aneg-clipped"),
    # Clip-higher ε_low = 0.2, ε_high = 0.28: ρ = 1.25 < 1.28 stays unclipped → ℓ = −1.25, grad −1.25
    #   (symmetric ε = 0.2 would clip it to −1.2 with grad 0).
    pytest.param(1.25, 1.0, {"clip_high": 0.28}, -1.25, -1.25, 0.0, id="clip-higher-inside"),
    # ρ = 1.5 > 1.28, A = 1: ℓ = −1.28, grad 0.
    pytest.param(1.5, 1.0, {"clip_high": 0.28}, -1.28, 0.0, 1.0, id="clip-higher-above"),
    # Low side still uses ε_low: ρ = 0.7, A = −1: max(0.7, 0.8) = 0.8, grad 0.
    pytest.param(0.7, -1.0, {"clip_high": 0.28}, 0.8, 0.0, 1.0, id="clip-higher-low-side"),
    # Dual clip c = 3, A = −1, ρ = 10: PPO term max(10, 1.2) = 10, capped at −c·A = 3 → grad 0.
    pytest.param(10.0, -1.0, {"dual_clip": 3.0}, 3.0, 0.0, None, id="dual-clip-cap"),
    # Dual clip, A = −1, ρ = 1.5: max(1.5, 1.2) = 1.5 < 3, untouched → grad 1.5.
    pytest.param(1.5, -1.0, {"dual_clip": 3.0}, 1.5, 1.5, 0.0, id="dual-clip-below-cap"),
    # Dual clip never applies to A > 0: ρ = 10, A = 1 → max(−10, −1.2) = −1.2, grad 0.
    pytest.param(10.0, 1.0, {"dual_clip": 3.0}, -1.2, 0.0, 1.0, id="dual-clip-Apos"),
]


@pytest.mark.parametrize("ratio, adv, kw, loss, grad, clip_frac", POLICY_TABLE)
def test_policy_loss_table(ratio, adv, kw, loss, grad, clip_frac) -> None:
    # One kept token plus one masked token holding junk: log π_old = −1, log π = −1 + log ρ.
    old = t([[-1.0, 0.0]])
    logprobs = torch.tensor([[-1.0 + math.log(ratio), 5.0]], requires_grad=True)
    out = policy_loss(logprobs, old, t([[adv, NAN]]), m([[1, 0]]), clip_low=0.2, **kw)
    close(out.loss, loss)
    (g,) = torch.autograd.grad(out.loss, logprobs)
    close(g, [[grad, 0.0]])  # dρ/dlogπ = ρ; masked token gets no gradient
    if clip_frac is not None:
        close(out.clip_frac, clip_frac)


def test_policy_loss_batch_clip_frac_and_mean() -> None:
    # Tokens (ρ, A): (1.1, 2) → −2.2; (1.5, 1) → −1.2 clipped; (0.5, −1) → 0.8 clipped; (1.0, 3) → −3;
    #   one masked junk token. token-mean = (−2.2 − 1.2 + 0.8 − 3)/4 = −1.4; clip_frac = 2/4 = 0.5.
    ratios = [[1.1, 1.5, 0.5], [1.0, 1.0, 1.0]]
    old = t([[-1.0, -2.0, -0.5], [-3.0, 0.0, 0.0]])
    logprobs = old + torch.log(t(ratios))
    logprobs[1, 1] = 9.0
    out = policy_loss(logprobs, old, t([[2.0, 1.0, -1.0], [3.0, 4.0, NAN]]), m([[1, 1, 1], [1, 0, 0]]))
    close(out.loss, -1.4)
    close(out.clip_frac, 0.5)
    assert out.approx_kl.item() >= 0


def test_policy_loss_approx_kl_is_k3_of_old_vs_new() -> None:
    # log π_old = −1, log π = −2 (ρ = e^{−1}): k3(π_old‖π) with d = log π_old − log π = 1 → e^{−1} − 1 + 1 = e^{−1}.
    out = policy_loss(t([[-2.0]]), t([[-1.0]]), t([[1.0]]), m([[1]]))
    close(out.approx_kl, math.exp(-1))


def test_policy_loss_at_ratio_one_is_minus_mean_advantage() -> None:
    # ρ = 1 everywhere: ℓ = −A; seq-mean-token-mean of A = [[1, 3, ·], [−2, ·, ·]] → −((1+3)/2 + (−2))/2 = 0.
    old = t([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    out = policy_loss(old.clone(), old, t([[1.0, 3.0, 7.0], [-2.0, 7.0, 7.0]]), m([[1, 1, 0], [1, 0, 0]]),
                      agg="seq-mean-token-mean")
    close(out.loss, 0.0)
    # token-mean: −(1 + 3 − 2)/3 = −2/3.
    out = policy_loss(old.clone(), old, t([[1.0, 3.0, 7.0], [-2.0, 7.0, 7.0]]), m([[1, 1, 0], [1, 0, 0]]))
    close(out.loss, -2 / 3)


# ---------------------------------------------------------------------------------------------
# value_loss
# ---------------------------------------------------------------------------------------------

VALUE_TABLE = [
    # V=1.5, V_old=1, R=2, c=0.2: (1.5−2)² = 0.25; V_clip = 1 + 0.2 = 1.2 → (1.2−2)² = 0.64;
    #   ½·max = 0.32. The clipped branch is constant in V → grad 0.
    pytest.param(1.5, 1.0, 2.0, 0.2, 0.32, 0.0, id="clipped-branch"),
    # V=1.5, V_old=1, R=1: (0.5)² = 0.25 vs (1.2−1)² = 0.04 → ½·0.25 = 0.125; grad = V − R = 0.5.
    pytest.param(1.5, 1.0, 1.0, 0.2, 0.125, 0.5, id="unclipped-branch"),
    # Inside the clip range: V=1.1, V_old=1, R=2 → V_clip = V, ½·0.81 = 0.405; grad = V − R = −0.9.
    pytest.param(1.1, 1.0, 2.0, 0.2, 0.405, -0.9, id="inside"),
    # clip=None: V=1.5, R=2 → ½·0.25 = 0.125; grad −0.5 (no clipping despite |V − V_old| = 0.5).
    pytest.param(1.5, 1.0, 2.0, None, 0.125, -0.5, id="no-clip"),
]


@pytest.mark.parametrize("v, v_old, ret, clip, loss, grad", VALUE_TABLE)
def test_value_loss_table(v, v_old, ret, clip, loss, grad) -> None:
    # Second token is masked and holds finite junk (V = 4, V_old = 0, R = −7): no loss, no gradient.
    values = torch.tensor([[v, 4.0]], requires_grad=True)
    out = value_loss(values, t([[v_old, 0.0]]), t([[ret, -7.0]]), m([[1, 0]]), clip=clip)
    close(out, loss)
    (g,) = torch.autograd.grad(out, values)
    close(g, [[grad, 0.0]])


@pytest.mark.parametrize("clip", [0.2, None])
def test_value_loss_value_ignores_nan_at_masked_positions(clip) -> None:
    # The table's "inside" row (½·(1.1 − 2)² = 0.405) with NaN returns / old values on a masked token.
    out = value_loss(t([[1.1, 4.0]]), t([[1.0, NAN]]), t([[2.0, NAN]]), m([[1, 0]]), clip=clip)
    close(out, 0.405)


def test_value_loss_gradient_ignores_nan_at_masked_positions() -> None:
    # losses.py promises masked positions never influence a result "whatever they hold"; policy_loss
    # keeps that for its gradient (torch.where before exp), value_loss does not: d/dV of (V − NaN)² · 0 = NaN.
    values = torch.tensor([[1.1, 4.0]], requires_grad=True)
    out = value_loss(values, t([[1.0, 0.0]]), t([[2.0, NAN]]), m([[1, 0]]), clip=None)
    (g,) = torch.autograd.grad(out, values)
    close(g, [[-0.9, 0.0]])


# ---------------------------------------------------------------------------------------------
# KL estimators and entropy
# ---------------------------------------------------------------------------------------------

KL_TABLE = [
    # log π = −1, log π_ref = −2, d = 1: k1 = 1; k2 = ½·1² = 0.5; k3 = e^{−1} − (−1) − 1 = e^{−1} = 0.36788.
    pytest.param(-1.0, -2.0, 1.0, 0.5, math.exp(-1), id="d=1"),
    # log π = −2, log π_ref = −1, d = −1: k1 = −1; k2 = 0.5; k3 = e^{1} − 1 − 1 = 0.71828.
    pytest.param(-2.0, -1.0, -1.0, 0.5, math.e - 2, id="d=-1"),
    # Equal: all zero.
    pytest.param(-0.7, -0.7, 0.0, 0.0, 0.0, id="d=0"),
    # d = 0.5: k1 = 0.5; k2 = 0.125; k3 = e^{−0.5} − 1 + 0.5 = 0.60653 − 0.5 = 0.10653.
    pytest.param(-0.5, -1.0, 0.5, 0.125, math.exp(-0.5) - 0.5, id="d=0.5"),
]


@pytest.mark.parametrize("logp, ref, k1, k2, k3", KL_TABLE)
def test_kl_penalty_table(logp, ref, k1, k2, k3) -> None:
    lp, rp = t([logp]), t([ref])
    close(kl_penalty(lp, rp, "k1"), [k1])
    close(kl_penalty(lp, rp, "k2"), [k2])
    close(kl_penalty(lp, rp, "k3"), [k3])


def test_kl_penalty_k2_k3_nonnegative_on_random_inputs() -> None:
    gen = torch.Generator().manual_seed(0)
    lp = 5 * torch.randn(2000, generator=gen)
    rp = 5 * torch.randn(2000, generator=gen)
    assert (kl_penalty(lp, rp, "k3") >= 0).all()
    assert (kl_penalty(lp, rp, "k2") >= 0).all()
    assert (kl_penalty(lp, rp, "k1") < 0).any()  # k1 can be negative: the check above is not vacuous


def test_kl_penalty_unknown_raises() -> None:
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(t([0.0]), t([0.0]), "k4")


def test_entropy_of_uniform_logits_is_log_v() -> None:
    # Uniform over V = 7 (any constant logit) → H = log 7 = 1.94591 at every position.
    close(entropy_from_logits(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)).tolist())
    close(entropy_from_logits(torch.full((4, 5), 3.5)), [math.log(5)] * 4)


def test_entropy_hand_case() -> None:
    # logits [0, log 3] → p = [1/4, 3/4] → H = ¼·ln 4 + ¾·ln(4/3) = 0.34657 + 0.21576 = 0.56233.
    close(entropy_from_logits(t([[0.0, math.log(3)]])), [0.25 * math.log(4) + 0.75 * math.log(4 / 3)])


# ---------------------------------------------------------------------------------------------
# KLController
# ---------------------------------------------------------------------------------------------


def test_fixed_kl_controller_stays() -> None:
    ctl = KLController(beta=0.1)
    for kl in (0.0, 5.0, 1e6):
        ctl.update(kl, n_samples=1000)
    assert ctl.beta == 0.1


ADAPTIVE_TABLE = [
    # β=0.1, target 0.1, horizon 1000, n=1000 → β ← 0.1·(1 + e), e = clip(KL/0.1 − 1, ±0.2).
    # KL = 0.11: e = 0.1 → 0.11.
    pytest.param(0.11, 0.11, id="above-small"),
    # KL = 1.0: e = 9 clipped to 0.2 → 0.12.
    pytest.param(1.0, 0.12, id="above-clipped"),
    # KL = 0.09: e = −0.1 → 0.09.
    pytest.param(0.09, 0.09, id="below-small"),
    # KL = 0: e = −1 clipped to −0.2 → 0.08.
    pytest.param(0.0, 0.08, id="below-clipped"),
    # KL = target: e = 0 → unchanged.
    pytest.param(0.1, 0.1, id="on-target"),
]


@pytest.mark.parametrize("kl, beta", ADAPTIVE_TABLE)
def test_adaptive_kl_controller_table(kl, beta) -> None:
    ctl = KLController(beta=0.1, adaptive=True, target=0.1, horizon=1000)
    ctl.update(kl, n_samples=1000)
    close(ctl.beta, beta)


def test_adaptive_kl_controller_is_multiplicative_and_scaled_by_samples() -> None:
    # n = 100, horizon 1000: step = e·0.1. KL = 1 (e = 0.2): β = 0.5·1.02 = 0.51, again 0.51·1.02 = 0.5202;
    #   then KL = 0 (e = −0.2): 0.5202·0.98 = 0.509796.
    ctl = KLController(beta=0.5, adaptive=True, target=0.1, horizon=1000)
    ctl.update(1.0, n_samples=100)
    close(ctl.beta, 0.51)
    ctl.update(1.0, n_samples=100)
    close(ctl.beta, 0.5202)
    ctl.update(0.0, n_samples=100)
    close(ctl.beta, 0.509796)
    restored = KLController(beta=0.0, adaptive=True)
    restored.load_state_dict(ctl.state_dict())
    assert restored.beta == ctl.beta


# ---------------------------------------------------------------------------------------------
# shape_rewards
# ---------------------------------------------------------------------------------------------


def make_batch(ref_logprobs=True) -> tuple[Samples, Scores, Forwards]:
    # Row 0 keeps 2 tokens, row 1 keeps 1, row 2 keeps 3, row 3 keeps none.
    mask = m([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    old = t([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
    # Junk at masked positions of ref: must not reach the rewards.
    ref = t([[-2.0, -2.0, 9.0], [-1.0, 9.0, 9.0], [-1.0, -0.5, -1.0], [9.0, 9.0, 9.0]])
    samples = Samples(
        rows=({"prompt": "a"}, {"prompt": "b"}), prompt_ids=torch.zeros(4, 2, dtype=torch.long),
        prompt_mask=torch.ones(4, 2, dtype=torch.bool), response_ids=torch.ones(4, 3, dtype=torch.long),
        response_mask=mask, group_size=2, prompt_index=torch.tensor([0, 0, 1, 1]), completions=("",) * 4,
    )
    return samples, Scores(t([2.0, -1.0, 0.5, 5.0])), Forwards(old.dtype, old, ref if ref_logprobs else None)


# Scores on the last kept token: row 0 → t=1, row 1 → t=0, row 2 → t=2, row 3 (empty) → nothing.
SCORES_ONLY = [[0.0, 2.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.5], [0.0, 0.0, 0.0]]

SHAPE_TABLE = [
    # k1 = log π_old − log π_ref on kept tokens: row 0 [1, 0], row 1 [0.5], row 2 [0, −0.5, 0].
    # β = 0.1, placement reward: r = score − 0.1·k1:
    #   row 0 [−0.1, 2 − 0, 0]; row 1 [−1 − 0.05] = [−1.05]; row 2 [0, +0.05, 0.5]; row 3 zeros.
    pytest.param(0.1, "k1", "reward", [[-0.1, 2.0, 0.0], [-1.05, 0.0, 0.0], [0.0, 0.05, 0.5], [0.0, 0.0, 0.0]],
                 id="k1-reward"),
    # k3 = e^{−d} − 1 + d: d=1 → 0.36788; d=0.5 → 0.10653; d=−0.5 → e^{0.5} − 1.5 = 0.14872; d=0 → 0.
    #   β = 0.1: row 0 [−0.036788, 2]; row 1 [−1 − 0.010653] = [−1.010653]; row 2 [0, −0.014872, 0.5].
    pytest.param(0.1, "k3", "reward",
                 [[-0.036788, 2.0, 0.0], [-1.010653, 0.0, 0.0], [0.0, -0.014872, 0.5], [0.0, 0.0, 0.0]],
                 id="k3-reward"),
    # KL in the loss: rewards are the scores only.
    pytest.param(0.1, "k1", "loss", SCORES_ONLY, id="k1-loss"),
    # β = 0: scores only.
    pytest.param(0.0, "k1", "reward", SCORES_ONLY, id="beta0"),
]


@pytest.mark.parametrize("beta, estimator, placement, expected", SHAPE_TABLE)
def test_shape_rewards_table(beta, estimator, placement, expected) -> None:
    cfg = KLConfig(beta=beta, estimator=estimator, placement=placement)
    rewards = shape_rewards(*make_batch(), beta, cfg)
    close(rewards, expected)
    assert (rewards[~make_batch()[0].response_mask] == 0).all()


def test_shape_rewards_without_reference_is_scores_only() -> None:
    # No ref log-probs (no KL used): r = score on the last kept token, whatever β says.
    rewards = shape_rewards(*make_batch(ref_logprobs=False), 0.1, KLConfig(beta=0.1))
    close(rewards, SCORES_ONLY)


def test_shape_rewards_uses_the_beta_argument_not_the_config() -> None:
    # The controller's β (0.2) wins over kl.beta (0.1): row 0 t=0 → −0.2·1 = −0.2; row 1 → −1 − 0.2·0.5 = −1.1.
    rewards = shape_rewards(*make_batch(), 0.2, KLConfig(beta=0.1, estimator="k1", placement="reward"))
    close(rewards[:2, :1], [[-0.2], [-1.1]])


# ---------------------------------------------------------------------------------------------
# Properties (hypothesis): finite in → finite out, masked positions never matter
# ---------------------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 5), t=st.integers(1, 6), seed=st.integers(0, 10_000),
    scale=st.sampled_from([1e-3, 1.0, 30.0]), agg=st.sampled_from(AGGREGATIONS),
)
def test_losses_are_finite_and_ignore_masked_positions(n: int, t: int, seed: int, scale: float, agg: str) -> None:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, t, generator=g) < 0.7
    lp, old, ref = (scale * torch.randn(n, t, generator=g) for _ in range(3))
    adv, values, returns = (scale * torch.randn(n, t, generator=g) for _ in range(3))
    junk = torch.full((n, t), math.nan)
    dirty = lambda x: torch.where(mask, x, junk)  # noqa: E731
    clean_pl = policy_loss(lp, old, adv, mask, 0.2, 0.28, 3.0, agg).loss
    dirty_pl = policy_loss(dirty(lp), dirty(old), dirty(adv), mask, 0.2, 0.28, 3.0, agg).loss
    clean_vl = value_loss(values, old, returns, mask, 0.2, agg)
    dirty_vl = value_loss(dirty(values), dirty(old), dirty(returns), mask, 0.2, agg)
    for clean, dirt in ((clean_pl, dirty_pl), (clean_vl, dirty_vl)):
        assert torch.isfinite(clean) and torch.isfinite(dirt)
        torch.testing.assert_close(dirt, clean, atol=1e-5, rtol=1e-5)
    if scale <= 1.0:  # at scale 30, k3's exp(log π_ref − log π) can legitimately overflow float32
        for est in ("k1", "k2", "k3"):
            assert torch.isfinite(kl_penalty(lp, ref, est)[mask]).all()


# ---------------------------------------------------------------------------------------------
# bradley_terry, pair_stats (the reward model's loss over preference pairs)
# ---------------------------------------------------------------------------------------------

# r_w = (1, 0), r_l = (0, 0): −log σ(1) = log(1 + e⁻¹) = 0.313262, −log σ(0) = log 2 = 0.693147.
BT_TABLE = [
    # mean(0.313262, 0.693147) = 0.503204
    pytest.param(None, 0.0, 0.503204434, id="plain"),
    # m = (0.5, 0): −log σ(1 − 0.5) = log(1 + e^−0.5) = 0.474077; mean with 0.693147 = 0.583612
    pytest.param([0.5, 0.0], 0.0, 0.583612082, id="margin"),
    # c = 0.01: + 0.01 · mean((1 + 0)², (0 + 0)²) = 0.01 · 0.5 = 0.005 → 0.508204
    pytest.param(None, 0.01, 0.508204434, id="center"),
    # both: 0.583612 + 0.005
    pytest.param([0.5, 0.0], 0.01, 0.588612082, id="margin+center"),
]


@pytest.mark.parametrize("margin,center,expected", BT_TABLE)
def test_bradley_terry_table(margin, center, expected) -> None:
    loss = bradley_terry(t([1.0, 0.0]), t([0.0, 0.0]), None if margin is None else t(margin), center)
    assert loss.shape == ()
    close(loss, expected)


def test_bradley_terry_gradient_raises_chosen_and_lowers_rejected() -> None:
    """∂L/∂r_w,i = −σ(−(r_w,i − r_l,i − m_i))/P + 2c(r_w,i + r_l,i)/P, ∂L/∂r_l,i = σ(…)/P + 2c(r_w,i + r_l,i)/P.
    r_w = (1, 0), r_l = (0, 0), P = 2: σ(−1)/2 = 0.134471, σ(0)/2 = 0.25; with c = 0.01: 2·0.01·(1, 0)/2 = (0.01, 0)."""
    r_w, r_l = t([1.0, 0.0]).requires_grad_(), t([0.0, 0.0]).requires_grad_()
    bradley_terry(r_w, r_l).backward()
    close(r_w.grad, [-0.134470711, -0.25])
    close(r_l.grad, [0.134470711, 0.25])  # descent raises r_w and lowers r_l
    r_w.grad = r_l.grad = None
    bradley_terry(r_w, r_l, center=0.01).backward()
    close(r_w.grad, [-0.124470711, -0.25])
    close(r_l.grad, [0.144470711, 0.25])


def test_bradley_terry_is_finite_far_from_zero() -> None:
    """−log σ(−100) = 100 + log(1 + e⁻¹⁰⁰) = 100 (a log of σ would give inf); −log σ(100) = e⁻¹⁰⁰ ≈ 0."""
    close(bradley_terry(t([-100.0, 100.0]), t([0.0, 0.0])), 50.0)


def test_pair_stats_counts_a_tie_half() -> None:
    """r_w − r_l = (1, 0, −1, 1): accuracy (1 + ½ + 0 + 1)/4 = 0.625, mean margin 1/4 = 0.25."""
    assert pair_stats(t([1.0, 0.0, 2.0, 1.0]), t([0.0, 0.0, 3.0, 0.0])) == {"accuracy": 0.625, "margin": 0.25}
