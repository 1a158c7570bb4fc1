"""Finished rows leave the decoding batch (engines/hf_decode.py): the same tokens, masks and log μ as
decoding each row alone, fewer rows through the model, the cache of a continuing episode intact."""

from __future__ import annotations

import torch

from llmrl.config.schema import LoraConfig
from llmrl.engines.hf import HFEngine, generate, row_uniforms
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer, stop_token_ids
from llmrl.parallel.distributed import DistContext
from llmrl.step.generate import encode_prompts

from tests.conftest import make_tiny_model
from tests.test_hf_turns import _episodes, _float32_stack

PROMPTS = ["12+3=", "4+56=", "7*8=", "99-1="]
G, T = 4, 12


def _stack64() -> PolicyStack:
    """The tiny model in float64 with a non-zero actor adapter: rounding far below the checks' tolerance."""
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model().to(torch.float64), LoraConfig(r=4), with_critic=False)
    for p in stack.parameters_of("actor"):
        torch.nn.init.normal_(p, std=0.1)
    return stack


def _stops() -> list[int]:
    """EOS and the digits 0-4: a random model's rows then stop after 1 to T tokens, at different steps."""
    tok = build_char_tokenizer()
    return stop_token_ids(tok, make_tiny_model()) + tok.convert_tokens_to_ids(list("01234"))


def _rows_fed(stack: PolicyStack, run) -> tuple[object, list[int]]:
    """run()'s result and the rows of every one-position forward (the decoding steps)."""
    fed: list[int] = []
    hook = stack.lm.model.embed_tokens.register_forward_hook(
        lambda m, args, out: fed.append(args[0].shape[0]) if args[0].shape[1] == 1 else None)
    try:
        return run(), fed
    finally:
        hook.remove()


def test_rows_that_stop_at_different_steps_draw_what_each_draws_alone() -> None:
    stack, tok, stops = _stack64(), build_char_tokenizer(), _stops()
    ids, mask = encode_prompts(tok, [p for p in PROMPTS for _ in range(G)], torch.device("cpu"))
    n = ids.shape[0]
    u = row_uniforms(3, 1, torch.arange(n) // G, torch.arange(n) % G, T)

    def batch(drop: bool):
        with stack.use("actor"):
            return generate(stack, ids, mask, max_new_tokens=T, eos_id=stops, pad_id=tok.pad_token_id, uniforms=u,
                            logprobs=True, drop_finished=drop)

    dropped, fed = _rows_fed(stack, lambda: batch(True))
    kept, fed_all = _rows_fed(stack, lambda: batch(False))
    lengths = dropped.response_mask.sum(-1)
    assert len(set(lengths.tolist())) >= 4 and int(lengths.min()) < int(lengths.max()), "rows must stop apart"
    # each decoding step feeds exactly the rows still writing: those whose answer is longer than t + 1 tokens
    width = dropped.response_ids.shape[1]
    assert fed == [int((lengths > t + 1).sum()) for t in range(width - 1)]
    assert fed_all == [n] * (width - 1) and sum(fed) < sum(fed_all)
    assert torch.equal(dropped.response_ids, kept.response_ids) and torch.equal(dropped.response_mask, kept.response_mask)
    # float64 products: the same sums over other batch shapes differ by ~1e-15 relative at |log μ| ≤ ~10
    torch.testing.assert_close(dropped.logprobs, kept.logprobs, atol=1e-10, rtol=0)
    for r in range(n):  # each row decoded alone, its prompt unpadded, with its own uniforms
        row_ids = ids[r, mask[r]].unsqueeze(0)
        with stack.use("actor"):
            alone = generate(stack, row_ids, torch.ones_like(row_ids, dtype=torch.bool), max_new_tokens=T,
                             eos_id=stops, pad_id=tok.pad_token_id, uniforms=u[r : r + 1], logprobs=True)
        k = alone.response_ids.shape[1]
        assert torch.equal(alone.response_ids[0], dropped.response_ids[r, :k]), r
        assert torch.equal(alone.response_mask[0], dropped.response_mask[r, :k]) and not dropped.response_mask[r, k:].any()
        torch.testing.assert_close(alone.logprobs[0], dropped.logprobs[r, :k], atol=1e-10, rtol=0)
    assert (dropped.logprobs[~dropped.response_mask] == 0).all()


def test_a_continuing_episode_decodes_from_the_cache_rows_put_back() -> None:
    # the episodes of tests/test_hf_turns.py (turns ending at a stop digit, episodes ending at different
    # turns), from the kept cache, with finished rows leaving each turn's batch and without
    tok = build_char_tokenizer()
    stops = stop_token_ids(tok, make_tiny_model()) + tok.convert_tokens_to_ids(list("01234"))
    runs = {}
    for drop in (True, False):
        engine = HFEngine(_float32_stack(), stops, tok.pad_token_id, drop_finished=drop)
        runs[drop] = _rows_fed(engine.stack, lambda: _episodes(engine, reuse_cache=True))
    (left, fed), (stayed, fed_all) = runs[True], runs[False]
    assert sum(fed) < sum(fed_all), "no row left a turn's batch: a weak check"
    assert max(left.episodes.turns.tolist()) > 2
    for name in ("response_ids", "response_mask", "context_mask"):
        assert torch.equal(getattr(left, name), getattr(stayed, name)), name
    # float32 products of other shapes: ~1e-6 at |log μ| ≤ ~8
    torch.testing.assert_close(left.behaviour_logprobs, stayed.behaviour_logprobs, atol=2e-5, rtol=0)


def test_a_sharded_base_keeps_every_row_in_the_batch() -> None:
    # with a sharded base every forward is a collective each process must join equally often, so the
    # engine never drops rows there (DistContext.lockstep), whatever engine.drop_finished says
    tok = build_char_tokenizer()
    sharded = HFEngine(_float32_stack(), _stops(), tok.pad_token_id, DistContext(world_size=2, lockstep=True))
    assert sharded.drop_finished and not sharded.dropping
    assert HFEngine(_float32_stack(), _stops(), tok.pad_token_id, DistContext(world_size=2)).dropping
    # the loop then runs as before: while another process still decodes (all_done says go on) every row
    # is fed, finished ones their stop token and then pads
    stack = sharded.stack
    ids, mask = encode_prompts(tok, PROMPTS, torch.device("cpu"))
    u = row_uniforms(3, 1, torch.arange(len(PROMPTS)), torch.zeros(len(PROMPTS), dtype=torch.long), T)
    with stack.use("actor"):
        gen, fed = _rows_fed(stack, lambda: generate(stack, ids, mask, max_new_tokens=T, eos_id=_stops(), pad_id=tok.pad_token_id,
                                                     uniforms=u, all_done=lambda finished: False, drop_finished=sharded.dropping))
    assert gen.response_ids.shape[1] == T and fed == [len(PROMPTS)] * (T - 1)
    assert not gen.response_mask.all() and (gen.response_ids[~gen.response_mask] == tok.pad_token_id).all()
