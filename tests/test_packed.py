"""The `hf` engine decodes through prepacked linear weights (models/packed.py): the same products as
the plain layers, the same tokens, every layer given back its own forward, and nothing packed for
the built-in tiny model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from peft.tuners.lora import LoraLayer
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl import load_config
from llmrl.config.schema import LoraConfig
from llmrl.engines.base import GenerationRequest, SamplingSettings, row_keys
from llmrl.engines.hf import HFEngine, hf_engine, key_uniforms
from llmrl.models.decoding import skinny_head
from llmrl.models.merged import merged_actor
from llmrl.models.packed import packable, packed_linears, packed_size
from llmrl.models.stack import PolicyStack
from llmrl.step.forward import masked_logprobs
from llmrl.step.records import TrainRows
from llmrl.models.tokenizer import build_char_tokenizer

from tests.conftest import make_tiny_model

TOK = build_char_tokenizer()
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN has no bfloat16 on this CPU: nothing is packed"))
DTYPES = [torch.float32, BF16]


def _model(dtype: torch.dtype, hidden: int = 256, bias: bool = False) -> LlamaForCausalLM:
    """A random 2-layer Llama as wide as packing asks for (hidden 256), the char tokenizer's vocabulary;
    `bias`: q, k, v, o with biases (as Qwen2's q, k, v)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(TOK), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=2 * hidden, max_position_embeddings=64, attention_bias=bias,
                      pad_token_id=TOK.pad_token_id, bos_token_id=TOK.bos_token_id, eos_token_id=TOK.eos_token_id)
    return LlamaForCausalLM(cfg).to(dtype).eval().requires_grad_(False)  # frozen, as a stack's base


def _random_biases(model: LlamaForCausalLM) -> None:
    """q, k, v, o biases ~ N(0, 0.5²) where `model` has them (transformers initialises them to zero)."""
    for layer in model.model.layers:
        attention = layer.self_attn
        for proj in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj):
            if proj.bias is not None:
                torch.nn.init.normal_(proj.bias, std=0.5)


def _stack(dtype: torch.dtype, critic: bool = False, bias: bool = False) -> PolicyStack:
    """A PolicyStack on `_model` with LoRA r=4 on every linear layer of the 2 (and a critic's adapter), B ≠ 0;
    `bias`: random q, k, v, o biases."""
    model = _model(dtype, bias=bias)
    _random_biases(model)
    stack = PolicyStack(model, LoraConfig(r=4), with_critic=critic)
    for p in stack.parameters_of("actor"):  # B ≠ 0: the adapters' products count
        torch.nn.init.normal_(p, std=0.05)
    return stack


def _request() -> GenerationRequest:
    """2 prompts × 4 samples, 8 new tokens, keyed uniforms, log-probs."""
    ids = torch.tensor([TOK.encode(p) for p in ("12+34=", "56+7=9")])
    keys = row_keys(3, 0, torch.arange(2).repeat_interleave(4), torch.arange(4).repeat(2))
    return GenerationRequest(ids, torch.ones_like(ids, dtype=torch.bool), 4, SamplingSettings(8), keys, logprobs=True)


def _linears(model: nn.Module, base: bool = True) -> list[nn.Linear]:
    """The model's nn.Linear modules: the base's (no peft adapter part in the name), or every one."""
    return [m for n, m in model.named_modules() if type(m) is nn.Linear and (not base or "lora_" not in n)]


