"""The shared opening (models/prefix.py, `stack.opening`) together with what changes the forward around
it: transformers' eager attention (`model.attention: eager`), LoRA dropout > 0 (`lora.dropout`) and
length groups (`model.length_buckets`), all at once on a random Qwen2.

Every no-grad forward, and a gradient forward with dropout off, gives the plain forward's log π,
values and gradients (dropout is the identity outside the update's `stack.dropout_active()`). With
dropout on, the update's gradient forward runs every row's prompt itself, in its length group (an
opening run once would give all rows one dropout mask, where each row draws its own), and its
dropout is real."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch import nn
from transformers.models.qwen2 import modeling_qwen2

from llmrl.config.schema import LoraConfig
from llmrl.models.attention import set_attention
from llmrl.models.buckets import extents, plan
from llmrl.models.stack import PolicyStack, layout

from tests.qwen2_tiny import make_qwen2

OPENING = [40, 41, 42, 43, 44, 45]  # a "system message" of 6 tokens before every prompt
OWN = [[7, 8, 9], [10], [5, 6], [13, 14, 15, 16], [20, 21, 22, 23], [24]]  # each prompt's own tokens
RESPONSE = [2, 2, 5, 5, 9, 9]  # response lengths: three pairs of like length, prompts of 9 7, 8 10, 10 7
CALL_COST = 3.0
# At a call cost of 3 positions the groups are the three pairs: 2·(9+2) + 2·(10+5) + 2·(10+9) + 3·3 = 99
# positions against one group's 6·(10+9) + 3 = 117 and two groups' 104; in each pair the 6-token opening
# saves 6·(2−1) = 6 > 3 positions, so each group runs it once: the opening for 1 row, then the pair's
# own 2 rows, where the shorter prompt's own copy of the opening's last tokens is hidden.


def _stack(dtype: torch.dtype) -> PolicyStack:
    """Actor and critic (LoRA r=4, dropout 0.5, every linear layer) on `make_qwen2` with eager attention and
    length groups; LoRA B and the value head ~ N(0, 0.2²) (seed 1) so that adapters and values count."""
    model = make_qwen2(dtype=dtype)
    assert set_attention(model, "eager") == "eager" and model.config._attn_implementation == "eager"
    stack = PolicyStack(model, LoraConfig(r=4, alpha=8.0, dropout=0.5), with_critic=True, length_buckets=True)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in stack.peft.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)
        assert stack.value_head is not None
        stack.value_head.weight.normal_(std=0.2)
    drops = [m for n, m in stack.named_modules() if isinstance(m, nn.Dropout) and "lora_dropout" in n]
    assert len(drops) == 2 * 2 * 7 and all(d.p == 0.5 and not d.training for d in drops)  # real, and off
    return stack


def _batch() -> tuple[Any, torch.Tensor, torch.Tensor]:
    """6 rows: the opening then each row's own tokens (left-padded), random responses of RESPONSE tokens."""
    rows = [OPENING + own for own in OWN]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    t = max(RESPONSE)
    resp = torch.randint(3, 4096, (len(rows), t), generator=torch.Generator().manual_seed(2))
    resp_mask = torch.arange(t)[None] < torch.tensor(RESPONSE)[:, None]
    return layout(ids, mask, resp, resp_mask), resp, resp_mask


def _run(stack: PolicyStack, shared: bool, grad: bool, dropout: bool = False) -> tuple[list[torch.Tensor], dict]:
    """log π (actor), V (critic), log π_ref and, with `grad`, the gradients of Σ_masked (w log π + (1−w) V):
    `shared` with length groups and the opening (CALL_COST), else the plain forward of the whole batch."""
    stack.length_buckets, stack.call_cost = shared, CALL_COST if shared else 1e9
    seq, resp, mask = _batch()
    stack.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad), stack.dropout_active() if dropout else nullcontext():
        lp, _ = stack.response_stats(seq, resp, mask, 0.7)
        with stack.use("critic"):
            v = stack.values(seq)
    with stack.use("reference"), torch.no_grad():
        ref, _ = stack.response_stats(seq, resp, mask, 0.7)
    grads = {}
    if grad:
        w = torch.linspace(-1.0, 1.0, resp.numel(), dtype=lp.dtype).reshape(resp.shape)
        torch.where(mask, w * lp + (1 - w) * v.to(lp.dtype), torch.zeros_like(lp)).sum().backward()
        grads = {n: p.grad.clone() for n, p in stack.named_parameters() if p.grad is not None}
    return [torch.where(mask, x, 0).detach() for x in (lp, v, ref)], grads


