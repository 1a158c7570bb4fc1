"""Sampling: inverse-CDF draws, per-row randomness, KV-cache decoding equal to a plain forward."""

from __future__ import annotations

import torch

from llmrl.config.schema import LoraConfig
from llmrl.step.generate import encode_prompts
from llmrl.engines.hf import generate, pick_tokens, row_uniforms
from llmrl.models.stack import PolicyStack, layout, token_logprobs
from llmrl.models.tokenizer import build_char_tokenizer

from tests.conftest import make_tiny_model


def test_inverse_cdf_picks_the_token_whose_interval_holds_u() -> None:
    # probs [0.5, 0.3, 0.2]: cdf [0.5, 0.8, 1.0]; u=0.1 → 0, u=0.6 → 1, u=0.95 → 2
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]] * 3))
    u = torch.tensor([0.1, 0.6, 0.95])
    assert pick_tokens(logits, 1.0, 1.0, u).tolist() == [0, 1, 2]
    # top-p 0.6 keeps {0, 1} (0.5 < 0.6, then 0.8 covers it): renormalised cdf [0.625, 1.0]
    assert pick_tokens(logits, 1.0, 0.6, torch.tensor([0.6, 0.7, 0.99])).tolist() == [0, 1, 1]
    assert pick_tokens(logits, 1.0, 1.0, None).tolist() == [0, 0, 0]
    # without a nucleus the cdf runs in vocabulary order: probs [0.2, 0.5, 0.3] → cdf [0.2, 0.7, 1.0]
    unsorted = torch.log(torch.tensor([[0.2, 0.5, 0.3]] * 4))
    assert pick_tokens(unsorted, 1.0, 1.0, torch.tensor([0.1, 0.3, 0.69, 0.75])).tolist() == [0, 1, 1, 2]
    # a nucleus sorts first: top-p 0.9 keeps all three, sorted [0.5, 0.3, 0.2] → cdf [0.5, 0.8, 1.0]
    assert pick_tokens(unsorted, 1.0, 0.9, torch.tensor([0.1, 0.3, 0.69, 0.85])).tolist() == [1, 1, 2, 0]


def test_sampling_frequencies_follow_the_tempered_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    counts = torch.bincount(pick_tokens(logits, 1.0, 1.0, u), minlength=3).double() / 20000
    torch.testing.assert_close(counts, torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), atol=0.015, rtol=0)
    # temperature 2: p ∝ sqrt(p) = [0.8367, 0.4472, 0.3162] / 1.6001
    hot = torch.bincount(pick_tokens(logits, 2.0, 1.0, u), minlength=3).double() / 20000
    torch.testing.assert_close(hot, torch.tensor([0.5229, 0.2795, 0.1976], dtype=torch.float64), atol=0.015, rtol=0)


def test_row_randomness_depends_only_on_its_own_key() -> None:
    a = row_uniforms(3, 5, torch.tensor([10, 11, 12]), torch.tensor([0, 0, 1]), 4)
    b = row_uniforms(3, 5, torch.tensor([12, 10]), torch.tensor([1, 0]), 4)
    torch.testing.assert_close(a[[2, 0]], b, atol=0, rtol=0)
    c = row_uniforms(3, 6, torch.tensor([10]), torch.tensor([0]), 4)
    assert not torch.equal(a[0], c[0])


def test_kv_cache_generation_matches_full_forward_and_stops_at_eos() -> None:
    tok = build_char_tokenizer()
    stack = PolicyStack(make_tiny_model(), LoraConfig(r=4), with_critic=False)
    ids, mask = encode_prompts(tok, ["37+85=", "1+2=", "9+9="], torch.device("cpu"))
    u = row_uniforms(0, 0, torch.arange(3), torch.zeros(3, dtype=torch.long), 8)
    with stack.use("actor"):
        gen = generate(stack, ids, mask, max_new_tokens=8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, uniforms=u)
        # greedy decoding with the cache equals step-by-step argmax of a full, cache-free forward
        greedy = generate(stack, ids, mask, max_new_tokens=6, eos_id=-1, pad_id=tok.pad_token_id)
        seq = ids.clone()
        for _ in range(6):
            attn = torch.ones_like(seq)
            attn[:, : ids.shape[1]] = mask.long()
            out = stack.lm(input_ids=seq, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0))
            seq = torch.cat([seq, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(greedy.response_ids, seq[:, ids.shape[1]:])
    # the mask is True up to and including the first EOS, padding after it
    for row, m in zip(gen.response_ids.tolist(), gen.response_mask.tolist()):
        if tok.eos_token_id in row:
            cut = row.index(tok.eos_token_id) + 1
            assert m == [True] * cut + [False] * (len(row) - cut)
            assert all(t == tok.pad_token_id for t in row[cut:])
        else:
            assert all(m)


def test_a_row_samples_the_same_alone_or_in_a_batch() -> None:
    tok = build_char_tokenizer()
    stack = PolicyStack(make_tiny_model(), LoraConfig(r=4), with_critic=False)
    prompts = ["37+85=", "1+2=", "99+99="]
    ids, mask = encode_prompts(tok, prompts, torch.device("cpu"))
    u = row_uniforms(1, 2, torch.arange(3), torch.zeros(3, dtype=torch.long), 5)
    with stack.use("actor"):
        full = generate(stack, ids, mask, max_new_tokens=5, eos_id=tok.eos_token_id, pad_id=0, uniforms=u)
        ids1, mask1 = encode_prompts(tok, prompts[1:2], torch.device("cpu"))
        alone = generate(stack, ids1, mask1, max_new_tokens=5, eos_id=tok.eos_token_id, pad_id=0, uniforms=u[1:2])
    n = alone.response_ids.shape[1]
    assert torch.equal(full.response_ids[1, :n], alone.response_ids[0])
    # and its log-probs through the training forward agree whatever the padding
    seq_full = layout(ids, mask, full.response_ids, full.response_mask)
    seq_one = layout(ids1, mask1, alone.response_ids, alone.response_mask)
    with torch.no_grad():
        lp_full = token_logprobs(stack.response_logits(seq_full, 1.0), full.response_ids)[1, :n]
        lp_one = token_logprobs(stack.response_logits(seq_one, 1.0), alone.response_ids)[0]
    keep = alone.response_mask[0]
    torch.testing.assert_close(lp_full[keep], lp_one[keep], atol=1e-5, rtol=0)
