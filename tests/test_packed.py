"""The `hf` engine decodes through prepacked linear weights (models/packed.py): the same products as
the plain layers, the same tokens, every layer given back its own forward, and nothing packed for
the built-in tiny model."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl.config.schema import LoraConfig
from llmrl.engines.base import GenerationRequest, SamplingSettings, row_keys
from llmrl.engines.hf import HFEngine, hf_engine
from llmrl.models.decoding import skinny_head
from llmrl.models.packed import packable, packed_linears, packed_size
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl import load_config

from tests.conftest import make_tiny_model

TOK = build_char_tokenizer()


def _model(dtype: torch.dtype, hidden: int = 256, bias: bool = False) -> LlamaForCausalLM:
    """A random 2-layer Llama as wide as packing asks for (hidden 256), the char tokenizer's vocabulary;
    `bias`: q, k, v, o with biases (as Qwen2's q, k, v)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(TOK), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=2 * hidden, max_position_embeddings=64, attention_bias=bias,
                      pad_token_id=TOK.pad_token_id, bos_token_id=TOK.bos_token_id, eos_token_id=TOK.eos_token_id)
    return LlamaForCausalLM(cfg).to(dtype).eval().requires_grad_(False)  # frozen, as a stack's base


def _stack(dtype: torch.dtype) -> PolicyStack:
    stack = PolicyStack(_model(dtype), LoraConfig(r=4), with_critic=False)
    for p in stack.parameters_of("actor"):  # B ≠ 0: the adapters' products count
        torch.nn.init.normal_(p, std=0.05)
    return stack


def _request() -> GenerationRequest:
    ids = torch.tensor([TOK.encode(p) for p in ("12+34=", "56+7=9")])
    keys = row_keys(3, 0, torch.arange(2).repeat_interleave(4), torch.arange(4).repeat(2))
    return GenerationRequest(ids, torch.ones_like(ids, dtype=torch.bool), 4, SamplingSettings(8), keys, logprobs=True)


def _linears(model: nn.Module, frozen: bool = True) -> list[nn.Linear]:
    return [m for m in model.modules() if type(m) is nn.Linear and (not frozen or not m.weight.requires_grad)]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_linear_layer_runs_packed_with_the_plain_products_numbers_and_gets_its_forward_back(dtype, bias) -> None:
    model = _model(dtype, bias=bias)
    for layer in model.model.layers:  # random biases: nn.Linear's default init would leave them small, not zero
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            if proj.bias is not None:
                torch.nn.init.normal_(proj.bias, std=0.5)
    assert (model.model.layers[0].self_attn.q_proj.bias is not None) == bias
    assert packable(model)
    layers = _linears(model)
    weights = [m.weight for m in layers]
    x = {m: torch.randn(8, m.in_features).to(dtype) for m in layers}
    plain = {m: m(x[m]) for m in layers}
    calls = [0]
    original = torch.ops.mkldnn._linear_pointwise

    with torch.no_grad(), packed_linears(model, 8):
        assert all("forward" in m.__dict__ for m in layers)  # every one rerouted, the LM head too
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.ops.mkldnn, "_linear_pointwise",
                       lambda *a: (calls.__setitem__(0, calls[0] + 1), original(*a))[1])
            packed = {m: m(x[m]) for m in layers}
    assert calls[0] == len(layers)  # each product went through oneDNN's packed kernel
    # float32: MKL's GEMM on several threads sums in another order, ~1e-6 on these sums of 256-512 terms
    # of size ~0.05 (|y| < 1); bfloat16: both kernels accumulate in float32 and round the result once,
    # so at most one bfloat16 step apart (2^-8 relative; on the AMD EPYC of docs/performance.md the same bits)
    for m in layers:
        if dtype == torch.float32:
            torch.testing.assert_close(packed[m], plain[m], atol=1e-4, rtol=0)
        else:
            torch.testing.assert_close(packed[m].float(), plain[m].float(), atol=1e-6, rtol=2**-8)
    assert not any("forward" in m.__dict__ for m in layers)  # the class's forward again
    assert all(m.weight is w for m, w in zip(layers, weights))  # the weights themselves untouched


