"""Models whose forward transforms the logits after the LM head (models/logit_head.py): the training
log-probs go through the same transform, so decoding log μ = training log π_old (issue 59 item 2); the
transforms keyed on the model type, as each transformers forward applies them, and the check at load that
refuses a model whose own logits llmrl's head does not reproduce (issue 69 item 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn
from transformers import (CohereConfig, CohereForCausalLM, FalconH1Config, FalconH1ForCausalLM, Gemma2Config,
                          Gemma2ForCausalLM, Gemma3Config, Gemma3ForConditionalGeneration, GraniteConfig,
                          GraniteForCausalLM, HyperCLOVAXConfig, HyperCLOVAXForCausalLM, LlamaForCausalLM,
                          MiniCPM3Config, MiniCPM3ForCausalLM, RecurrentGemmaConfig, RecurrentGemmaForCausalLM,
                          RobertaConfig, RobertaForCausalLM)

from llmrl.config.schema import LoraConfig, ModelConfig
from llmrl.engines.hf import generate, row_uniforms
from llmrl.errors import ConfigError
from llmrl.models import logit_head
from llmrl.models.load import load_base
from llmrl.models.logit_head import check_head, logit_transform, model_head
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.models.sequences import layout
from llmrl.models.stack import PolicyStack
from llmrl.step.forward import masked_logprobs
from llmrl.step.records import TrainRows
from tests.conftest import make_tiny_model

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
    assert logit_transform(stack.lm.config) != (None, None)
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
    assert logit_transform(make_tiny_model().config) == (None, None)
    # an attribute of a transform on a model type whose forward does not apply it: the plain head
    assert logit_transform(Gemma3Config(text_config=dict(final_logit_softcapping=0.5))) == (None, None)


TOK = build_char_tokenizer()
V = len(TOK)
SMALL = dict(SHAPE, vocab_size=V, pad_token_id=TOK.pad_token_id, bos_token_id=TOK.bos_token_id,
             eos_token_id=TOK.eos_token_id)
# one tiny random model of each kind, its transform far from the identity (so the plain head is another policy)
KINDS: dict[str, Callable[[], nn.Module]] = {
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(**SMALL, head_dim=8, final_logit_softcapping=0.5)),
    "cohere": lambda: CohereForCausalLM(CohereConfig(**SMALL, logit_scale=4.0)),
    "granite": lambda: GraniteForCausalLM(GraniteConfig(**SMALL, logits_scaling=0.25)),
    # multiplies by logits_scaling where Granite divides by it
    "hyperclovax": lambda: HyperCLOVAXForCausalLM(HyperCLOVAXConfig(**SMALL, logits_scaling=4.0)),
    "falcon_h1": lambda: FalconH1ForCausalLM(FalconH1Config(
        **SMALL, head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, mamba_chunk_size=8,
        lm_head_multiplier=4.0)),
    # the hidden state divided by logits_scaling = hidden_size / dim_model_base = 0.25 before the head
    "minicpm3": lambda: MiniCPM3ForCausalLM(MiniCPM3Config(
        **SMALL, kv_lora_rank=8, q_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=8, dim_model_base=128)),
    "recurrent_gemma": lambda: RecurrentGemmaForCausalLM(RecurrentGemmaConfig(
        **{k: v for k, v in SMALL.items() if k != "max_position_embeddings"}, lru_width=32, attention_window_size=16,
        logits_soft_cap=0.5)),
    # the text config holds a softcap, but Gemma3ForConditionalGeneration's forward does not apply it
    "gemma3": lambda: Gemma3ForConditionalGeneration(Gemma3Config(
        text_config=dict(SMALL, head_dim=8, final_logit_softcapping=0.5, sliding_window=16),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=V - 1, boi_token_index=V - 2, eoi_token_index=V - 3)),
}


def _random(kind: str) -> nn.Module:
    """KINDS[kind], float32, eval, weights ~ N(0, 0.2²): logits of a few units, where a transform shows."""
    torch.manual_seed(0)
    model = KINDS[kind]().float().eval()
    for p in model.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    return model


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_llmrls_head_on_the_decoders_hidden_state_is_the_models_own_logits(kind: str) -> None:
    model = _random(kind)
    assert model.config.model_type == kind
    ids = torch.tensor([[3, 5, 8, 11, 14, 19]])
    with torch.no_grad():
        own = model(input_ids=ids, use_cache=False).logits
        h = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
        ours = model_head(model)(h)
        plain = model.get_output_embeddings()(h)
    # the same float32 products on the same hidden state: equal but for where a transform rounds (~1e-7 |z|)
    torch.testing.assert_close(ours, own, atol=1e-5, rtol=1e-5)
    if kind != "gemma3":  # the transform matters: the plain head is another policy
        assert float((plain - own).abs().max()) > 0.1


def _scaled_llama() -> nn.Module:
    """A LlamaForCausalLM whose forward multiplies its logits by 0.9 (a transform llmrl does not know; its
    model type is still 'llama')."""

    class ScaledLlama(LlamaForCausalLM):
        def forward(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - transformers' signature
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 0.9
            return out

    torch.manual_seed(0)
    return ScaledLlama(make_tiny_model().config).eval()


def test_the_check_refuses_a_forward_whose_transform_llmrl_does_not_know() -> None:
    ids = torch.tensor([[3, 8, 14, 19]])
    check_head("plain", make_tiny_model(), ids)  # the plain Llama: llmrl's head is its logits
    with pytest.raises(ConfigError, match=r"^Model 'scaled' \(llama\) computes its logits in a way llmrl does not "
                                          r"reproduce: on one 4-token row its own last-position logits differ"):
        check_head("scaled", _scaled_llama(), ids)


def _saved(kind: str, root: Path) -> Path:
    path = root / kind
    _random(kind).save_pretrained(path)
    TOK.save_pretrained(path)
    return path


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "nf4"])
def test_every_load_path_runs_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    """A HyperCLOVAX folder loads in float32, bfloat16 and as a 4-bit base; with its transform unknown to llmrl
    (its entry taken out of the table) each of the three loads refuses it: the check runs on every path, and
    its tolerance (4 ε·max|z|, 3 % of max|z| in bfloat16) is far below a ×16 policy (s·z against z / s)."""
    if precision == "nf4":
        pytest.importorskip("bitsandbytes")
    path = _saved("hyperclovax", tmp_path)
    dtype = "float32" if precision == "nf4" else precision
    cfg = ModelConfig(name=str(path), dtype=dtype, device="cpu", quantize="nf4" if precision == "nf4" else "none")
    model, _ = load_base(cfg, show_progress=False)
    assert model.dtype == getattr(torch, dtype)
    monkeypatch.delitem(logit_head.TRANSFORMS, "hyperclovax")
    with pytest.raises(ConfigError, match=r"\(hyperclovax\) computes its logits in a way llmrl does not reproduce"):
        load_base(cfg, show_progress=False)


def test_the_cli_refuses_a_model_whose_head_llmrl_does_not_apply(tmp_path: Path) -> None:
    """RobertaForCausalLM (a real causal LM of transformers) runs a dense layer and a layer norm inside its LM
    head before the output embedding that llmrl applies: refused at load, one sentence, exit 2."""
    from tests.helpers import cli_refused

    torch.manual_seed(0)
    path = tmp_path / "roberta"
    RobertaForCausalLM(RobertaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, is_decoder=True, max_position_embeddings=64,
                                     pad_token_id=TOK.pad_token_id)).save_pretrained(path)
    TOK.save_pretrained(path)
    cli_refused(["train", "--model", str(path), "--out", str(tmp_path / "run"), "--steps", "1"],
                f"Model '{path}' (roberta) computes its logits in a way llmrl does not reproduce: on one ")
