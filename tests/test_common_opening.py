"""The prompts' common opening computed once (models/prefix.py, step 0): the same log π, values,
gradients and drawn tokens as the plain forward and prefill."""

from __future__ import annotations

import pytest
import torch

from llmrl.engines.hf import generate, row_uniforms
from llmrl.models.prefix import common_prefix, distinct_prompts
from llmrl.models.stack import PolicyStack, layout

from tests.qwen2_tiny import actor_critic_stack

OPENING = [40, 41, 42, 43, 44, 45]  # a "system message" of 6 tokens before every prompt
OWN = [[7, 8, 9], [5, 6], [11, 12, 13, 14], [9]]  # each prompt's own tokens: 3, 2, 4 and 1


def test_common_prefix_counts_the_shared_opening_and_leaves_every_row_a_token() -> None:
    ids = torch.tensor([[0, 0, 3, 4, 5, 6], [3, 4, 5, 7, 8, 9], [0, 3, 4, 5, 6, 1]])
    mask = ids != 0
    assert common_prefix(ids, mask) == 3  # 3 4 5, then 6 / 7 / 6
    # the shortest prompt (4 tokens: 3 4 5 6) keeps its last token: k ≤ 3 even when all 4 agree
    same = torch.tensor([[0, 3, 4, 5, 6], [3, 4, 5, 6, 9]])
    assert common_prefix(same, same != 0) == 3
    assert common_prefix(ids[:1], mask[:1]) == 0  # one row shares with nobody
    other = torch.tensor([[3, 4], [4, 4]])
    assert common_prefix(other, other != 0) == 0


def _stack(dtype: torch.dtype) -> PolicyStack:
    return actor_critic_stack(dtype)


def _prompts(repeat: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [OPENING + own for own in OWN for _ in range(repeat)]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    return ids, mask


def _batch(repeat: int = 1):
    ids, mask = _prompts(repeat)
    n, t = ids.shape[0], 6
    gen = torch.Generator().manual_seed(2)
    resp = torch.randint(3, 4096, (n, t), generator=gen)
    resp_mask = torch.arange(t)[None] < torch.randint(1, t + 1, (n, 1), generator=gen)
    return layout(ids, mask, resp, resp_mask), resp, resp_mask


def _run(stack: PolicyStack, opening: bool, repeat: int):
    stack.call_cost = 1.0 if opening else 1e9  # k · (rows − 1) against a call's cost
    seq, resp, mask = _batch(repeat)
    stack.zero_grad(set_to_none=True)
    lp, _ = stack.response_stats(seq, resp, mask, 0.7)
    with stack.use("critic"):
        v = stack.values(seq)
    with stack.use("reference"), torch.no_grad():
        ref, _ = stack.response_stats(seq, resp, mask, 0.7)
    w = torch.linspace(-1.0, 1.0, resp.numel(), dtype=lp.dtype).reshape(resp.shape)
    torch.where(mask, w * lp + (1 - w) * v.to(lp.dtype), torch.zeros_like(lp)).sum().backward()
    grads = {n: p.grad.clone() for n, p in stack.named_parameters() if p.grad is not None}
    return [torch.where(mask, x, 0).detach() for x in (lp, v, ref)], grads


@pytest.mark.parametrize("repeat", [1, 3])  # every prompt its own; 3 samples of each (distinct prompts shared too)
@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_the_opening_once_gives_the_plain_numbers(repeat: int, dtype: torch.dtype, atol: float) -> None:
    # the opening's keys and values are the same numbers for every row (causal attention, the same
    # positions 0..5), so each row's log π, V and gradients are the plain forward's up to the
    # rounding of other shapes: float64 ~1e-15 (1e-10 of margin), float32 ~1e-6 (gradients ~1e-5)
    stack = _stack(dtype)
    ids, mask = _prompts(repeat)
    assert stack.opening(ids, mask, distinct_prompts(ids, mask)) == 0  # at the model's own call cost
    stack.call_cost = 1.0
    assert stack.opening(ids, mask) == 6
    plain, plain_grads = _run(stack, False, repeat)
    shared, grads = _run(stack, True, repeat)
    for got, want in zip(shared, plain):
        torch.testing.assert_close(got, want, atol=atol, rtol=0)
    assert float((plain[0] - plain[2]).abs().max()) > 1e-2, "actor equals reference: the check could not fail"
    assert grads.keys() == plain_grads.keys() and any("lora" in n for n in grads)
    # gradients: the rows' copies of an opening position add up before, not after, the RMS norms,
    # which transformers computes in float32 even in a float64 model: float32 rounding of their scale
    for name in grads:
        scale = float(plain_grads[name].abs().max())
        assert scale > 0, name
        torch.testing.assert_close(grads[name], plain_grads[name], atol=max(atol, 1e-6 * scale), rtol=0, msg=name)


def test_generation_from_the_shared_opening_draws_the_same_tokens() -> None:
    stack = _stack(torch.float32)
    ids, mask = _prompts(repeat=2)
    n = ids.shape[0]
    u = row_uniforms(0, 3, torch.arange(n) // 2, torch.arange(n) % 2, 8)
    runs = {}
    for opening in (False, True):
        stack.call_cost = 1.0 if opening else 1e9
        with stack.use("actor"):
            runs[opening] = generate(stack, ids, mask, max_new_tokens=8, eos_id=2, pad_id=0, uniforms=u, logprobs=True)
    a, b = runs[False], runs[True]
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    # float32 decoding log-probs: the same math on other shapes, ~1e-6 at magnitudes ~8
    torch.testing.assert_close(b.logprobs, a.logprobs, atol=2e-5, rtol=0)
    assert len({tuple(r) for r in a.response_ids.tolist()}) > 2, "the rows drew alike: a weak check"