def _calls(stack: PolicyStack, monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[int, int]], list[int]]:
    """The (rows, positions) of every decoder call, and a counter of eager attention calls."""
    shapes: list[tuple[int, int]] = []
    stack.lm.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    eager, original = [0], modeling_qwen2.eager_attention_forward
    monkeypatch.setattr(modeling_qwen2, "eager_attention_forward",
                        lambda *a, **k: (eager.__setitem__(0, eager[0] + 1), original(*a, **k))[1])
    return shapes, eager


def test_eager_attention_dropout_and_groups_with_the_opening_give_the_plain_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    # the opening's keys and values are the same numbers for every row, the trimmed columns padding no
    # row attends to, and dropout is the identity outside the update: each row's numbers are the plain
    # forward's up to float32 rounding of other shapes (log π of size ~10: ~1e-6; gradients summed over
    # 32 tokens ~1e-5). float32, not the float64 other exactness tests use: eager attention takes its
    # softmax in float32, where float64's mask value −1.8e308 is −inf, so a left-padded row's padding
    # positions turn NaN in the plain forward, and 0 · NaN carries that into every row of the batch
    atol = 2e-5
    stack = _stack(torch.float32)
    seq, _, _ = _batch()
    groups = plan(*extents(seq.attention, seq.prompt_len), call_cost=CALL_COST)
    assert [g.rows.tolist() for g in groups] == [[0, 1], [2, 3], [4, 5]]
    shapes, eager = _calls(stack, monkeypatch)
    plain, _ = _run(stack, shared=False, grad=False)
    assert shapes == [(6, 10 + 9)] * 3  # actor, critic, reference: one plain call each
    shapes.clear()
    no_grad, _ = _run(stack, shared=True, grad=False)
    one = [(1, 6), (2, 3 + 2), (1, 6), (2, 4 + 5), (1, 6), (2, 4 + 9)]  # per group: the opening, then the rest
    assert shapes == one * 3 and eager[0] == 2 * (3 + 6 * 3)  # 2 layers, every call eager
    for got, want in zip(no_grad, plain):
        torch.testing.assert_close(got, want, atol=atol, rtol=0)
    assert float((plain[0] - plain[2]).abs().max()) > 1e-2, "actor equals reference: the check could not fail"
    assert float(plain[1].abs().max()) > 1e-2, "V ≡ 0: the check could not fail"

    # a gradient forward with dropout off (an update's forward at lora.dropout 0 takes the same path)
    plain, plain_grads = _run(stack, shared=False, grad=True)
    shapes.clear()
    shared, grads = _run(stack, shared=True, grad=True)
    assert shapes == one * 3
    for got, want in zip(shared, plain):
        torch.testing.assert_close(got, want, atol=atol, rtol=0)
    assert grads.keys() == plain_grads.keys() and any("value_head" in n for n in grads)
    for name in grads:  # the rows' copies of an opening position add up before the float32 RMS norms
        scale = float(plain_grads[name].abs().max())
        assert scale > 0, name
        torch.testing.assert_close(grads[name], plain_grads[name], atol=max(atol, 1e-6 * scale), rtol=0, msg=name)


def test_the_updates_gradient_forward_runs_with_dropout_on(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = _stack(torch.float32)
    off, off_grads = _run(stack, shared=True, grad=True)
    shapes, _ = _calls(stack, monkeypatch)
    torch.manual_seed(0)
    on, grads = _run(stack, shared=True, grad=True, dropout=True)
    groups = [(2, 9 + 2), (2, 10 + 5), (2, 10 + 9)]  # each pair's rows whole, no opening call
    opened = [(1, 6), (2, 3 + 2), (1, 6), (2, 4 + 5), (1, 6), (2, 4 + 9)]
    assert shapes == groups * 2 + opened  # actor and critic with dropout on; the reference (no grad) after
    torch.manual_seed(1)
    again, _ = _run(stack, shared=True, grad=True, dropout=True)
    assert all(bool(torch.isfinite(x).all()) for x in on)
    assert grads.keys() == off_grads.keys()
    assert all(bool(torch.isfinite(g).all()) and float(g.abs().max()) > 0 for g in grads.values())
    # dropout 0.5 on adapters of size ~0.2·√r moves log π and V by far more than rounding: the masks are real
    # and drawn anew each forward
    for i in (0, 1):
        assert float((on[i] - off[i]).abs().max()) > 1e-3 and float((on[i] - again[i]).abs().max()) > 1e-3
    assert not any(m.training for m in stack.modules())  # every dropout module off again after the update