def _parted_at_near_ties(stack: PolicyStack, a: torch.Tensor, b: torch.Tensor, tol: float) -> int:
    """How many rows of two decodings of `_request()` (response ids `a`, `b`) draw different tokens;
    each must part at a near tie. A row draws token i where F_{i−1} ≤ u < F_i (u: its keyed uniform
    at that step, F: the CDF of softmax(logits) in vocabulary order, `engines/hf_decode.py`), so with
    CDFs within tol of the actor's (recomputed here by a plain forward of the prompt and the common
    tokens), each of the two tokens drawn at the first differing step satisfies F_{i−1} − tol ≤ u < F_i + tol."""
    request = _request()
    u = key_uniforms(request.keys, request.settings.max_new_tokens)
    prompts = request.prompt_ids.repeat_interleave(request.num_samples, 0)  # rows are prompt-major
    same = (a == b).long().cumprod(1).sum(1)  # per row, the steps before the first difference
    parted = [row for row in range(a.shape[0]) if int(same[row]) < a.shape[1]]
    for row in parted:
        t = int(same[row])
        ids = torch.cat([prompts[row], a[row, :t]])[None]
        with torch.no_grad(), stack.use("actor"):
            cdf = torch.softmax(stack.lm(input_ids=ids).logits[0, -1].double(), -1).cumsum(-1)
        x = float(u[row, t]) * float(cdf[-1])
        for token in (int(a[row, t]), int(b[row, t])):
            low = float(cdf[token - 1]) if token else 0.0
            assert low - tol <= x < float(cdf[token]) + tol, (
                f"row {row} parts at step {t}: token {token} spans [{low:.4f}, {float(cdf[token]):.4f}) of the CDF, "
                f"its uniform is {x:.4f}")
    return len(parted)


def test_a_parting_far_from_a_tie_is_caught() -> None:
    """The near-tie check can fail: one token of a decoding changed by hand is no near tie."""
    stack = _stack(torch.float32)
    plain = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=False).generate(_request())
    assert _parted_at_near_ties(stack, plain.response_ids, plain.response_ids, 2e-4) == 0
    moved = plain.response_ids.clone()
    moved[3, 2] = (moved[3, 2] + 1) % len(TOK)
    with pytest.raises(AssertionError, match="row 3 parts at step 2"):
        _parted_at_near_ties(stack, plain.response_ids, moved, 2e-4)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of calls of oneDNN's packed product."""
    calls, original = [0], torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise",
                        lambda *a: (calls.__setitem__(0, calls[0] + 1), original(*a))[1])
    return calls


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_linear_layer_runs_packed_with_the_plain_products_numbers_and_gets_its_forward_back(dtype, bias) -> None:
    model = _model(dtype, bias=bias)
    _random_biases(model)
    assert (model.model.layers[0].self_attn.q_proj.bias is not None) == bias
    assert packable(model)
    layers = _linears(model)
    weights = [m.weight for m in layers]
    x = {m: torch.randn(8, m.in_features).to(dtype) for m in layers}
    plain = {m: m(x[m]) for m in layers}
    with torch.no_grad(), packed_linears(model, 8):
        assert all("forward" in m.__dict__ for m in layers)  # every one rerouted, the LM head too
        with pytest.MonkeyPatch.context() as mp:
            calls = _counting(mp)
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
        assert "forward" in layer.__dict__
        y = layer(x)
    y.sum().backward()
    assert y.grad_fn is not None and x.grad is not None
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(3, -1), atol=1e-5, rtol=0)  # ∂Σy/∂x = Σ_out W


