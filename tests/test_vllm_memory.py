"""The vllm engine's KV cache sized to the run (llmrl/engines/vllm_memory.py): pure arithmetic on the
run's config and the model's shape, checked by hand; vLLM itself is exercised in tests/vllm/."""

from __future__ import annotations

import torch
from transformers import LlamaConfig

from llmrl.config import load_config
from llmrl.engines import vllm_memory as vm

# SmolLM2-135M's attention shape: 30 layers, 9 heads of 64 (hidden 576), 3 key/value heads
SMOLLM2 = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                      intermediate_size=1536, vocab_size=49152)


def _config(*sets: str):
    return load_config(sets=["model.name=some/real-model", "algo=grpo", *sets])


def test_bytes_per_token_is_k_and_v_of_every_layer() -> None:
    # 2 × 30 layers × 3 kv heads × 64 dims × 4 bytes = 46 080; bfloat16 half of it
    assert vm.bytes_per_token(SMOLLM2, torch.float32) == 46_080
    assert vm.bytes_per_token(SMOLLM2, torch.bfloat16) == 23_040


def test_kv_cache_is_sized_to_the_rows_and_the_longest_prompt() -> None:
    # issue 8's configuration: 2 prompts × 4 samples = 8 rows, 32 new tokens, no evaluation batch
    cfg = _config("rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=32", "update.minibatch_size=8",
                  "eval.size=0")
    assert vm.rows_at_once(cfg) == 8
    assert vm.context_tokens(cfg, 40) == 72  # the longest prompt + max_new_tokens
    # 1.25 × 8 rows × 128 tokens (72 rounded up to one block) × 46 080 B = 58 982 400 B (56.25 MiB, was 1 GiB)
    assert vm.kv_cache_bytes(cfg, SMOLLM2, torch.float32, 40) == 58_982_400
    # an evaluation batch wider than a step does not size it (vLLM queues its extra rows)
    wide = _config("rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=32",
                   "update.minibatch_size=8", "eval.size=100", "eval.batch_size=100")
    assert vm.rows_at_once(wide) == 8
    # engine.max_num_seqs caps the rows (6 of 8); a longer prompt takes two blocks per row:
    # 1.25 × 6 × 256 × 46 080 = 88 473 600
    capped = _config("rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=32",
                     "update.minibatch_size=8", "engine.max_num_seqs=6")
    assert vm.kv_cache_bytes(capped, SMOLLM2, torch.float32, 100) == 88_473_600

def test_settings_by_hand_win_and_an_unknown_prompt_keeps_the_old_gib() -> None:
    cfg = _config("engine.kv_cache_gb=0.05", "engine.max_model_len=64")
    assert vm.kv_cache_bytes(cfg, SMOLLM2, torch.float32, 40) == int(0.05 * 2**30)
    assert vm.context_tokens(cfg, 40) == 64
    plain = _config()
    assert vm.context_tokens(plain, None) is None
    assert vm.kv_cache_bytes(plain, SMOLLM2, torch.float32, None) == 2**30


def test_episodes_size_the_context_to_their_budget_within_the_models_window() -> None:
    from llmrl.step.episodes import episode_budget

    cfg = _config("rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=32",
                  "update.minibatch_size=8", "rollout.max_turns=3")
    budget = episode_budget(cfg.rollout)
    assert budget == 192  # no rollout.max_episode_tokens: 2 × 3 turns × 32 new tokens
    assert vm.context_tokens(cfg, 40, budget, SMOLLM2) == 232  # 40 + 192
    # 1.25 × 8 rows × 256 tokens (232 rounded up to two blocks) × 46 080 B = 117 964 800
    assert vm.kv_cache_bytes(cfg, SMOLLM2, torch.float32, 40, budget) == 117_964_800
    capped = _config("rollout.max_episode_tokens=50", "rollout.max_new_tokens=32", "update.minibatch_size=8")
    assert episode_budget(capped.rollout) == 50 and vm.context_tokens(capped, 40, 50, SMOLLM2) == 90
    small = LlamaConfig(**{**SMOLLM2.to_dict(), "max_position_embeddings": 200})
    assert vm.context_tokens(cfg, 40, budget, small) == 200  # never past the model's window


def test_the_cpu_step_budget_holds_every_rows_prefill_whole() -> None:
    # 16 prompts × 4 samples = 64 rows at L = 100 + 8: 6 912 tokens > vLLM's 4 096, so the budget is set
    cfg = _config("rollout.prompts_per_step=16", "rollout.num_generations=4", "rollout.max_new_tokens=8",
                  "update.minibatch_size=8", "eval.batch_size=16")
    assert vm.batched_tokens(cfg, 108) == 6912
    # an evaluation batch wider than a step counts (100 rows × 108), capped by engine.max_num_seqs (80)
    wide = _config("rollout.prompts_per_step=16", "rollout.num_generations=4", "update.minibatch_size=8",
                   "eval.batch_size=100")
    assert vm.batched_tokens(wide, 108) == 10_800
    capped = _config("rollout.prompts_per_step=16", "rollout.num_generations=4", "update.minibatch_size=8",
                     "eval.batch_size=100", "engine.max_num_seqs=80")
    assert vm.batched_tokens(capped, 108) == 8640
    # rows that fit vLLM's default (8 × 72 = 576) or an unknown context: vLLM's own default
    small = _config("rollout.prompts_per_step=2", "rollout.num_generations=4", "update.minibatch_size=8",
                    "eval.batch_size=8")
    assert vm.batched_tokens(small, 72) is None and vm.batched_tokens(cfg, None) is None
