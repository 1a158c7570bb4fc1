"""models/attention.py: unpadded half-precision decoding steps on the CPU sent down SDPA's packed path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from llmrl.config.schema import ModelConfig
from llmrl.errors import ConfigError
from llmrl.models.attention import NAME, attention_for, cpu_half_attention, set_attention
from llmrl.models.load import load_base

from tests.conftest import make_tiny_model


class _Layer(torch.nn.Module):
    num_key_value_groups = 3  # 9 query heads on 3 key/value heads, SmolLM2's grouping
    is_causal = True


def _qkv(dtype: torch.dtype, n_q: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 9, n_q, 16, generator=g).to(dtype)
    k, v = (torch.randn(4, 3, 7, 16, generator=g).to(dtype) for _ in range(2))
    return q, k, v


def test_an_unpadded_bfloat16_decoding_step_takes_the_packed_path(monkeypatch) -> None:
    # No mask: transformers would call SDPA with enable_gqa=True on (4, 9, 1, 16) queries (the slow CPU
    # kernel in bfloat16). With the all-True mask it packs each group's 3 heads onto the query axis:
    # SDPA sees (4, 3, 3, 16) queries and no enable_gqa. The result is SDPA's with that mask, bit for bit,
    # and the enable_gqa path's within bfloat16 rounding (|o| < 4: 3e-2).
    q, k, v = _qkv(torch.bfloat16)
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, **kw):
        seen.append((tuple(query.shape), kw.get("enable_gqa", False), kw.get("attn_mask") is not None))
        return sdpa(query, key, value, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ours, weights = cpu_half_attention(_Layer(), q, k, v, None, scaling=0.25)
    assert seen == [((4, 3, 3, 16), False, True)] and weights is None and ours.shape == (4, 1, 9, 16)
    everything = torch.ones(4, 1, 1, 7, dtype=torch.bool)
    masked, _ = sdpa_attention_forward(_Layer(), q, k, v, everything, scaling=0.25)
    gqa, _ = sdpa_attention_forward(_Layer(), q, k, v, None, scaling=0.25)
    assert seen[-1] == ((4, 9, 1, 16), True, False)  # transformers' own call without a mask
    assert torch.equal(ours, masked)
    torch.testing.assert_close(ours.float(), gqa.float(), atol=3e-2, rtol=0)


def test_every_other_call_is_sdpa_bit_for_bit() -> None:
    # float32 decoding (there enable_gqa is the faster kernel), a bfloat16 prefill of 5 queries, and a
    # bfloat16 decoding step that carries a padding mask: untouched.
    layer = _Layer()
    mask = torch.ones(4, 1, 1, 7, dtype=torch.bool)
    mask[0, ..., :2] = False
    for dtype, n_q, m in [(torch.float32, 1, None), (torch.bfloat16, 5, None), (torch.bfloat16, 1, mask)]:
        q, k, v = _qkv(dtype, n_q)
        ours, _ = cpu_half_attention(layer, q, k, v, m, scaling=0.3, is_causal=True)
        theirs, _ = sdpa_attention_forward(layer, q, k, v, m, scaling=0.3, is_causal=True)
        assert torch.equal(ours, theirs), (dtype, n_q, m is None)


def test_a_bfloat16_model_decodes_through_it_like_through_sdpa() -> None:
    # The tiny Llama (4 heads on 2 key/value heads) in bfloat16, unpadded rows, a prefill then 4 decoding
    # steps through a KV cache: 'auto' picks this module on the CPU, and each step's logits stay within
    # bfloat16 rounding of SDPA's enable_gqa kernel (the model's logits are O(1): 0.1); the prefill is SDPA's in both.
    model = make_tiny_model().to(torch.bfloat16)
    assert attention_for("auto", model) == NAME and attention_for("auto", make_tiny_model()) == "sdpa"
    ids = torch.randint(3, model.config.vocab_size, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)

    def decode(setting: str) -> list[torch.Tensor]:
        set_attention(model, setting)
        cache, attention, out = DynamicCache(), mask.clone(), []
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attention, cache=cache).logits[:, -1]
            for _ in range(4):
                out.append(logits.float())
                attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
                logits = model(input_ids=logits.argmax(-1)[:, None], attention_mask=attention, cache=cache).logits[:, -1]
        return out

    ours, theirs = decode("auto"), decode("sdpa")
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(ours[0], theirs[0])  # the prefill: SDPA in both
    for a, b in zip(ours[1:], theirs[1:], strict=True):
        torch.testing.assert_close(a, b, atol=0.1, rtol=0)


def test_load_base_sets_it_and_a_saved_model_does_not_name_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    # A bfloat16 model loaded on the CPU decodes through this module; float32 keeps SDPA; 'sdpa' pins it. The
    # name never reaches config.json, so what `llmrl export` saves loads in plain transformers.
    half, _ = load_base(ModelConfig(name=str(tiny_model_dir), dtype="bfloat16"), show_progress=False)
    full, _ = load_base(ModelConfig(name=str(tiny_model_dir), dtype="float32"), show_progress=False)
    pinned, _ = load_base(ModelConfig(name=str(tiny_model_dir), dtype="bfloat16", attention="sdpa"), show_progress=False)
    assert half.config._attn_implementation == NAME
    assert full.config._attn_implementation == "sdpa" and pinned.config._attn_implementation == "sdpa"
    half.save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()
    assert "attn" not in "".join(json.loads((tmp_path / "config.json").read_text()))
    AutoModelForCausalLM.from_pretrained(tmp_path)  # loads in plain transformers


def test_auto_leaves_a_model_not_loaded_with_sdpa_as_it_is_and_a_named_kernel_it_refuses_is_one_sentence(
        monkeypatch) -> None:
    # 'auto' wraps SDPA only: a bfloat16 model running transformers' eager attention keeps it (a model
    # class without SDPA is loaded that way), and a float32 one keeps what it was loaded with.
    model = make_tiny_model().to(torch.bfloat16)
    model.set_attn_implementation("eager")
    assert attention_for("auto", model) == "eager" and set_attention(model, "auto") == "eager"
    assert model.config._attn_implementation == "eager"

    def refuse(_name: str) -> None:  # what transformers raises for a class that lacks a kernel
        raise ValueError("LlamaForCausalLM does not support an attention implementation through torch.nn.functional.scaled_dot_product_attention yet.")

    monkeypatch.setattr(model, "set_attn_implementation", refuse)
    with pytest.raises(ConfigError, match=r"^model.attention=sdpa is not available for this model: LlamaForCausalLM"):
        set_attention(model, "sdpa")
    model.config._attn_implementation = "sdpa"  # loaded with SDPA: 'auto' would re-route, the class refuses
    assert set_attention(model, "auto") == "sdpa" and model.config._attn_implementation == "sdpa"
