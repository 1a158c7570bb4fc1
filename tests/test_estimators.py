"""Advantage estimators: hand-computed tables, properties, a slow reference loop, the registry.

Conventions (see DESIGN.md): rows are right-padded, `response_mask` True = trained token; groups are
contiguous rows [g·G, (g+1)·G); critic estimators return `returns = advantages + V_old`.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrl.errors import ConfigError
from llmrl.estimators import ESTIMATORS, EstimatorInput, EstimatorOutput, get_estimator, register

from tests.helpers import ATOL, close, m, t

ALL = sorted(ESTIMATORS)
# Sequence-level, critic-free estimators: one advantage per response (reinforce's G_t varies along t).
SEQUENCE_LEVEL = [n for n in ALL if ESTIMATORS[n].needs.groups or ESTIMATORS[n].needs.greedy]


def run(name: str, **kw) -> EstimatorOutput:
    return get_estimator(name).fn(EstimatorInput(**kw))


def lengths_mask(lengths: list[int], n_tokens: int) -> torch.Tensor:
    """Right-padded (N, T) mask with the given kept length per row."""
    return torch.arange(n_tokens)[None, :] < torch.tensor(lengths)[:, None]


def make_input(name: str, gen: torch.Generator, lengths: list[int], n_tokens: int, group_size: int, **kw) -> EstimatorInput:
    """Random clean inputs for estimator `name` (0 at masked positions), built from what it needs."""
    needs = ESTIMATORS[name].needs
    mask = lengths_mask(lengths, n_tokens)
    n = len(lengths)
    zeros = torch.zeros(n, n_tokens)
    rewards = torch.where(mask, torch.randn(n, n_tokens, generator=gen), zeros)
    values = torch.where(mask, torch.randn(n, n_tokens, generator=gen), zeros) if needs.critic else None
    baseline = torch.randn(n // group_size, generator=gen).repeat_interleave(group_size) if needs.greedy else None
    return EstimatorInput(
        token_rewards=rewards, response_mask=mask, group_size=group_size, values=values,
        baseline_scores=baseline, **kw,
    )


# ---------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------

V3 = [[0.5, 0.4, 0.8]]
R3 = [[0.0, 0.0, 1.0]]

GAE_TABLE = [
    # Theory's worked example, γ=1, λ=1: A_t = G_t − V_t with G = [1,1,1]
    #   → A = [1−0.5, 1−0.4, 1−0.8] = [0.5, 0.6, 0.2]; returns = A + V = [1, 1, 1].
    pytest.param(V3, R3, [[1, 1, 1]], 1.0, 1.0, [[0.5, 0.6, 0.2]], [[1.0, 1.0, 1.0]], id="worked-lam1"),
    # Same, λ=0: A_t = δ_t = r_t + V_{t+1} − V_t:
    #   δ0 = 0+0.4−0.5 = −0.1, δ1 = 0+0.8−0.4 = 0.4, δ2 = 1+0−0.8 = 0.2; returns = A + V = [0.4, 0.8, 1.0].
    pytest.param(V3, R3, [[1, 1, 1]], 1.0, 0.0, [[-0.1, 0.4, 0.2]], [[0.4, 0.8, 1.0]], id="worked-lam0"),
    # γ=0.9, λ=0.5 (γλ = 0.45): δ2 = 1−0.8 = 0.2; δ1 = 0.9·0.8−0.4 = 0.32; δ0 = 0.9·0.4−0.5 = −0.14.
    #   A2 = 0.2; A1 = 0.32 + 0.45·0.2 = 0.41; A0 = −0.14 + 0.45·0.41 = 0.0445.
    #   returns = A + V = [0.5445, 0.81, 1.0].
    pytest.param(V3, R3, [[1, 1, 1]], 0.9, 0.5, [[0.0445, 0.41, 0.2]], [[0.5445, 0.81, 1.0]], id="gamma0.9-lam0.5"),
    # Right-padded row, mask [1,1,0], V=[0.5,0.4,·], r=[0,1,·], γ=1, λ=0.5: V after the last kept
    #   token is 0, so δ1 = 1−0.4 = 0.6, δ0 = 0.4−0.5 = −0.1; A1 = 0.6, A0 = −0.1 + 0.5·0.6 = 0.2, A2 = 0.
    #   returns = [0.2+0.5, 0.6+0.4, 0] = [0.7, 1.0, 0].
    pytest.param([[0.5, 0.4, 0.0]], [[0.0, 1.0, 0.0]], [[1, 1, 0]], 1.0, 0.5, [[0.2, 0.6, 0.0]], [[0.7, 1.0, 0.0]],
                 id="right-padded"),
]


@pytest.mark.parametrize("values, rewards, mask, gamma, lam, adv, ret", GAE_TABLE)
def test_gae_table(values, rewards, mask, gamma, lam, adv, ret) -> None:
    out = run("gae", token_rewards=t(rewards), response_mask=m(mask), values=t(values), gamma=gamma, lam=lam)
    close(out.advantages, adv)
    close(out.returns, ret)


def test_gae_two_rows_at_once_equal_the_rows_alone() -> None:
    # Row 0 = worked example (λ=1 → [0.5,0.6,0.2]); row 1 = right-padded case above but with λ=1:
    #   A1 = 1−0.4 = 0.6, A0 = (0.4−0.5) + 0.6 = 0.5; returns = [1, 1, 0].
    out = run("gae", token_rewards=t([[0, 0, 1], [0, 1, 0]]), response_mask=m([[1, 1, 1], [1, 1, 0]]),
              values=t([[0.5, 0.4, 0.8], [0.5, 0.4, 0.0]]), gamma=1.0, lam=1.0)
    close(out.advantages, [[0.5, 0.6, 0.2], [0.5, 0.6, 0.0]])
    close(out.returns, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


# ---------------------------------------------------------------------------------------------
# REINFORCE, REINFORCE with baseline, A2C
# ---------------------------------------------------------------------------------------------

REINFORCE_TABLE = [
    # γ=0.9, r=[0.5,0,1]: G2 = 1; G1 = 0 + 0.9·1 = 0.9; G0 = 0.5 + 0.9·0.9 = 1.31.
    pytest.param([[0.5, 0.0, 1.0]], [[1, 1, 1]], 0.9, [[1.31, 0.9, 1.0]], id="gamma0.9"),
    # γ=1: G_t = Σ_{k≥t} r_k = [1.5, 1, 1].
    pytest.param([[0.5, 0.0, 1.0]], [[1, 1, 1]], 1.0, [[1.5, 1.0, 1.0]], id="gamma1"),
    # Right-padded, mask [1,1,0], r=[0,1,·], γ=0.9: G1 = 1, G0 = 0.9; padded position 0.
    pytest.param([[0.0, 1.0, 0.0]], [[1, 1, 0]], 0.9, [[0.9, 1.0, 0.0]], id="right-padded"),
]


@pytest.mark.parametrize("rewards, mask, gamma, expected", REINFORCE_TABLE)
def test_reinforce_is_reward_to_go(rewards, mask, gamma, expected) -> None:
    out = run("reinforce", token_rewards=t(rewards), response_mask=m(mask), gamma=gamma)
    close(out.advantages, expected)
    assert out.returns is None  # no critic, no critic targets


def test_reinforce_baseline_subtracts_values_and_returns_g() -> None:
    # γ=0.9, r=[0.5,0,1] → G = [1.31, 0.9, 1.0] (table above); V = [0.5,0.4,0.8]
    #   → A = G − V = [0.81, 0.5, 0.2]; returns = G.
    out = run("reinforce_baseline", token_rewards=t([[0.5, 0, 1]]), response_mask=m([[1, 1, 1]]),
              values=t(V3), gamma=0.9)
    close(out.advantages, [[0.81, 0.5, 0.2]])
    close(out.returns, [[1.31, 0.9, 1.0]])


def test_a2c_one_step_is_td_error_and_equals_gae_lam0() -> None:
    # n=1: Q_t = r_t + γ V_{t+1} → on the worked example A = δ = [−0.1, 0.4, 0.2], returns [0.4, 0.8, 1.0].
    kw = dict(token_rewards=t(R3), response_mask=m([[1, 1, 1]]), values=t(V3), gamma=1.0)
    out = run("a2c", n_step=1, **kw)
    close(out.advantages, [[-0.1, 0.4, 0.2]])
    close(out.returns, [[0.4, 0.8, 1.0]])
    ref = run("gae", lam=0.0, **kw)
    close(out.advantages, ref.advantages.tolist())
    close(out.returns, ref.returns.tolist())


V4 = [[0.5, 0.4, 0.8, 0.6]]
R4 = [[0.1, 0.0, 0.2, 1.0]]


def test_a2c_two_step_hand_case() -> None:
    # n=2, γ=0.9 (γ²=0.81), V = [0.5,0.4,0.8,0.6], r = [0.1,0,0.2,1], V = 0 past the end:
    #   Q0 = 0.1 + 0.9·0   + 0.81·0.8 = 0.748 → A0 = 0.748 − 0.5 = 0.248
    #   Q1 = 0   + 0.9·0.2 + 0.81·0.6 = 0.666 → A1 = 0.666 − 0.4 = 0.266
    #   Q2 = 0.2 + 0.9·1   + 0.81·0   = 1.1   → A2 = 1.1 − 0.8 = 0.3
    #   Q3 = 1   + 0.9·0   + 0        = 1.0   → A3 = 1.0 − 0.6 = 0.4
    out = run("a2c", token_rewards=t(R4), response_mask=m([[1, 1, 1, 1]]), values=t(V4), gamma=0.9, n_step=2)
    close(out.advantages, [[0.248, 0.266, 0.3, 0.4]])
    close(out.returns, [[0.748, 0.666, 1.1, 1.0]])


def test_a2c_n_longer_than_response_is_monte_carlo() -> None:
    # n=10 > T=4: no bootstrap, Q_t = G_t (γ=0.9): G3 = 1, G2 = 0.2+0.9 = 1.1, G1 = 0.9·1.1 = 0.99,
    #   G0 = 0.1 + 0.9·0.99 = 0.991 → A = G − V = [0.491, 0.59, 0.3, 0.4]; = reinforce_baseline.
    kw = dict(token_rewards=t(R4), response_mask=m([[1, 1, 1, 1]]), values=t(V4), gamma=0.9)
    out = run("a2c", n_step=10, **kw)
    close(out.advantages, [[0.491, 0.59, 0.3, 0.4]])
    close(out.returns, [[0.991, 0.99, 1.1, 1.0]])
    mc = run("reinforce_baseline", **kw)
    close(out.advantages, mc.advantages.tolist())


def test_a2c_right_padded_row() -> None:
    # mask [1,1,0], r=[0,1,·], V=[0.5,0.4,·], n=2, γ=0.9: Q0 = 0 + 0.9·1 + 0.81·0 = 0.9 (V2 is past the
    #   end → 0); Q1 = 1 + 0 = 1. A = [0.9−0.5, 1−0.4, 0] = [0.4, 0.6, 0]; returns [0.9, 1, 0].
    out = run("a2c", token_rewards=t([[0, 1, 0]]), response_mask=m([[1, 1, 0]]), values=t([[0.5, 0.4, 0]]),
              gamma=0.9, n_step=2)
    close(out.advantages, [[0.4, 0.6, 0.0]])
    close(out.returns, [[0.9, 1.0, 0.0]])


# ---------------------------------------------------------------------------------------------
# Group estimators and ReMax
# ---------------------------------------------------------------------------------------------


def seq_rewards(scores: list[float], n_tokens: int = 2) -> torch.Tensor:
    """(N, T) token rewards whose row sum is the score, split over the tokens (R = Σ_t r_t)."""
    s = t(scores)[:, None]
    return torch.cat([0.25 * s, 0.75 * s, torch.zeros(len(scores), n_tokens - 2)], dim=1)


GROUP_TABLE = [
    # [1,0,0,1], G=4: mean 0.5, unbiased std = sqrt(4·0.25/3) = 0.57735 → ±0.5/0.57735 = ±0.86603.
    pytest.param("grpo", [1, 0, 0, 1], 4, [0.8660, -0.8660, -0.8660, 0.8660], 0.0, id="grpo-1001"),
    # Dr. GRPO: R − mean = ±0.5.
    pytest.param("dr_grpo", [1, 0, 0, 1], 4, [0.5, -0.5, -0.5, 0.5], 0.0, id="dr_grpo-1001"),
    # RLOO: R=1 → 1 − (1+0+0)/3 = 2/3; R=0 → 0 − (0+0+1... i.e. 2)/3 = −2/3.
    pytest.param("rloo", [1, 0, 0, 1], 4, [2 / 3, -2 / 3, -2 / 3, 2 / 3], 0.0, id="rloo-1001"),
    # Two groups of G=2, [1,3 | 2,2]: group 0 mean 2, unbiased std sqrt((1+1)/1) = √2 → ∓1/√2 = ∓0.70711;
    #   group 1 all equal → 0/(0+1e-6) = 0; one of two groups has zero std → 0.5.
    pytest.param("grpo", [1, 3, 2, 2], 2, [-0.70711, 0.70711, 0, 0], 0.5, id="grpo-G2"),
    pytest.param("dr_grpo", [1, 3, 2, 2], 2, [-1, 1, 0, 0], 0.5, id="dr_grpo-G2"),
    # RLOO G=2: baseline is the other sample: 1−3 = −2, 3−1 = 2, 2−2 = 0.
    pytest.param("rloo", [1, 3, 2, 2], 2, [-2, 2, 0, 0], 0.5, id="rloo-G2"),
    # Two groups of G=3, [0,1,5 | 3,3,3]: mean 2, deviations [−2,−1,3], unbiased var (4+1+9)/2 = 7,
    #   std √7 = 2.64575 → [−0.75593, −0.37796, 1.13389]; second group 0; frac 0.5.
    pytest.param("grpo", [0, 1, 5, 3, 3, 3], 3, [-0.75593, -0.37796, 1.13389, 0, 0, 0], 0.5, id="grpo-G3"),
    pytest.param("dr_grpo", [0, 1, 5, 3, 3, 3], 3, [-2, -1, 3, 0, 0, 0], 0.5, id="dr_grpo-G3"),
    # RLOO G=3: 0 − (1+5)/2 = −3; 1 − (0+5)/2 = −1.5; 5 − (0+1)/2 = 4.5 (= G/(G−1) · Dr. GRPO).
    pytest.param("rloo", [0, 1, 5, 3, 3, 3], 3, [-3, -1.5, 4.5, 0, 0, 0], 0.5, id="rloo-G3"),
]


@pytest.mark.parametrize("name, scores, group_size, expected, frac_zero", GROUP_TABLE)
def test_group_estimators_table(name, scores, group_size, expected, frac_zero) -> None:
    n = len(scores)
    mask = lengths_mask([3] * n, 3)
    out = run(name, token_rewards=seq_rewards(scores, 3), response_mask=mask, group_size=group_size)
    close(out.advantages, t(expected)[:, None].expand(n, 3).tolist())  # same value on every token
    assert out.returns is None
    assert out.stats["frac_zero_std_groups"] == pytest.approx(frac_zero, abs=1e-9)


def test_remax_subtracts_greedy_reward() -> None:
    # R = [1, 0.5, 2], greedy R = [0.5, 0.5, 3] → A = [0.5, 0, −1] on every kept token.
    out = run("remax", token_rewards=seq_rewards([1, 0.5, 2], 3), response_mask=m([[1, 1, 1]] * 3),
              baseline_scores=t([0.5, 0.5, 3]))
    close(out.advantages, [[0.5] * 3, [0.0] * 3, [-1.0] * 3])
    assert out.returns is None


@pytest.mark.parametrize("name", SEQUENCE_LEVEL)
def test_critic_free_same_advantage_on_every_kept_token_zero_on_masked(name) -> None:
    # Ragged rows (lengths 4, 2, 1, 3) of one group of G=4; scores on each row's last kept token.
    gen = torch.Generator().manual_seed(0)
    x = make_input(name, gen, [4, 2, 1, 3], 4, 4)
    out = ESTIMATORS[name].fn(x)
    mask = x.response_mask
    first = out.advantages[:, :1].expand_as(out.advantages)
    close(torch.where(mask, out.advantages, first), first.tolist())  # kept tokens equal the first
    assert (out.advantages[~mask] == 0).all()
    assert out.advantages[mask].abs().sum() > 0  # not trivially all zero


def test_reinforce_varies_along_tokens_with_discount() -> None:
    # Not a critic-free "sequence" estimator: γ=0.5, r=[0,0,1] → G = [0.25, 0.5, 1].
    out = run("reinforce", token_rewards=t(R3), response_mask=m([[1, 1, 1]]), gamma=0.5)
    close(out.advantages, [[0.25, 0.5, 1.0]])


def test_grpo_eps_keeps_constant_groups_finite() -> None:
    # All-equal group [2,2,2,2]: std 0, eps 1e-6 → (2−2)/(0+1e-6) = 0, not NaN; frac_zero_std = 1.
    out = run("grpo", token_rewards=seq_rewards([2, 2, 2, 2], 2), response_mask=m([[1, 1]] * 4), group_size=4)
    close(out.advantages, [[0.0, 0.0]] * 4)
    assert out.stats["frac_zero_std_groups"] == 1.0


# ---------------------------------------------------------------------------------------------
# Properties over every registered estimator
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("junk", ["large", "nan"])
def test_masked_junk_changes_nothing(name, junk) -> None:
    gen = torch.Generator().manual_seed(1)
    clean = make_input(name, gen, [5, 3, 1, 0, 4, 2], 5, 3, gamma=0.9, lam=0.7, n_step=2)
    mask = clean.response_mask
    noise = 1e4 * torch.randn(mask.shape, generator=gen) if junk == "large" else torch.full(mask.shape, math.nan)
    dirty = EstimatorInput(
        token_rewards=torch.where(mask, clean.token_rewards, noise),
        response_mask=mask, group_size=clean.group_size,
        values=None if clean.values is None else torch.where(mask, clean.values, noise.flip(0)),
        baseline_scores=clean.baseline_scores, gamma=clean.gamma, lam=clean.lam, n_step=clean.n_step,
    )
    spec = ESTIMATORS[name]
    a, b = spec.fn(clean), spec.fn(dirty)
    torch.testing.assert_close(b.advantages, a.advantages, **ATOL)
    assert (b.advantages[~mask] == 0).all()
    assert (a.returns is None) == (b.returns is None)
    if b.returns is not None:
        torch.testing.assert_close(b.returns, a.returns, **ATOL)
        assert (b.returns[~mask] == 0).all()


@pytest.mark.parametrize("name", ALL)
def test_permuting_rows_inside_a_group_permutes_outputs(name) -> None:
    gen = torch.Generator().manual_seed(2)
    x = make_input(name, gen, [4, 2, 3, 1, 4, 3, 2, 4], 4, 4, gamma=0.9, lam=0.8, n_step=2)
    # Permute inside each group of 4 only: group 0 → [2,0,3,1], group 1 → [7,4,6,5].
    perm = torch.tensor([2, 0, 3, 1, 7, 4, 6, 5])
    px = EstimatorInput(
        token_rewards=x.token_rewards[perm], response_mask=x.response_mask[perm], group_size=4,
        values=None if x.values is None else x.values[perm],
        baseline_scores=None if x.baseline_scores is None else x.baseline_scores[perm],
        gamma=x.gamma, lam=x.lam, n_step=x.n_step,
    )
    spec = ESTIMATORS[name]
    out, pout = spec.fn(x), spec.fn(px)
    torch.testing.assert_close(pout.advantages, out.advantages[perm], **ATOL)
    if out.returns is not None:
        torch.testing.assert_close(pout.returns, out.returns[perm], **ATOL)
    assert pout.stats == pytest.approx(out.stats)


def slow_gae(rewards, values, lengths, gamma, lam):
    """Per row, per t, Python floats: A_t = Σ_k (γλ)^k δ_{t+k} over the kept tokens, V = 0 past the end."""
    adv, ret = [], []
    for r, v, n in zip(rewards, values, lengths):
        row_a = [0.0] * len(r)
        for t_ in range(n):
            total = 0.0
            for k in range(n - t_):
                s = t_ + k
                v_next = v[s + 1] if s + 1 < n else 0.0
                total += (gamma * lam) ** k * (r[s] + gamma * v_next - v[s])
            row_a[t_] = total
        adv.append(row_a)
        ret.append([row_a[i] + v[i] if i < n else 0.0 for i in range(len(r))])
    return adv, ret


def slow_a2c(rewards, values, lengths, gamma, n_step):
    """Per row, per t: Q_t = Σ_{k<n} γ^k r_{t+k} + γ^n V_{t+n}, with r = V = 0 past the end."""
    adv, ret = [], []
    for r, v, n in zip(rewards, values, lengths):
        row_a, row_q = [0.0] * len(r), [0.0] * len(r)
        for t_ in range(n):
            q = sum(gamma**k * r[t_ + k] for k in range(n_step) if t_ + k < n)
            q += gamma**n_step * (v[t_ + n_step] if t_ + n_step < n else 0.0)
            row_q[t_], row_a[t_] = q, q - v[t_]
        adv.append(row_a)
        ret.append(row_q)
    return adv, ret


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_slow_reference_loop_equals_vectorised_gae_and_a2c(seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    n_rows, n_tokens = 6, 7
    lengths = torch.randint(0, n_tokens + 1, (n_rows,), generator=gen).tolist()
    x = make_input("gae", gen, lengths, n_tokens, 1)
    r, v = x.token_rewards.tolist(), x.values.tolist()
    gamma, lam = 0.9, 0.7
    out = run("gae", token_rewards=x.token_rewards, response_mask=x.response_mask, values=x.values,
              gamma=gamma, lam=lam)
    a, ret = slow_gae(r, v, lengths, gamma, lam)
    close(out.advantages, a)
    close(out.returns, ret)
    for n_step in (1, 2, 3, 9):
        out = run("a2c", token_rewards=x.token_rewards, response_mask=x.response_mask, values=x.values,
                  gamma=gamma, n_step=n_step)
        a, ret = slow_a2c(r, v, lengths, gamma, n_step)
        close(out.advantages, a)
        close(out.returns, ret)


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def test_registry_has_the_table_of_methods() -> None:
    assert set(ESTIMATORS) >= {"reinforce", "reinforce_baseline", "a2c", "gae", "grpo", "dr_grpo", "rloo", "remax"}
    assert get_estimator("gae").needs.critic and not get_estimator("grpo").needs.critic
    assert get_estimator("rloo").needs.groups and get_estimator("remax").needs.greedy


def test_duplicate_register_raises_and_keeps_the_original() -> None:
    original = ESTIMATORS["gae"]
    with pytest.raises(ValueError, match="gae"):
        register("gae", q_estimate="x", baseline="y")(lambda x: EstimatorOutput(x.token_rewards))
    assert ESTIMATORS["gae"] is original

    name = "_test_only_estimator"
    try:
        register(name, q_estimate="x", baseline="y")(lambda x: EstimatorOutput(x.token_rewards))
        with pytest.raises(ValueError, match=name):
            register(name, q_estimate="x", baseline="y")(lambda x: EstimatorOutput(x.token_rewards))
    finally:
        ESTIMATORS.pop(name, None)


def test_unknown_estimator_is_a_config_error_listing_valid_names() -> None:
    with pytest.raises(ConfigError) as info:
        get_estimator("nope")
    message = str(info.value)
    assert "nope" in message
    for name in ALL:
        assert name in message


# ---------------------------------------------------------------------------------------------
# Hypothesis: finite inputs → finite outputs
# ---------------------------------------------------------------------------------------------


@st.composite
def estimator_case(draw):
    name = draw(st.sampled_from(ALL))
    needs = ESTIMATORS[name].needs
    group_size = draw(st.integers(2, 4)) if needs.groups else draw(st.integers(1, 4))
    n_groups = draw(st.integers(1, 3))
    n_tokens = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, n_tokens), min_size=n_groups * group_size, max_size=n_groups * group_size))
    seed = draw(st.integers(0, 2**31 - 1))
    gamma = draw(st.floats(0.0, 1.0))
    lam = draw(st.floats(0.0, 1.0))
    n_step = draw(st.integers(1, 8))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    return name, group_size, n_tokens, lengths, seed, gamma, lam, n_step, scale


@settings(max_examples=50, deadline=None)
@given(estimator_case())
def test_finite_inputs_give_finite_outputs(case) -> None:
    name, group_size, n_tokens, lengths, seed, gamma, lam, n_step, scale = case
    gen = torch.Generator().manual_seed(seed)
    x = make_input(name, gen, lengths, n_tokens, group_size, gamma=gamma, lam=lam, n_step=n_step)
    x = EstimatorInput(
        token_rewards=x.token_rewards * scale, response_mask=x.response_mask, group_size=group_size,
        values=None if x.values is None else x.values * scale,
        baseline_scores=None if x.baseline_scores is None else x.baseline_scores * scale,
        gamma=gamma, lam=lam, n_step=n_step,
    )
    out = ESTIMATORS[name].fn(x)
    assert out.advantages.shape == x.response_mask.shape
    assert torch.isfinite(out.advantages).all()
    assert (out.advantages[~x.response_mask] == 0).all()
    if out.returns is not None:
        assert torch.isfinite(out.returns).all()
    assert all(math.isfinite(v) for v in out.stats.values())


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=6), st.integers(0, 2**31 - 1))
def test_grpo_is_dr_grpo_over_std_and_rloo_is_scaled_dr_grpo(scores, seed) -> None:
    # One group of G: rloo = G/(G−1)·(R − mean) (algebra: R − (ΣR − R)/(G−1) = (G·R − ΣR)/(G−1));
    # grpo = (R − mean)/(std + 1e-6).
    g = len(scores)
    x = EstimatorInput(token_rewards=t(scores)[:, None], response_mask=m([[True]] * g), group_size=g)
    dr = ESTIMATORS["dr_grpo"].fn(x).advantages
    std = torch.tensor(scores).std(correction=1)
    close(ESTIMATORS["grpo"].fn(x).advantages, (dr / (std + 1e-6)).tolist())
    close(ESTIMATORS["rloo"].fn(x).advantages, (dr * g / (g - 1)).tolist())
