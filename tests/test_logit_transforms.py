"""Models whose forward transforms the logits after the LM head (models/logit_head.py): the training
log-probs go through the same transform, so decoding log μ = training log π_old (issue 59 item 2)."""

from __future__ import annotations

import pytest
import torch
from transformers import (CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM, GraniteConfig,
                          GraniteForCausalLM)

from llmrl.config.schema import LoraConfig
from llmrl.engines.hf import generate, row_uniforms
from llmrl.models.logit_head import logit_transform
from llmrl.models.sequences import layout
from llmrl.models.stack import PolicyStack
from llmrl.step.forward import masked_logprobs
from llmrl.step.records import TrainRows

SHAPE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# transforms strong enough to move log-probs by far more than the tolerance at a random model's logit scale
MODELS = {
    "gemma2": (Gemma2ForCausalLM, Gemma2Config(**SHAPE, head_dim=8, final_logit_softcapping=0.5)),
    "cohere": (CohereForCausalLM, CohereConfig(**SHAPE, logit_scale=4.0)),
    "granite": (GraniteForCausalLM, GraniteConfig(**SHAPE, logits_scaling=0.25)),
}


def _stack(name: str) -> PolicyStack:
    cls, config = MODELS[name]
    torch.manual_seed(0)
    stack = PolicyStack(cls(config).to(torch.float64).eval(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                        with_critic=False)
    for p in stack.parameters_of("actor"):  # a trained-looking actor
        torch.nn.init.normal_(p, std=0.1)
    return stack


@pytest.mark.parametrize("name", sorted(MODELS))
def test_decoding_logprobs_equal_training_logprobs_through_the_models_logit_transform(name: str) -> None:
    stack = _stack(name)
    assert logit_transform(stack.lm.config) is not None
    gen_ids = torch.randint(3, 96, (4, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(gen_ids, dtype=torch.bool)
    u = row_uniforms(0, 1, torch.arange(4), torch.zeros(4, dtype=torch.long), 8)
    with stack.use("actor"):
        gen = generate(stack, gen_ids, mask, max_new_tokens=8, eos_id=2, pad_id=0, temperature=0.8, uniforms=u,
                       logprobs=True)
        rows = TrainRows(gen_ids, mask, gen.response_ids, gen.response_mask)
        trained = masked_logprobs(stack, rows, 0.8)
        # float64 products: the same numbers through other shapes, ~1e-15 relative at |log π| ≤ ~6
        torch.testing.assert_close(gen.logprobs, trained, atol=1e-10, rtol=0)
        # and the plain head alone (what the training path used to apply) is another policy
        h = stack.hidden(layout(gen_ids, mask.long(), gen.response_ids, gen.response_mask.long()))
        plain = torch.log_softmax(stack.lm.get_output_embeddings()(h) / 0.8, -1)
        plain = plain.gather(-1, gen.response_ids.unsqueeze(-1)).squeeze(-1) * gen.response_mask
    assert float((plain - trained).abs().max()) > 1e-2


def test_a_model_without_a_transform_keeps_the_plain_head() -> None:
    from tests.conftest import make_tiny_model

    assert logit_transform(make_tiny_model().config) is None
    assert logit_transform(GraniteConfig(**SHAPE)) is None  # logits_scaling 1.0: the identity
