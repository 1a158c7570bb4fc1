"""Turns of an episode (issue 45, item 7): a turn cut before its stop token calls nothing; two model
turns with an empty answer between them stay two turns in completions.jsonl's view; and one-turn
episodes on a model wide enough to pack its weights are the single-turn rollout bit for bit."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl.config.schema import LoraConfig, RolloutConfig
from llmrl.engines.base import GenerationRequest, SamplingSettings, row_keys
from llmrl.engines.hf import HFEngine
from llmrl.envs import EnvSpec, EnvStep, resolve_env
from llmrl.models.packed import packable
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer, stop_token_ids
from llmrl.step.episodes import episode_view, generate_episodes
from llmrl.step.generate import encode_prompts

from tests.test_episodes import ScriptedEngine, char_ids, chat_tokenizer

CPU = torch.device("cpu")


def test_a_turn_cut_inside_a_tool_call_is_no_tool_error() -> None:
    """A turn that reaches max_new_tokens inside '<tool_call>…' ends the episode unfinished: no call, no error.
    The same unclosed call in a turn that ended with its stop token is the model's mistake: one call, one error."""
    tok = chat_tokenizer()
    end, open_ = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<tool_call>")
    cut = [open_, *char_ids(tok, '{"name": "calc')]  # 15 tokens, no stop token: cut at max_new_tokens
    rows = [{"prompt": "What is 12*3?", "answer": "36"}]
    cfg = RolloutConfig(max_new_tokens=len(cut), max_turns=3, num_generations=1)
    samples = generate_episodes(ScriptedEngine([cut]), tok, resolve_env("calculator"), rows, torch.tensor([0]),
                                cfg=cfg, seed=0, step=0, device=CPU, stop_ids=[end])
    log = samples.episodes
    assert log is not None and log.turns.tolist() == [1]
    assert log.tool_calls.tolist() == [0] and log.tool_errors.tolist() == [0]
    ended = cut[:-1] + [end]  # the same unclosed call, ended by the model: a malformed call, answered with an error
    samples = generate_episodes(ScriptedEngine([ended, ended, ended]), tok, resolve_env("calculator"), rows,
                                torch.tensor([0]), cfg=cfg, seed=0, step=0, device=CPU, stop_ids=[end])
    log = samples.episodes
    assert log is not None and log.turns.tolist() == [3]
    assert log.tool_calls.tolist() == [3] and log.tool_errors.tolist() == [3]


class Silent:
    """Answers every turn with an empty message (no token at all without a chat template): 0.5, then 1 and done."""

    def reset(self, row: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        self.turn = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str, calls: list) -> EnvStep:
        self.turn += 1
        return EnvStep([{"role": "user", "content": ""}], reward=0.5 * self.turn, done=self.turn == 2)


def test_two_turns_with_an_empty_answer_between_them_stay_two_turns() -> None:
    tok = build_char_tokenizer()
    end = tok.eos_token_id
    first, second = [*char_ids(tok, "12"), end], [*char_ids(tok, "3"), end]
    cfg = RolloutConfig(max_new_tokens=4, max_turns=3, num_generations=1)
    samples = generate_episodes(ScriptedEngine([first, second]), tok, EnvSpec("silent", Silent), [{"prompt": "1+2="}],
                                torch.tensor([0]), cfg=cfg, seed=0, step=0, device=CPU, stop_ids=[end])
    assert samples.response_ids[0][samples.context_mask[0]].tolist() == first + second  # nothing between them
    view = episode_view(tok, samples, 0)
    assert [(t["by"], t["tokens"], t["reward"]) for t in view["turns"]] == [("model", 3, 0.5), ("model", 2, 1.0)]
    assert view["env_reward"] == 1.5


class OneTurn:
    def reset(self, row: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str, calls: list) -> EnvStep:
        return EnvStep(done=True)


def _wide_engine() -> HFEngine:
    """A float32 Llama of hidden size 256 (the size from which the hf engine packs its weights), LoRA on."""
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=512, max_position_embeddings=64,
                                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                         eos_token_id=tok.eos_token_id)).eval()
    stack = PolicyStack(model, LoraConfig(r=4), with_critic=False)
    for p in stack.parameters_of("actor"):
        torch.nn.init.normal_(p, std=0.05)
    return HFEngine(stack, stop_token_ids(tok, model), tok.pad_token_id)


def test_one_turn_episodes_on_a_packed_model_are_the_single_turn_rollout() -> None:
    """Turn 0 decodes through the engine's own path (prepacked weights at hidden size 256): the same ids,
    masks and log-probs as `engine.generate` with the same keys, bit for bit."""
    engine = _wide_engine()
    assert packable(engine.stack.lm) and engine.pack
    tok = build_char_tokenizer()
    rows = [{"prompt": "12+3="}, {"prompt": "4+56="}, {"prompt": "7*8="}]
    g, seed, step = 4, 11, 2
    cfg = RolloutConfig(max_new_tokens=6, max_turns=3, num_generations=g, temperature=1.0)
    index = torch.tensor([0, 1, 2])
    episodes = generate_episodes(engine, tok, EnvSpec("one", OneTurn), rows, index, cfg=cfg, seed=seed, step=step,
                                 device=CPU, stop_ids=engine.stop_ids, logprobs=True)
    ids, mask = encode_prompts(tok, [r["prompt"] for r in rows], CPU)
    keys = row_keys(seed, step, index.repeat_interleave(g), torch.arange(g).repeat(len(rows)))
    single = engine.generate(GenerationRequest(ids, mask, g, SamplingSettings(6, 1.0), keys, logprobs=True))
    width = single.response_ids.shape[1]
    assert episodes.response_ids.shape[1] == width
    assert torch.equal(episodes.response_ids, torch.where(single.response_mask, single.response_ids,
                                                          torch.full_like(single.response_ids, tok.pad_token_id)))
    assert torch.equal(episodes.response_mask, single.response_mask)
    assert single.logprobs is not None and episodes.behaviour_logprobs is not None
    assert torch.equal(episodes.behaviour_logprobs, single.logprobs)
