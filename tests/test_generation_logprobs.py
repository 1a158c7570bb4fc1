"""log π_old from the decoding logits (rollout.generation_logprobs): the same numbers as a forward."""

from __future__ import annotations

import pytest
import torch

from llmrl.step.records import StepPlan, TrainRows
from llmrl.config.schema import RolloutConfig
from llmrl.step import forward as rollout_mod
from llmrl.step.forward import generation_logprobs, masked_logprobs
from llmrl.engines.hf import generate, row_uniforms
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.tasks import get_task

from tests.helpers import digit_share
from tests.steps import Rollout, rollout
from tests.test_prefix import G, _batch, _stack


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("share", [False, True])
def test_decoding_logprobs_equal_a_full_forward(dtype: torch.dtype, atol: float, share: bool) -> None:
    tok = build_char_tokenizer()
    stack = _stack().to(dtype)
    stack.share_prompts = share
    ids, mask, _, _ = _batch()
    n = ids.shape[0]
    u = row_uniforms(0, 3, torch.arange(n) // G, torch.arange(n) % G, 10)
    with stack.use("actor"):
        # top-p truncates what is drawn, not π: both sides score the untruncated tempered policy
        gen = generate(stack, ids, mask, max_new_tokens=10, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                       temperature=0.7, top_p=0.9, uniforms=u, logprobs=True)
        full = masked_logprobs(stack, TrainRows(ids, mask, gen.response_ids, gen.response_mask), 0.7)
    assert gen.logprobs is not None and gen.logprobs.dtype == dtype
    assert float(full.abs().max()) > 0.5  # real log-probs, not zeros
    assert torch.equal(gen.logprobs == 0, ~gen.response_mask | (full == 0))
    torch.testing.assert_close(gen.logprobs, full, atol=atol, rtol=0)


def _rollout(from_generation: bool) -> tuple[Rollout, list[str]]:
    calls: list[str] = []
    stack = _stack()
    real = rollout_mod.masked_logprobs

    def counted(s, batch, temperature):  # the real forward, recording which role ran it
        lora = next(m for m in s.modules() if hasattr(m, "lora_A"))
        calls.append("reference" if lora.disable_adapters else s._role)
        return real(s, batch, temperature)

    rollout_mod.masked_logprobs = counted
    try:
        rows = get_task("arithmetic").train[:2]
        plan = StepPlan(reference=True, critic=False, greedy=False, from_generation=from_generation)
        cfg = RolloutConfig(prompts_per_step=2, num_generations=G, max_new_tokens=6)
        batch = rollout(stack, build_char_tokenizer(), rows, torch.arange(2), cfg=cfg, plan=plan,
                        reward_fn=digit_share, seed=0, step=0)
    finally:
        rollout_mod.masked_logprobs = real
    return batch, calls


def test_rollout_skips_the_actor_forward_and_keeps_the_batch() -> None:
    forward, calls_forward = _rollout(False)
    decoded, calls_decoded = _rollout(True)
    assert calls_forward == ["actor", "reference"]
    assert calls_decoded == ["reference"]
    assert torch.equal(decoded.samples.response_ids, forward.samples.response_ids)
    decoded, forward = decoded.forwards, forward.forwards
    torch.testing.assert_close(decoded.old_logprobs, forward.old_logprobs, atol=1e-12, rtol=0)
    torch.testing.assert_close(decoded.ref_logprobs, forward.ref_logprobs, atol=0, rtol=0)
    assert float((forward.old_logprobs - forward.ref_logprobs).abs().max()) > 1e-2


def test_half_precision_models_keep_the_forward() -> None:
    cfg = RolloutConfig()
    assert generation_logprobs(cfg, torch.float32) and generation_logprobs(cfg, torch.float64)
    assert not generation_logprobs(cfg, torch.bfloat16) and not generation_logprobs(cfg, torch.float16)
    assert not generation_logprobs(RolloutConfig(generation_logprobs=False), torch.float32)
