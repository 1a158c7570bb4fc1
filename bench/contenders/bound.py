"""The floor of llmrl's GRPO step on the issue-8 configuration, piece by piece: the `bound` contender
of bench/vs_trl.py.

On one batch of 2 prompts × 4 samples: plain HF `generate` with the LoRA model (and with the base),
llmrl's own `generate`, one no-grad forward of the reference and of the LoRA model, and one LoRA
forward + backward; medians after a warm-up round. The runner's `bound` ratios are llmrl's step time
against generate + reference forward + forward/backward.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any, Callable

from .shared import GENERATIONS, NEW_TOKENS, PROMPTS, dtypes_of, llmrl_overrides, sync


def bound_run(model: str, reps: int, dtype: str = "float32") -> dict[str, Any]:
    """Medians over `reps` of the pieces a GRPO step cannot avoid, on one batch of 2 × 4 rows."""
    import torch

    from llmrl import load_config
    from llmrl.run.reporting import NullReporter
    from llmrl.engines.hf import generate, row_uniforms
    from llmrl.step.forward import masked_logprobs
    from llmrl.step.generate import encode_prompts, generate as generate_samples
    from llmrl.run.session import setup
    from llmrl.models.stack import layout, token_logprobs

    config = load_config(overrides=llmrl_overrides(model, "grpo", False, dtype=dtype,
                                                   out=tempfile.mkdtemp(prefix="bench-bound-")))
    s = setup(config, NullReporter(), overwrite=True)
    with torch.no_grad():  # a trained-looking adapter (B ≠ 0), as after a few steps
        for p in s.stack.parameters_of("actor"):
            p.add_(1e-3 * torch.randn_like(p))
    rows = s.task.train[:PROMPTS]
    tok, stack = s.tokenizer, s.stack
    ids, mask = encode_prompts(tok, [r["prompt"] for r in rows], stack.lm.device)
    ids, mask = ids.repeat_interleave(GENERATIONS, 0), mask.repeat_interleave(GENERATIONS, 0)
    batch = generate_samples(s.engine, tok, rows, torch.arange(PROMPTS), cfg=config.rollout, seed=0, step=0,
                             device=stack.lm.device)
    out: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        sync()
        t0 = time.perf_counter()
        result = fn()
        sync()
        out.setdefault(name, []).append(time.perf_counter() - t0)
        return result

    def hf_generate() -> int:
        g = stack.lm.generate(input_ids=ids, attention_mask=mask.long(), do_sample=True, temperature=1.0, top_k=0,
                              top_p=1.0, max_new_tokens=NEW_TOKENS, pad_token_id=tok.pad_token_id)
        resp = g[:, ids.shape[1]:]
        ended = (resp == tok.eos_token_id).long().cumsum(-1)
        return int(((ended == 0) | ((ended == 1) & (resp == tok.eos_token_id))).sum())

    def own_generate(i: int) -> int:
        u = row_uniforms(0, 100 + i, torch.arange(PROMPTS).repeat_interleave(GENERATIONS),
                         torch.arange(GENERATIONS).repeat(PROMPTS), NEW_TOKENS).to(ids.device)
        g = generate(stack, ids, mask, max_new_tokens=NEW_TOKENS, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                     temperature=1.0, uniforms=u)
        return int(g.response_mask.sum())

    def fwd_bwd() -> None:
        seq = layout(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
        lp = token_logprobs(stack.response_logits(seq, 1.0), batch.response_ids)
        loss = -(lp * batch.response_mask).sum() / batch.response_mask.sum()
        loss.backward()
        stack.zero_grad(set_to_none=True)

    gen_tokens: dict[str, list[int]] = {"hf_generate_lora": [], "hf_generate_base": [], "llmrl_generate": []}
    for i in range(reps + 1):  # the first round is a warm-up
        with torch.no_grad(), stack.use("actor"):
            gen_tokens["hf_generate_lora"].append(timed("hf_generate_lora", hf_generate))
        with torch.no_grad(), stack.use("reference"):
            gen_tokens["hf_generate_base"].append(timed("hf_generate_base", hf_generate))
        with stack.use("actor"):
            gen_tokens["llmrl_generate"].append(timed("llmrl_generate", lambda: own_generate(i)))
        with stack.use("reference"):
            timed("nograd_forward_ref", lambda: masked_logprobs(stack, batch, 1.0))
        with stack.use("actor"):
            timed("nograd_forward_lora", lambda: masked_logprobs(stack, batch, 1.0))
            timed("lora_fwd_bwd", fwd_bwd)
    return {"pieces_s": {k: v[1:] for k, v in out.items()}, "gen_tokens": {k: v[1:] for k, v in gen_tokens.items()},
            "batch_response_tokens": int(batch.response_mask.sum()), **dtypes_of(stack)}