@pytest.mark.parametrize("dtype", DTYPES)
def test_decoding_through_packed_weights_draws_the_same_tokens(dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = _stack(dtype, bias=True)  # q, k, v, o biases (as Qwen2's q, k, v): a product must add its bias
    request = _request()
    with torch.no_grad(), stack.use("actor"):
        top = float(stack.lm(input_ids=request.prompt_ids).logits.abs().max())
    assert top < 1  # the premise of the tolerances below
    plain = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=False).generate(request)
    calls = _counting(monkeypatch)
    packed = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=True).generate(request)
    # prefill + 7 decoding steps, each through the 2 × 7 layers and the head
    assert calls[0] == 8 * (2 * 7 + 1)
    assert packed.logprobs is not None and plain.logprobs is not None
    # δ: how far one path's logits may lie from another's. float32: another kernel's sums, ~1e-6 apart;
    # δ = 1e-4. bfloat16 (8 significant bits): both kernels accumulate in float32 and round each product
    # once, so a product's outputs are at most one rounding step apart (the same bits on the AMD EPYC of
    # docs/performance.md). The logits are below 1 here (asserted above), where a step is 2^-8: the head's
    # own rounding, one step; the steps of the products below it reach the logits through the final norm
    # and the head's random-signed sum, Σ_j W_vj·Δh_j ≈ √256 · 0.02 · 2^-8 per step of h, under one step
    # more: δ = 2·2^-8 = 2^-7. Logits that move by ≤ δ move each p_j by ≤ 2δ·p_j, so each CDF value F_i by
    # ≤ 2δ·min(F_i, 1 − F_i) ≤ δ, and as much again between the plain decoding and the check's own forward
    # (unmerged LoRA): where a row parts, both tokens drawn hold its uniform within tol = 2δ of their spans
    # of the check's CDF; before that, log p = z − logsumexp(z) moves by ≤ 2δ between packed and plain.
    # (Up to now tol was 0.08 in bfloat16, a logit of size 10 assumed: at a vocabulary of 21 tokens, p ≈ 0.05
    # each, a window of ±0.08 held a token or two beside the one drawn.)
    delta = 1e-4 if dtype == torch.float32 else 2**-7
    _parted_at_near_ties(stack, plain.response_ids, packed.response_ids, 2 * delta)
    until = (packed.response_ids == plain.response_ids).long().cumprod(1).bool()
    torch.testing.assert_close(packed.logprobs[until], plain.logprobs[until], atol=2 * delta, rtol=0)
    # and at every token, parted or not: the packed decoding's log μ against the stack's forward log π of the
    # same tokens (two paths from it, packing and the merged LoRA: logits ≤ 2δ apart, log p ≤ 4δ)
    rows = TrainRows(request.prompt_ids.repeat_interleave(4, 0), request.prompt_mask.repeat_interleave(4, 0),
                     packed.response_ids, packed.response_mask)
    with torch.no_grad(), stack.use("actor"):
        trained = masked_logprobs(stack, rows, 1.0)
    torch.testing.assert_close(packed.logprobs * packed.response_mask, trained, atol=4 * delta, rtol=0)
    assert not any("forward" in m.__dict__ for m in _linears(stack.lm, base=False))


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


def test_a_weight_replaced_inside_the_block_runs_plain() -> None:
    model = _model(torch.float32)
    layer = model.model.layers[1].mlp.up_proj
    x = torch.randn(4, layer.in_features)
    with torch.no_grad(), packed_linears(model, 4):
        layer.weight = nn.Parameter(2 * layer.weight, requires_grad=False)  # as a merge would
        assert torch.equal(layer(x), nn.functional.linear(x, layer.weight))  # the new W, the plain product


def test_the_engine_lists_the_copies_and_the_switch_turns_packing_off() -> None:
    stack = _stack(torch.float32, critic=True)  # two adapters: the critic's A, B are frozen while the actor acts
    n, size = packed_size(stack.lm)
    layers = _linears(stack.lm)  # the base's linear layers and the LM head, no adapter's A, B
    assert len(layers) == 2 * 7 + 1 and len(_linears(stack.lm, base=False)) == len(layers) + 2 * 7 * 2 * 2
    assert n == sum(m.weight.numel() for m in layers) and size == sum(m.weight.numel() * m.weight.element_size() for m in layers)
    engine = hf_engine(stack=stack, tokenizer=TOK, config=load_config())  # the actor merges into its packed copies
    assert engine.pack and engine.memory() == [
        ("hf engine: prepacked linear weights, the actor's LoRA merged in (while generating)", n, size)]
    unmerged = hf_engine(stack=stack, tokenizer=TOK, config=load_config(overrides={"engine.merge_lora": False}))
    assert unmerged.memory() == [("hf engine: prepacked linear weights (while generating)", n, size)]
    off = hf_engine(stack=stack, tokenizer=TOK, config=load_config(overrides={"engine.pack_weights": False}))
    assert not off.pack and not any("prepacked" in row[0] for row in off.memory())


