"""Plain vLLM `LLM.generate` against llmrl's `vllm` engine on one GRPO batch: the `vllm-generate`
contender of bench/vs_trl.py (needs vLLM: the `.venv-vllm` interpreter).
"""

from __future__ import annotations

import time
from typing import Any

from .shared import GENERATIONS, NEW_TOKENS, PROMPTS, SEED, llmrl_overrides, sync


def vllm_generate_run(model: str, reps: int, dtype: str = "float32") -> dict[str, Any]:
    """Plain vLLM `LLM.generate` of one GRPO batch (2 chat prompts × 4 samples × 32 tokens, temperature
    1, one seeded request per row, log-probs of the drawn tokens) against llmrl's `vllm` engine
    generating the same request from the same `LLM` (the wrapper's cost: request building, padding,
    log-prob gathering), alternated, medians over `reps` after a warm-up round."""
    import torch

    from llmrl import load_config
    from llmrl.engines import GenerationRequest, SamplingSettings, build_engine
    from llmrl.engines.base import row_keys
    from llmrl.models.load import load_base
    from llmrl.models.prompts import apply_chat_setting, tokenize_prompts
    from llmrl.models.stack import PolicyStack
    from llmrl.tasks import get_task
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    config = load_config(overrides={**llmrl_overrides(model, "grpo", True, dtype=dtype), "rollout.engine": "vllm"})
    base, tok = load_base(config.model)
    apply_chat_setting(tok, "auto", config.model.name)
    engine = build_engine("vllm", stack=PolicyStack(base, config.lora, with_critic=False), tokenizer=tok, config=config)
    enc = tokenize_prompts(tok, [r["prompt"] for r in get_task("chat_sum").train[:PROMPTS]], return_tensors="pt",
                           padding=True)
    ids, mask = enc.input_ids, enc.attention_mask.bool()
    index = torch.arange(PROMPTS).repeat_interleave(GENERATIONS)
    out: dict[str, list[float]] = {"vllm_generate": [], "llmrl_vllm_engine": []}
    counts: dict[str, list[int]] = {k: [] for k in out}

    def plain(keys: torch.Tensor) -> int:
        prompts = [TokensPrompt(prompt_token_ids=row[m].tolist()) for row, m in zip(ids, mask) for _ in range(GENERATIONS)]
        params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=k, logprobs=0, detokenize=False,
                                 stop_token_ids=engine.stop_ids) for k in keys.tolist()]
        return sum(len(o.outputs[0].token_ids) for o in engine.llm.generate(prompts, params, use_tqdm=False))

    def wrapped(keys: torch.Tensor) -> int:
        request = GenerationRequest(ids, mask, GENERATIONS, SamplingSettings(NEW_TOKENS, 1.0), keys, logprobs=True)
        return int(engine.generate(request).response_mask.sum())

    for rep in range(reps + 1):  # the first round is a warm-up; both see the same keys, so the same tokens
        keys = row_keys(SEED, rep, index, torch.arange(GENERATIONS).repeat(PROMPTS))
        for name, fn in (("vllm_generate", plain), ("llmrl_vllm_engine", wrapped)):
            sync()
            t0 = time.perf_counter()
            n = fn(keys)
            sync()
            if rep:
                out[name].append(time.perf_counter() - t0)
                counts[name].append(n)
    return {"pieces_s": out, "gen_tokens": counts}
