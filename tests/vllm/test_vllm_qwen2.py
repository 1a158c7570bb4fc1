"""A Qwen2-architecture model through the vllm engine (tests/qwen2_tiny.py: biases on q, k and v, an
LM head of its own, a vocabulary 32× the hidden size): vLLM samples what the trainer computes, and
after a sync of the adapted q/k/v projections and the trained head, from the new weights."""

from __future__ import annotations

import pytest
import torch

from llmrl.config.load import load_config
from llmrl.engines import GenerationRequest, SamplingSettings, build_engine
from llmrl.models.load import load_base
from llmrl.models.stack import PolicyStack
from llmrl.tasks import task_from_config
from tests.qwen2_tiny import save_qwen2
from tests.vllm.test_vllm_engine import PROMPTS, keys_for, perturb, trainer_logprobs


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = save_qwen2(tmp_path_factory.mktemp("qwen2") / "model", seed=3)
    config = load_config(None, {"model.name": str(folder), "rollout.engine": "vllm"},
                         ["engine.kv_cache_gb=0.05", "engine.max_model_len=64",
                          "lora.target_modules=[q_proj,k_proj,v_proj,o_proj]", "lora.modules_to_save=[lm_head]"])
    base, tokenizer = load_base(config.model)
    stack = PolicyStack(base, config.lora, with_critic=False)
    engine = build_engine("vllm", stack=stack, tokenizer=tokenizer, config=config)
    prompts = [r["prompt"] for r in task_from_config(config).eval[:PROMPTS]]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    return dict(stack=stack, engine=engine, ids=enc.input_ids, mask=enc.attention_mask.bool(), folder=folder)


def draw(run: dict, offset: int):
    request = GenerationRequest(run["ids"], run["mask"], 2, SamplingSettings(6, 1.0), keys_for(2 * PROMPTS, offset),
                                logprobs=True)
    return run["engine"].generate(request)


def test_the_engine_holds_the_biases_and_the_untied_head(run: dict) -> None:
    names = set(run["engine"]._names)
    assert {"lm_head.weight", "model.layers.0.self_attn.q_proj.weight"} <= names
    base = run["stack"].lm
    assert base.model.layers[0].self_attn.q_proj.bias.abs().max() > 0.1  # biases that matter
    assert base.lm_head.weight.data_ptr() != base.model.embed_tokens.weight.data_ptr()


def test_a_qwen2_model_samples_what_the_trainer_computes_before_and_after_a_sync(run: dict) -> None:
    gen = draw(run, 0)
    # float32 on both sides: vLLM's kernels and the trainer's forward agree to float rounding
    torch.testing.assert_close(gen.logprobs, trainer_logprobs(run, gen), atol=1e-4, rtol=0)
    perturb(run["stack"], seed=7)  # the q/k/v/o LoRAs and the head's trained copy all move
    run["engine"].sync(run["stack"])
    after = draw(run, 0)
    assert not torch.equal(after.response_ids, gen.response_ids)  # same keys, new weights: new draws
    torch.testing.assert_close(after.logprobs, trainer_logprobs(run, after), atol=1e-4, rtol=0)
