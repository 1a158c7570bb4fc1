"""The `hf` engine across turns (engines/hf_turns.py): each episode's KV cache is kept, a turn prefills
only what the last one added, and the episodes come out as from a fresh prefill of every turn."""

from __future__ import annotations

from typing import Any

import torch


from llmrl.config.schema import LoraConfig, RolloutConfig
from llmrl.engines.hf import HFEngine
from llmrl.engines.hf_turns import match
from llmrl.envs import EnvSpec, EnvStep
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer, stop_token_ids
from llmrl.step.episodes import generate_episodes

from tests.conftest import make_tiny_model

CPU = torch.device("cpu")


def test_match_keeps_the_cached_tokens_in_order_up_to_the_first_that_differs() -> None:
    # holes (None) are skipped; 5, 6, 7 are seq's first three tokens, in order: n = 3
    assert match([5, None, 6, 7, 9], [5, 6, 7, 8]) == ([1, 0, 1, 1, 0], 3)
    # 9 is not seq's next token (a turn cut at its room): it and every later position are holes
    assert match([5, 6, 9, 7, None], [5, 6, 7]) == ([1, 1, 0, 0, 0], 2)
    # all of seq cached: n = len(seq) (the decoder then feeds the last one again)
    assert match([None, 5, 6], [5, 6]) == ([0, 1, 1], 2)


class Ragged:
    """Answers of 0 to 2 characters (the seed's choice) and games of 2 to 4 turns: episodes leave the
    batch at different turns, and one answer adds no token at all (its last token is fed again)."""

    seed_per_episode = True  # each episode its own seed: a row's episodes differ too

    def reset(self, row: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        self.seed, self.turn = seed, 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str, calls: list) -> EnvStep:
        self.turn += 1
        return EnvStep([{"role": "user", "content": "7" * ((self.seed + self.turn) % 3)}],
                       done=self.turn >= 2 + self.seed % 3)


def _float32_stack() -> PolicyStack:
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model(), LoraConfig(r=4), with_critic=False)
    for p in stack.parameters_of("actor"):  # a non-zero adapter: the actor differs from the base
        torch.nn.init.normal_(p, std=0.1)
    return stack


def _engine() -> HFEngine:
    """The hf engine on the float32 stack, with the digits 0-4 as stop tokens too, so that a random model's
    turns end (and its episodes go on) often."""
    tok = build_char_tokenizer()
    stop = stop_token_ids(tok, make_tiny_model()) + tok.convert_tokens_to_ids(list("01234"))
    return HFEngine(_float32_stack(), stop, tok.pad_token_id)


def _episodes(engine: HFEngine, reuse_cache: bool, greedy: bool = False, prompts: tuple[str, ...] = ("12+3=", "4+56=", "7*8=")):
    tok = build_char_tokenizer()
    cfg = RolloutConfig(max_new_tokens=4, max_turns=4, num_generations=4, temperature=1.0)
    rows = [{"prompt": p} for p in prompts]
    return generate_episodes(engine, tok, EnvSpec("ragged", Ragged), rows, torch.tensor([0, 1, 2]), cfg=cfg, seed=5,
                             step=2, device=CPU, stop_ids=engine.stop_ids, logprobs=True,
                             greedy=greedy, reuse_cache=reuse_cache)


def test_cached_turns_give_the_tokens_and_logprobs_of_a_fresh_prefill_each_turn() -> None:
    engine = _engine()
    stack = engine.stack
    fed: list[tuple[int, int]] = []  # (rows, positions) of every forward
    hook = stack.lm.model.embed_tokens.register_forward_hook(lambda m, args, out: fed.append(tuple(args[0].shape)))
    fresh = _episodes(engine, reuse_cache=False)
    fresh_fed, fed[:] = list(fed), []
    cached = _episodes(engine, reuse_cache=True)
    hook.remove()
    assert cached.episodes is not None and fresh.episodes is not None
    turns = cached.episodes.turns.tolist()
    assert max(turns) == 4 and min(turns) < 4  # episodes left the batch at different turns
    assert int((cached.context_mask & ~cached.response_mask).sum()) > 0  # environment tokens in the rows
    for name in ("response_ids", "response_mask", "context_mask", "prompt_ids"):
        assert torch.equal(getattr(cached, name), getattr(fresh, name)), name
    assert cached.episodes.turns.tolist() == fresh.episodes.turns.tolist()
    assert fresh.behaviour_logprobs is not None and cached.behaviour_logprobs is not None
    assert float(fresh.behaviour_logprobs.abs().max()) > 0.5
    torch.testing.assert_close(cached.behaviour_logprobs, fresh.behaviour_logprobs, atol=1e-4, rtol=0)
    # what a turn after the first prefilled: the fresh decoder the whole rows (prompt + every turn so far),
    # the cached one at most the last drawn token + an answer of ≤ 2 characters = 3 positions
    prompt = int(cached.prompt_mask.sum(-1).max())
    multi = [s for s in fed if s[1] > 1]  # prefills (decode steps feed one position)
    assert multi[0][1] == prompt and all(s[1] <= 3 for s in multi[1:]) and len(multi) == max(turns)
    assert all(s[1] >= prompt for s in fresh_fed if s[1] > 1)
    assert sum(r * p for r, p in fed) < sum(r * p for r, p in fresh_fed)


def test_cached_turns_continue_from_a_prefill_with_a_shared_opening() -> None:
    # three prompts opening with "12" (k = 2 of the distinct prompts, computed once when a call costs
    # less than the 2 · (3 − 1) positions it saves): the cache holds the opening once and each row's own
    # copy as holes (hf_turns.prefilled_slots), and the later turns continue from it as from a fresh prefill
    engine = _engine()
    engine.stack.call_cost = 0.5
    fed: list[tuple[int, int]] = []
    hook = engine.stack.lm.model.embed_tokens.register_forward_hook(lambda m, args, out: fed.append(tuple(args[0].shape)))
    prompts = ("12+3=", "12+56=", "12*8=")
    fresh = _episodes(engine, reuse_cache=False, prompts=prompts)
    cached = _episodes(engine, reuse_cache=True, prompts=prompts)
    hook.remove()
    assert (1, 2) in fed  # the opening "12", fed once for one row
    assert max(cached.episodes.turns.tolist()) > 1
    for name in ("response_ids", "response_mask", "context_mask"):
        assert torch.equal(getattr(cached, name), getattr(fresh, name)), name
    torch.testing.assert_close(cached.behaviour_logprobs, fresh.behaviour_logprobs, atol=1e-4, rtol=0)
    engine.stack.call_cost = 10.0**9  # and the same episodes without the opening, to rounding
    plain = _episodes(engine, reuse_cache=True, prompts=prompts)
    assert torch.equal(plain.response_ids, cached.response_ids)
    torch.testing.assert_close(plain.behaviour_logprobs, cached.behaviour_logprobs, atol=1e-4, rtol=0)


def test_greedy_cached_turns_equal_fresh_ones() -> None:
    engine = _engine()
    stack = engine.stack
    fresh, cached = _episodes(engine, False, greedy=True), _episodes(engine, True, greedy=True)
    assert torch.equal(cached.response_ids, fresh.response_ids) and torch.equal(cached.context_mask, fresh.context_mask)
    torch.testing.assert_close(cached.behaviour_logprobs, fresh.behaviour_logprobs, atol=1e-4, rtol=0)
