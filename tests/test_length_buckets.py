"""Length buckets (models/buckets.py): the grouping that minimises the positions run, and the same
log π, entropy, values and gradients as the whole padded batch."""

from __future__ import annotations

import pytest
import torch

from llmrl.models.buckets import MIN_CALL_POSITIONS, call_positions, extents, model_call_positions, plan
from llmrl.models.stack import PolicyStack, layout

from tests.qwen2_tiny import actor_critic_stack, make_qwen2


def test_plan_cuts_where_the_positions_saved_exceed_a_call() -> None:
    # 8 prompts of 40, responses 8 9 10 10 11 12 14 32, C = 64 positions a call:
    #   one group            8·(40+32) + 64                       = 640
    #   {8..14} {32}          7·(40+14) + 64 + 1·(40+32) + 64     = 578  ← least
    #   {8,9} {10..14} {32}   2·49 + 5·54 + 72 + 3·64             = 632
    groups = plan([40] * 8, [8, 9, 10, 10, 11, 12, 14, 32], call_cost=64)
    assert [(g.rows.tolist(), g.prompt, g.response) for g in groups] == [(list(range(7)), 40, 14), ([7], 40, 32)]
    # at C = 200 one group (640) beats two (578 − 64 + 200 = 714)
    assert len(plan([40] * 8, [8, 9, 10, 10, 11, 12, 14, 32], call_cost=200)) == 1
    # rows keep the batch's order inside a group; the longest prompt of a group sets its p_b:
    # responses 3 1 3 1 with prompts 2 9 2 9, C = 0: {rows 1, 3: 9+1} and {rows 0, 2: 2+3}
    groups = plan([2, 9, 2, 9], [3, 1, 3, 1], call_cost=0)
    assert [(g.rows.tolist(), g.prompt, g.response) for g in groups] == [([1, 3], 9, 1), ([0, 2], 2, 3)]


def test_a_call_costs_positions_by_the_models_size() -> None:
    # Qwen2.5-0.5B's body: 24 · 3e-4 s / (2 · 358e6 / 5e10 FLOP/s) ≈ 0.50 positions → the floor, 64
    assert call_positions(24, 358_000_000, "cpu") == MIN_CALL_POSITIONS
    # on a GPU: 24 · 3e-4 / (7.16e8 / 1e14) ≈ 1006 positions
    assert call_positions(24, 358_000_000, "cuda") == pytest.approx(24 * 3e-4 * 1e14 / 7.16e8, abs=1e-6)
    # the test model, 2 layers of 128: per layer q 128² + 128, k and v 128·64 + 64 (2 heads of 32),
    # o 128², MLP 3 · 128 · 256, two norms 2 · 128 = 147,968; with the final norm 296,064 body parameters
    # → 2 · 3e-4 · 5e10 / (2 · 296,064) ≈ 50.7 positions on a CPU: the floor again
    model = make_qwen2()
    assert sum(p.numel() for p in model.model.parameters()) - model.model.embed_tokens.weight.numel() == 296_064
    assert model_call_positions(model) == MIN_CALL_POSITIONS
    assert call_positions(2, 296_064, "cuda") == pytest.approx(3e10 / 296_064, abs=1e-6)  # ≈ 101,330


def _stack(dtype: torch.dtype) -> PolicyStack:
    return actor_critic_stack(dtype, length_buckets=True)


def _batch():
    """5 rows: prompts of 4, 2, 3, 1 and 4 tokens (left-padded), responses of 9, 2, 1, 3 and 2 tokens
    (right-padded); row 4's response attends 3 more positions than it trains on (an episode's
    environment tokens: attended, masked out of the loss)."""
    prompts = torch.tensor([[7, 8, 9, 17], [0, 0, 5, 6], [0, 9, 10, 11], [0, 0, 0, 12], [3, 4, 5, 6]])
    resp = torch.zeros(5, 9, dtype=torch.long)
    resp[0] = torch.tensor([30, 400, 9, 2000, 2, 77, 78, 79, 80])
    resp[1, :2] = torch.tensor([4095, 2])
    resp[2, :1] = torch.tensor([31])
    resp[3, :3] = torch.tensor([40, 41, 42])
    resp[4, :5] = torch.tensor([50, 51, 52, 53, 54])
    train = torch.zeros(5, 9, dtype=torch.bool)
    for row, n in enumerate([9, 2, 1, 3, 2]):
        train[row, :n] = True
    context = train.clone()
    context[4, :5] = True
    return layout(prompts, prompts != 0, resp, context), resp, train


def _run(stack: PolicyStack, buckets: float | None):
    """log π, H, V and the gradients of Σ_masked (a log π + b H + c V) with fixed weights."""
    stack.length_buckets, stack.call_cost = buckets is not None, 64.0 if buckets is None else buckets
    seq, resp, mask = _batch()
    stack.zero_grad(set_to_none=True)
    lp, ent = stack.response_stats(seq, resp, mask, 0.7, entropy="trained")
    with stack.use("critic"):
        v = stack.values(seq)
    w = [torch.linspace(lo, hi, resp.numel(), dtype=lp.dtype).reshape(resp.shape)
         for lo, hi in ((-1.0, 1.0), (0.5, -0.3), (0.2, 0.9))]
    torch.where(mask, w[0] * lp + w[1] * ent + w[2] * v.to(lp.dtype), torch.zeros_like(lp)).sum().backward()
    grads = {n: p.grad.clone() for n, p in stack.named_parameters() if p.grad is not None}
    return [torch.where(mask, x, 0).detach() for x in (lp, ent, v)], grads


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_groups_give_the_padded_batch_numbers(dtype: torch.dtype, atol: float) -> None:
    # the trimmed columns are padding no row attends to, so each row's numbers are the padded batch's
    # up to the rounding of products of other shapes: float64 ~1e-15 (1e-10: ~1e5 ulps of margin);
    # float32: log π of magnitude ~10 carries ~1e-6, gradients summed over 17 tokens ~1e-5
    stack = _stack(dtype)
    whole, whole_grads = _run(stack, None)
    seq, _, _ = _batch()
    assert len(plan(*extents(seq.attention, seq.prompt_len), call_cost=0)) == 5  # every distinct length its own group
    for cost in (0.0, 3.0):
        parts, grads = _run(stack, cost)
        for got, want in zip(parts, whole):
            torch.testing.assert_close(got, want, atol=atol, rtol=0)
        assert grads.keys() == whole_grads.keys() and any("value_head" in n for n in grads)
        for name in grads:
            torch.testing.assert_close(grads[name], whole_grads[name], atol=atol, rtol=0, msg=name)


def test_one_group_runs_the_batch_as_laid_out() -> None:
    stack = _stack(torch.float32)
    seq, resp, mask = _batch()
    with torch.no_grad():
        stack.length_buckets = False
        plain, _ = stack.response_stats(seq, resp, mask, 1.0)
        stack.length_buckets, stack.call_cost = True, 10.0**9  # one group is best: the same call, the same bits
        one, _ = stack.response_stats(seq, resp, mask, 1.0)
    assert torch.equal(plain, one)