def test_a_call_with_gradients_runs_the_plain_product_and_gets_its_gradient() -> None:
    model = _model(torch.float32)
    layer = model.model.layers[0].mlp.down_proj
    x = torch.randn(3, layer.in_features, requires_grad=True)
    with packed_linears(model, 3):
        y = layer(x)
    y.sum().backward()
    assert y.grad_fn is not None and x.grad is not None
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(3, -1), atol=1e-5, rtol=0)  # ∂Σy/∂x = Σ_out W


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoding_through_packed_weights_draws_the_same_tokens(dtype) -> None:
    stack = _stack(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: torch's float32 product is oneDNN's as well, so the bits agree
    try:
        plain = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=False).generate(_request())
        packed = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=True).generate(_request())
    finally:
        torch.set_num_threads(threads)
    assert packed.logprobs is not None and plain.logprobs is not None
    if dtype == torch.float32:  # one thread: the same kernel, the same tokens and log-probs
        assert torch.equal(packed.response_ids, plain.response_ids)
        assert torch.equal(packed.response_mask, plain.response_mask)
        torch.testing.assert_close(packed.logprobs, plain.logprobs, atol=1e-4, rtol=0)
    else:  # at most a bfloat16 rounding apart per product: each row the same tokens until the two part,
        # log-probs within 2e-2 before that (a logit of size ≤ 10 moves ≤ 10·2^-8 ≈ 0.04 per rounding step;
        # measured here: the same bits); most rows never part
        same = packed.response_ids == plain.response_ids
        until = same.long().cumprod(1).bool()
        assert until.float().mean() >= 0.75
        torch.testing.assert_close(packed.logprobs[until], plain.logprobs[until], atol=2e-2, rtol=0)
    assert not any("forward" in m.__dict__ for m in _linears(stack.lm, frozen=False))


def test_the_tiny_model_packs_nothing_and_keeps_its_skinny_head() -> None:
    model = make_tiny_model()  # hidden 32: below packing's 256
    assert not packable(model) and packed_size(model) == (0, 0)
    with torch.no_grad(), packed_linears(model, 4):
        assert not any("forward" in m.__dict__ for m in _linears(model))
        with skinny_head(model):
            assert "forward" in model.lm_head.__dict__


def test_skinny_head_leaves_a_packed_head_alone() -> None:
    model = _model(torch.float32)
    with torch.no_grad(), packed_linears(model, 4):
        packed_forward = model.lm_head.__dict__["forward"]
        with skinny_head(model):
            assert model.lm_head.__dict__["forward"] is packed_forward
        assert model.lm_head.__dict__["forward"] is packed_forward
    assert "forward" not in model.lm_head.__dict__


def test_the_engine_lists_the_copies_and_the_switch_turns_packing_off() -> None:
    stack = _stack(torch.bfloat16)
    n, size = packed_size(stack.lm)
    layers = _linears(stack.lm)  # the frozen base's linear layers and the LM head, not the LoRA A, B
    assert len(layers) == 2 * 7 + 1 and len(_linears(stack.lm, frozen=False)) > len(layers)
    assert n == sum(m.weight.numel() for m in layers) and size == sum(m.weight.numel() * m.weight.element_size() for m in layers)
    engine = hf_engine(stack=stack, tokenizer=TOK, config=load_config(overrides={"model.dtype": "bfloat16"}))
    assert engine.pack and ("hf engine: prepacked linear weights (while generating)", n, size) in engine.memory()
    off = hf_engine(stack=stack, tokenizer=TOK, config=load_config(overrides={"engine.pack_weights": False}))
    assert not off.pack and not any("prepacked" in row[0] for row in off.memory())


def test_a_weight_onednn_refuses_to_pack_leaves_its_layer_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without bfloat16 support in oneDNN: `_reorder_linear_weight` raises; decoding runs plain."""
    stack = _stack(torch.bfloat16)
    plain = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=False).generate(_request())

    def refuse(*_: object) -> None:
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw, avx512vl and avx512dq")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    with torch.no_grad(), packed_linears(stack.lm, 8):
        assert not any("forward" in m.__dict__ for m in _linears(stack.lm, frozen=False))
    packed = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=True).generate(_request())
    assert torch.equal(packed.response_ids, plain.response_ids)  # the plain path itself: the same bits
    assert packed.logprobs is not None and plain.logprobs is not None and torch.equal(packed.logprobs, plain.logprobs)
