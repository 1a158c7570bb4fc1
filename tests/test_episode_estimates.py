"""Masks through the estimate and the update for episodes: GAE over the model's tokens only (an
environment span is skipped), group estimators take the episode reward, and the environment's
tokens carry no loss, advantage, KL or entropy while the model still reads them."""

from __future__ import annotations

from dataclasses import replace

import torch

from llmrl.config import load_config
from llmrl.estimators import EstimatorInput, get_estimator
from llmrl.estimators.episodes import over_model_tokens, pack, packing_order, unpack
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer, stop_token_ids
from llmrl.engines.hf import HFEngine
from llmrl.config.schema import RolloutConfig
from llmrl.step.episodes import generate_episodes
from llmrl.step.estimate import estimate, shape_rewards
from llmrl.step.forward import forward
from llmrl.step.records import StepPlan, Scores, TrainRows
from llmrl.step.update import make_optimizers, update

from tests.conftest import make_tiny_model
from tests.helpers import close, m, t
from tests.test_episodes import Answer
from llmrl.envs import EnvSpec

GAMMA, LAM = 0.9, 0.8


def test_gae_skips_the_environment_span() -> None:
    # row 0: model tokens at 0, 1 and 4; the environment's at 2, 3 (junk values and rewards there
    # must be ignored); 5 is padding. γ = 0.9, λ = 0.8, γλ = 0.72. In model-token order a, b, c:
    #   δ_c = r_c + γ·0 − V_c        = 1 + 0 − 0.2          = 0.8     (c ends the episode: V = 0 after it)
    #   δ_b = r_b + γ·V_c − V_b      = 0 + 0.9·0.2 − 0.4    = −0.22   (V_c read across the env span)
    #   δ_a = r_a + γ·V_b − V_a      = 0 + 0.9·0.4 − 0.5    = −0.14
    #   A_c = 0.8;  A_b = −0.22 + 0.72·0.8 = 0.356;  A_a = −0.14 + 0.72·0.356 = 0.11632
    #   returns = A + V: 1.0, 0.756, 0.61632
    # row 1: one turn, tokens 0..2, V = [0.1, 0.3, 0.6], r = [0, 0, 1]:
    #   δ_2 = 1 − 0.6 = 0.4; δ_1 = 0.9·0.6 − 0.3 = 0.24; δ_0 = 0.9·0.3 − 0.1 = 0.17
    #   A_2 = 0.4; A_1 = 0.24 + 0.72·0.4 = 0.528; A_0 = 0.17 + 0.72·0.528 = 0.55016
    mask = m([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0]])
    values = t([[0.5, 0.4, 9.0, 9.0, 0.2, 0.0], [0.1, 0.3, 0.6, 0.0, 0.0, 0.0]])
    rewards = t([[0.0, 0.0, 7.0, 7.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    x = EstimatorInput(rewards, mask, values=values, gamma=GAMMA, lam=LAM)
    out = over_model_tokens(get_estimator("gae").fn, x)
    close(out.advantages, [[0.11632, 0.356, 0, 0, 0.8, 0], [0.55016, 0.528, 0.4, 0, 0, 0]])
    close(out.returns, [[0.61632, 0.756, 0, 0, 1.0, 0], [0.65016, 0.828, 1.0, 0, 0, 0]])
    # per position instead, V after b would be the env token's (0 once masked): A_b = 0.9·0 − 0.4
    plain = get_estimator("gae").fn(replace(x, values=torch.where(mask, values, 0), token_rewards=torch.where(mask, rewards, 0)))
    close(plain.advantages[0, 1], -0.4)


def test_packing_is_the_identity_on_one_turn_rows() -> None:
    torch.manual_seed(0)
    lengths = torch.tensor([0, 1, 4, 7, 7, 3])
    mask = torch.arange(7)[None, :] < lengths[:, None]
    values = torch.where(mask, torch.randn(6, 7), 0)
    rewards = torch.where(mask, torch.randn(6, 7), 0)
    order = packing_order(mask)
    assert torch.equal(order, torch.arange(7).expand(6, 7))
    assert torch.equal(unpack(pack(values, order), order), values)
    for name in ("gae", "a2c", "reinforce", "grpo", "rloo"):
        x = EstimatorInput(rewards, mask, group_size=2, values=values, gamma=GAMMA, lam=LAM)
        fn = get_estimator(name).fn
        assert torch.equal(over_model_tokens(fn, x).advantages, fn(x).advantages), name


def test_group_estimators_take_the_episode_reward() -> None:
    # two episodes of one prompt (G = 2); the rewards −β·KL on model tokens and the score on the last:
    #   R_0 = −0.1 + 1 = 0.9 (env token at 1, 2);  R_1 = −0.2 − 0.1 + 0.5 = 0.2 (env token at 2)
    #   GRPO: mean 0.55, unbiased std |0.9 − 0.2| / √2 = 0.4949747; A = ±0.35 / (0.4949747 + 1e-6) = ±0.7071054
    mask = m([[1, 0, 0, 1], [1, 1, 0, 1]])
    rewards = t([[-0.1, 0.0, 0.0, 1.0], [-0.2, -0.1, 0.0, 0.5]])
    out = over_model_tokens(get_estimator("grpo").fn, EstimatorInput(rewards, mask, group_size=2))
    a = 0.7071054
    close(out.advantages, [[a, 0, 0, a], [-a, -a, 0, -a]])


def test_the_score_lands_on_the_episodes_last_model_token() -> None:
    # action masks with gaps: the last model token is at 4 (not Σ mask − 1 = 2) and at 3; an empty row → 0
    from llmrl.config.schema import KLConfig
    from llmrl.ops import ends_with_stop, last_token_index
    from llmrl.step.records import Forwards, Samples

    mask = m([[1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
    assert last_token_index(mask).tolist() == [4, 3, 0, 2]
    ids = torch.tensor([[5, 6, 9, 9, 2, 0], [2, 9, 9, 7, 0, 0], [0] * 6, [5, 5, 2, 0, 0, 0]])
    assert ends_with_stop(ids, mask, [2]).tolist() == [True, False, False, True]
    samples = Samples((), torch.zeros(4, 1, dtype=torch.long), torch.ones(4, 1, dtype=torch.bool), ids, mask, 1,
                      torch.arange(4), ("",) * 4, context_mask=mask | (ids == 9))
    r = shape_rewards(samples, Scores(t([1.0, 2.0, 3.0, 4.0])), Forwards(torch.float32), 0.0, KLConfig())
    close(r, [[0, 0, 0, 0, 1, 0], [0, 0, 0, 2, 0, 0], [0] * 6, [0, 0, 4, 0, 0, 0]])


def test_a_turns_own_reward_lands_on_that_turns_end_and_gae_discounts_it() -> None:
    # row 0: turn 1 = model tokens 0, 1, then the environment's tokens 2, 3, turn 2 = model token 4. The
    # environment gave 0.5 for each turn and the task 1.0 for the last: score = 1.0 + 0.5 + 0.5 = 2.0, of
    # which turn 1's 0.5 (early_rewards, at its last token 1) moves there → r = [0, 0.5, 0, 0, 1.5, 0].
    # row 1: no early reward: the score stays whole on its last token (nothing else changes).
    from llmrl.config.schema import KLConfig
    from llmrl.step.records import EpisodeLog, Forwards, Samples

    mask = m([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0]])
    context = m([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    early = t([[0, 0.5, 0, 0, 0, 0], [0] * 6])
    log = EpisodeLog(torch.tensor([2, 1]), torch.zeros(2), torch.zeros(2), t([1.0, 0.0]), torch.tensor([2, 0]), 0.0,
                     early)
    samples = Samples((), torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool),
                      torch.zeros(2, 6, dtype=torch.long), mask, 1, torch.arange(2), ("",) * 2, context_mask=context,
                      episodes=log)
    r = shape_rewards(samples, Scores(t([2.0, 3.0])), Forwards(torch.float32), 0.0, KLConfig())
    close(r, [[0, 0.5, 0, 0, 1.5, 0], [0, 0, 3.0, 0, 0, 0]])
    # GAE, γ = 0.9, λ = 1, V = 0 over the model's tokens a, b, c (0, 1, 4): A_t = Σ_k γ^k r_{t+k}
    #   A_c = 1.5;  A_b = 0.5 + 0.9·1.5 = 1.85;  A_a = 0 + 0.9·1.85 = 1.665
    # (were the 0.5 left in the score: A_c = 2.0, A_b = 1.8, A_a = 1.62)
    spec = get_estimator("gae")
    x = EstimatorInput(token_rewards=r, response_mask=mask, group_size=1, values=torch.zeros(2, 6), gamma=0.9, lam=1.0)
    out = over_model_tokens(spec.fn, x)
    close(out.advantages[0], [1.665, 1.85, 0, 0, 1.5, 0])


def _episode_batch():
    """One real batch of episodes on a random tiny model with a critic: (stack, samples, forwards, targets, config)."""
    config = load_config(overrides={"algo": "ppo", "update.minibatch_size": 8, "kl.beta": 0.05})
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model().to(torch.float64), config.lora, with_critic=True, share_prompts=False)
    engine = HFEngine(stack, stop_token_ids(tok, stack.lm), tok.pad_token_id)
    cfg = RolloutConfig(max_new_tokens=3, max_turns=3, num_generations=4)
    rows = [{"prompt": "12+3="}, {"prompt": "4+56="}]
    samples = generate_episodes(engine, tok, EnvSpec("answer", Answer), rows, torch.tensor([0, 1]), cfg=cfg, seed=3,
                                step=1, device=torch.device("cpu"), stop_ids=stop_token_ids(tok, stack.lm))
    plan = StepPlan(reference=True, critic=True, greedy=False)
    forwards = forward(stack, samples, plan, 1.0)
    scores = Scores(torch.linspace(0, 1, samples.n) + samples.episodes.env_reward)
    spec = get_estimator("gae")
    targets = estimate(spec, samples, scores, forwards, shape_rewards(samples, scores, forwards, 0.05, config.kl),
                       config.estimator)
    return stack, samples, forwards, targets, config


def _update(stack, rows, targets, config) -> tuple[dict[str, float], list[torch.Tensor]]:
    start = {n: p.detach().clone() for n, p in stack.named_parameters() if p.requires_grad or "lora" in n}
    result = update(stack, make_optimizers(stack, config.update), rows, targets, config.update, config.kl, 0.05, 1.0,
                    torch.Generator().manual_seed(7))
    after = [p.detach().clone() for n, p in stack.named_parameters() if n in start]
    with torch.no_grad():  # back to the start for the next call
        for n, p in stack.named_parameters():
            if n in start:
                p.copy_(start[n])
    return result.stats, after


def test_environment_tokens_carry_no_loss_but_are_read() -> None:
    stack, samples, forwards, targets, config = _episode_batch()
    env = samples.context_mask & ~samples.response_mask
    assert int(env.sum()) > 0
    for x in (targets.advantages, targets.returns, forwards.old_logprobs, forwards.ref_logprobs, forwards.values):
        assert not x[env].any()  # nothing is estimated on the environment's tokens
    rows = TrainRows.of(samples, forwards)
    assert rows.context_mask is samples.context_mask
    stats, weights = _update(stack, rows, targets, config)
    junk = lambda x: torch.where(env, torch.full_like(x, 5.0), x)  # noqa: E731
    dirty_rows = replace(rows, old_logprobs=junk(rows.old_logprobs), ref_logprobs=junk(rows.ref_logprobs),
                         values=junk(rows.values))
    dirty_targets = replace(targets, advantages=junk(targets.advantages), returns=junk(targets.returns))
    dirty_stats, dirty_weights = _update(stack, dirty_rows, dirty_targets, config)
    assert dirty_stats == stats  # loss, entropy, KL, value loss: the environment's tokens weigh nothing
    assert all(torch.equal(a, b) for a, b in zip(weights, dirty_weights))
    # ... but the model attends to them: other environment ids change what it computes
    other = replace(rows, response_ids=torch.where(env, torch.full_like(rows.response_ids, 7), rows.response_ids))
    other_stats, _ = _update(stack, other, targets, config)
    assert other_stats["entropy"] != stats["entropy"]
