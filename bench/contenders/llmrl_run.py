"""llmrl's own trainer on the issue-8 configuration: the `llmrl-*` contenders of bench/vs_trl.py.

llmrl-grpo-defaults (no performance switch set: what the engine's defaults give, here
update.on_policy_logprobs=auto → on), llmrl-grpo (update.on_policy_logprobs=off pinned: log π_old then
comes from the decoding logits, rollout.generation_logprobs), llmrl-grpo-fast (=on), llmrl-rloo-fast,
llmrl-ppo (actor + critic + reference on one base), llmrl-ppo-top4 (lora.critic_layers=4),
llmrl-grpo-fast-adapters (engine.merge_lora=false), llmrl-vllm (--engine vllm, merged-weight sync),
llmrl-vllm-adapter (engine.sync=adapter), llmrl-vllm-bf16 (engine.dtype=bfloat16 under a --dtype trainer),
llmrl-grpo-nf4 and llmrl-ppo-nf4 (model.quantize=nf4: the base in 4 bits, bitsandbytes).
"""

from __future__ import annotations

import time
from typing import Any

from .shared import LR, SEED, dtypes_of, llmrl_overrides, probe_autocast, question, sync

# llmrl contender → (algorithm, update.on_policy_logprobs); None leaves the key at the engine's default
LLMRL = {"llmrl-grpo-defaults": ("grpo", None), "llmrl-grpo": ("grpo", False), "llmrl-grpo-fast": ("grpo", True),
         "llmrl-rloo-fast": ("rloo", True), "llmrl-grpo-fast-adapters": ("grpo", True), "llmrl-ppo": ("ppo", False), "llmrl-ppo-top4": ("ppo", False),
         "llmrl-vllm": ("grpo", True), "llmrl-vllm-adapter": ("grpo", True), "llmrl-vllm-bf16": ("grpo", True),
         "llmrl-grpo-nf4": ("grpo", None), "llmrl-ppo-nf4": ("ppo", False)}
# llmrl contender → config keys it sets on top of the issue-8 configuration
EXTRA = {"llmrl-ppo-top4": {"lora.critic_layers": 4},  # the opt-in critic on the top 4 layers
         "llmrl-grpo-fast-adapters": {"engine.merge_lora": False},  # decoding through the adapters (before 2026-12-04)
         "llmrl-vllm": {"rollout.engine": "vllm"},  # the engine in the model's dtype, merged-weight sync
         "llmrl-vllm-adapter": {"rollout.engine": "vllm", "engine.sync": "adapter"},  # one base: the adapter served
         "llmrl-vllm-bf16": {"rollout.engine": "vllm", "engine.dtype": "bfloat16"},  # bf16 sampler, --dtype trainer
         "llmrl-grpo-nf4": {"model.quantize": "nf4"},  # the frozen base's linear layers in 4 bits (issue 56)
         "llmrl-ppo-nf4": {"model.quantize": "nf4"}}  # actor, critic and reference on one 4-bit base


def llmrl_run(model: str, name: str, steps: int, dtype: str = "float32", seed: int = SEED,
              lr: float = LR) -> dict[str, Any]:
    """`steps` llmrl train steps (setup as `llmrl train` does, no eval, no checkpoints)."""
    from dataclasses import asdict

    from llmrl import load_config
    from llmrl.run.reporting import NullReporter
    from llmrl.run.one_step import train_step
    from llmrl.run.session import setup

    algo, on_policy = LLMRL[name]
    config = load_config(overrides={**llmrl_overrides(model, algo, on_policy, dtype=dtype, seed=seed, lr=lr),
                                    **EXTRA.get(name, {})})
    s = setup(config, NullReporter(), overwrite=True)
    seen: dict[str, Any] = dtypes_of(s.stack)
    probe_autocast(s.stack.lm.get_decoder(), seen)  # the update's forward runs the decoder directly
    times, tokens, rewards, lengths, prompts, rows = [], [], [], [], [], []
    for step in range(steps):
        prompts.append([question(s.task.train[i]["prompt"]) for i in s.sampler.indices(step).tolist()])
        sync()
        t0 = time.perf_counter()
        row = train_step(s, step)
        sync()
        times.append(time.perf_counter() - t0)
        tokens.append(row["tokens"])
        rewards.append(row["reward_mean"])
        lengths.append(row["response_len"])
        rows.append({k: v for k, v in row.items() if isinstance(v, (int, float, bool, str)) or v is None})
    return {"step_s": times, "tokens": tokens, "reward": rewards, "completion_len": lengths, "prompts": prompts,
            "metrics": rows, "llmrl_config": asdict(config), "generate_s": [r["time_generate_s"] for r in rows],
            "sync_s": [r["time_sync_s"] for r in rows], **seen}