def _decodes_plain(stack, plain) -> None:
    """Nothing packs (no layer rerouted, no copy counted) and `pack=True` decodes exactly as `plain`, the
    engine's `pack=False` generation: the plain path itself, the same bits."""
    assert not packable(stack.lm) and packed_size(stack.lm) == (0, 0)
    with torch.no_grad(), packed_linears(stack.lm, 8):
        assert not any("forward" in m.__dict__ for m in _linears(stack.lm, base=False))
    packed = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=True).generate(_request())
    assert torch.equal(packed.response_ids, plain.response_ids)  # the plain path itself: the same bits
    assert packed.logprobs is not None and plain.logprobs is not None and torch.equal(packed.logprobs, plain.logprobs)


def test_a_cpu_without_bfloat16_in_onednn_packs_no_bfloat16_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where oneDNN has no bfloat16 (`_reorder_linear_weight` would raise), a bfloat16 model decodes plain."""
    stack = _stack(torch.bfloat16)
    plain = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=False).generate(_request())
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    _decodes_plain(stack, plain)


@pytest.mark.parametrize("missing", ["_reorder_linear_weight", "_linear_pointwise", "_is_mkldnn_bf16_supported"])
def test_a_torch_without_the_private_ops_decodes_plain(missing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN's packing ops are private to torch (`torch.ops.mkldnn`): a torch without one of them (hidden
    here) packs nothing, and the engine's `pack=True` decodes through the plain products, bit for bit."""
    stack = _stack(torch.float32)
    plain = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=False).generate(_request())
    ops = torch.ops.mkldnn
    kept = {name: getattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise", "_is_mkldnn_bf16_supported")}
    del kept[missing]
    monkeypatch.setattr(torch.ops, "mkldnn", SimpleNamespace(**kept))  # getattr of `missing` raises AttributeError
    _decodes_plain(stack, plain)


def test_the_merged_actor_is_packed_straight_without_a_merged_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """merge + pack: W′ = W + s·B·A exists only as its packed copy; the base's tensors are never replaced."""
    stack = _stack(torch.float32)
    adapted = [m.get_base_layer() for m in stack.peft.modules() if isinstance(m, LoraLayer)]
    originals = [m.weight.data_ptr() for m in adapted]
    merged = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=False).generate(_request())
    seen: list[int] = []
    hooks = [m.register_forward_pre_hook(lambda mod, _: seen.append(mod.weight.data_ptr())) for m in adapted]
    calls = _counting(monkeypatch)
    fused = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, pack=True).generate(_request())
    for h in hooks:
        h.remove()
    assert calls[0] == 8 * (2 * 7 + 1)  # every adapted layer and the head ran packed, at every step
    assert set(seen) <= set(originals) and len(seen) == 8 * 2 * 7  # W itself stayed in place: no W′ tensor
    # the same W′ (packed product vs MKL's plain one, ~1e-6 apart in float32): the same tokens until a near
    # tie, both tokens then within 2e-4 of the uniform (CDFs ≤ 1e-4 apart, the check's forward as much again)
    _parted_at_near_ties(stack, merged.response_ids, fused.response_ids, 2e-4)
    until = (fused.response_ids == merged.response_ids).long().cumprod(1).bool()
    torch.testing.assert_close(fused.logprobs[until], merged.logprobs[until], atol=1e-4, rtol=0)
    assert [m.weight.data_ptr() for m in adapted] == originals and not any("forward" in m.__dict__ for m in adapted)
    # a call the packed copy cannot take (gradients on) computes W·x + s·B·(A·x) through the adapter
    layer = next(m for m in stack.peft.modules() if isinstance(m, LoraLayer))
    x = torch.randn(3, layer.get_base_layer().in_features)
    with torch.no_grad(), stack.use("actor"):
        expected = layer(x)
    with stack.use("actor"), merged_actor(stack, pack_rows=3), torch.enable_grad():
        torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=0)
