"""Prompt-prefix sharing (models/prefix.py): each distinct prompt once, same numbers as a plain forward."""

from __future__ import annotations

import torch

from llmrl.config.schema import LoraConfig
from llmrl.step.generate import encode_prompts
from llmrl.engines.hf import generate, row_uniforms
from llmrl.models.prefix import distinct_prompts
from llmrl.models.stack import PolicyStack, layout, token_logprobs
from llmrl.models.tokenizer import build_char_tokenizer

from tests.conftest import make_tiny_model

PROMPTS = ["37+85=", "1+2="]  # different lengths: the short one is left-padded
G = 4


def _stack(with_critic: bool = False) -> PolicyStack:
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model().to(torch.float64), LoraConfig(r=4), with_critic=with_critic)
    for role in stack.trainable_roles():  # non-zero adapters, so the actor differs from the base
        for p in stack.parameters_of(role):
            torch.nn.init.normal_(p, std=0.1)
    return stack


def _batch(g: int = G) -> tuple:
    """G samples of each prompt, grouped, with right-padded responses of different lengths."""
    tok = build_char_tokenizer()
    ids, mask = encode_prompts(tok, [p for p in PROMPTS for _ in range(g)], torch.device("cpu"))
    n, t = ids.shape[0], 7
    gen = torch.Generator().manual_seed(1)
    resp = torch.randint(3, tok.vocab_size, (n, t), generator=gen)
    resp_mask = torch.arange(t)[None, :] < torch.randint(1, t + 1, (n, 1), generator=gen)
    return ids, mask, torch.where(resp_mask, resp, tok.pad_token_id), resp_mask


def test_distinct_prompts_groups_rows_and_declines_when_saving_little() -> None:
    ids = torch.tensor([[5, 6], [7, 8], [5, 6], [7, 8], [5, 6], [7, 8]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    groups = distinct_prompts(ids, mask)
    assert groups is not None and len(groups.first) == 2
    assert torch.equal(ids[groups.first][groups.inverse], ids)
    assert torch.equal(groups.first.sort().values, torch.tensor([0, 1]))  # the first row of each prompt
    # same tokens under a different padding mask are different prompts
    masked = mask.clone()
    masked[0, 0] = False
    assert len(distinct_prompts(ids, masked).first) == 3
    # 3 distinct of 4 rows would save a quarter: not worth a second forward call
    three = torch.tensor([[5, 6], [7, 8], [9, 9], [5, 6]])
    assert distinct_prompts(three, torch.ones_like(three, dtype=torch.bool)) is None
    assert distinct_prompts(ids[:1], mask[:1]) is None


def test_shared_forward_equals_the_plain_forward_values_and_gradients() -> None:
    stack = _stack(with_critic=True)
    ids, mask, resp, resp_mask = _batch()
    seq = layout(ids, mask, resp, resp_mask)
    assert distinct_prompts(ids, mask) is not None
    out = {}
    for share in (False, True):
        stack.share_prompts = share
        stack.zero_grad(set_to_none=True)
        with stack.use("actor"):
            lp = token_logprobs(stack.response_logits(seq, 0.7), resp)
            (lp * resp_mask).sum().backward()
        with stack.use("critic"):
            v = stack.values(seq)
            (v * resp_mask).pow(2).sum().backward()
        with stack.use("reference"), torch.no_grad():
            ref = token_logprobs(stack.response_logits(seq, 0.7), resp)
        grads = {n: p.grad.clone() for n, p in stack.named_parameters() if p.grad is not None}
        out[share] = (lp.detach(), v.detach(), ref, grads)
    (lp0, v0, ref0, g0), (lp1, v1, ref1, g1) = out[False], out[True]
    # forwards: rows are computed by the same float64 operations, only batched differently
    torch.testing.assert_close(lp1, lp0, atol=1e-12, rtol=0)
    torch.testing.assert_close(v1, v0, atol=1e-12, rtol=0)
    torch.testing.assert_close(ref1, ref0, atol=1e-12, rtol=0)
    assert float((lp0 - ref0).abs().max()) > 1e-2, "actor equals reference: the check could not fail"
    # gradients: the G copies of a prompt position add up before, not after, the RMS norms, which
    # transformers computes in float32 even in a float64 model: agreement to float32 rounding
    assert g0.keys() == g1.keys() and len(g0) > 0
    for name in g0:
        scale = float(g0[name].abs().max())
        assert scale > 0, name
        torch.testing.assert_close(g1[name], g0[name], atol=1e-6 * scale, rtol=0)


def test_generation_with_shared_prefill_draws_the_same_tokens() -> None:
    stack = _stack()
    tok = build_char_tokenizer()
    ids, mask, _, _ = _batch()
    n = ids.shape[0]
    u = row_uniforms(0, 3, torch.arange(n) // G, torch.arange(n) % G, 10)
    runs = {}
    for share in (False, True):
        stack.share_prompts = share
        with stack.use("actor"):
            sampled = generate(stack, ids, mask, max_new_tokens=10, eos_id=tok.eos_token_id,
                               pad_id=tok.pad_token_id, uniforms=u)
            greedy = generate(stack, ids, mask, max_new_tokens=10, eos_id=tok.eos_token_id,
                              pad_id=tok.pad_token_id)
        runs[share] = (sampled, greedy)
    for a, b in zip(runs[False], runs[True]):
        assert torch.equal(a.response_ids, b.response_ids)
        assert torch.equal(a.response_mask, b.response_mask)
    sampled = runs[True][0].response_ids
    assert len({tuple(r) for r in sampled[:G].tolist()}) > 1, "a group's samples are all equal: weak check"


def test_the_cache_keyword_follows_the_model_signature() -> None:
    """transformers 5 names it `cache`; older releases `past_key_values`, and a wrong name would be
    swallowed by **kwargs: decoding would silently run without its context."""
    from llmrl.models.prefix import with_cache

    model = make_tiny_model()
    assert with_cache(model, "c") == {"cache": "c", "use_cache": True}

    class Older(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, **kwargs):  # noqa: ANN001, ANN003
            return past_key_values

    assert with_cache(Older(), "c") == {"past_key_values": "c", "use_cache": True}
