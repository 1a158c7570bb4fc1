"""The CPU half-precision decoding attention of models/attention.py, against hand-computed values and SDPA."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from llmrl.config.schema import ModelConfig
from llmrl.models.attention import NAME, attention_for, cpu_half_attention, set_attention
from llmrl.models.load import load_base

from tests.conftest import make_tiny_model


class _Layer(torch.nn.Module):
    num_key_value_groups = 2
    is_causal = True


def _hand_case() -> tuple[torch.Tensor, ...]:
    """B = 3 rows, H = 2 query heads sharing KVH = 1 key/value head, D = 2, L = 3 keys, one query token.
    Every number is exact in bfloat16."""
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).reshape(1, 2, 1, 2).repeat(3, 1, 1, 1)  # head 0: e1, head 1: e2
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]).reshape(1, 1, 3, 2).repeat(3, 1, 1, 1)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]).reshape(1, 1, 3, 2).repeat(3, 1, 1, 1)
    mask = torch.tensor([[True, True, True], [True, True, False], [False, False, False]]).reshape(3, 1, 1, 3)
    return q, k, v, mask


def test_decoding_attention_matches_the_hand_computed_softmax_in_bfloat16() -> None:
    # scaling 1: head 0's scores are q·k = [1, 0, 0], so p = [e, 1, 1] / (e + 2) = [0.576117, 0.211942, 0.211942]
    # and o = p · V = [0.576117 + 0.5·0.211942, 0.211942 + 0.5·0.211942] = [0.682088, 0.317913]; head 1 (scores
    # [0, 1, 0]) mirrors it. Row 1 masks key 3: p = [e, 1] / (e + 1) = [0.731059, 0.268941] = o (head 1 mirrored).
    # Row 2 masks every key: a finite floor gives each the same score, so o = mean(V) = [0.5, 0.5] (no NaN).
    # Tolerance: p and o are each rounded once to bfloat16 (8 significant bits): |error| ≤ 2 · 2⁻⁹ < 4e-3 for |o| ≤ 1.
    q, k, v, mask = (t.to(torch.bfloat16) if t.is_floating_point() else t for t in _hand_case())
    out, weights = cpu_half_attention(_Layer(), q, k, v, mask, scaling=1.0)
    assert weights is None and out.shape == (3, 1, 2, 2) and out.dtype == torch.bfloat16
    e = math.e
    a, b = (e + 0.5) / (e + 2), 1.5 / (e + 2)
    want = torch.tensor([[[a, b], [b, a]],
                         [[e / (e + 1), 1 / (e + 1)], [1 / (e + 1), e / (e + 1)]],
                         [[0.5, 0.5], [0.5, 0.5]]]).reshape(3, 1, 2, 2)
    torch.testing.assert_close(out.float(), want, atol=4e-3, rtol=0)


def test_grouped_heads_match_sdpa_on_random_bfloat16_inputs() -> None:
    # 9 query heads on 3 key/value heads (SmolLM2's grouping), left-padded rows: the same attention as
    # transformers' SDPA path, up to bfloat16 rounding of the scores and weights (|o| < 4 here: 3e-2).
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 9, 1, 16, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(4, 3, 7, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    mask = torch.ones(4, 1, 1, 7, dtype=torch.bool)
    mask[0, ..., :3] = False
    mask[2, ..., :1] = False
    layer = _Layer()
    layer.num_key_value_groups = 3
    ours, _ = cpu_half_attention(layer, q, k, v, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.25)
    torch.testing.assert_close(ours.float(), theirs.float(), atol=3e-2, rtol=0)


def test_everything_but_a_half_precision_decoding_query_is_sdpa_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(1)
    layer = _Layer()
    cases = [(torch.float32, 1), (torch.bfloat16, 5)]  # a float32 decoding step; a bfloat16 prefill of 5 queries
    for dtype, n_q in cases:
        q = torch.randn(2, 2, n_q, 8, generator=g).to(dtype)
        k, v = (torch.randn(2, 1, 5, 8, generator=g).to(dtype) for _ in range(2))
        ours, _ = cpu_half_attention(layer, q, k, v, None, scaling=0.3, is_causal=True)
        theirs, _ = sdpa_attention_forward(layer, q, k, v, None, scaling=0.3, is_causal=True)
        assert torch.equal(ours, theirs), (dtype, n_q)


def test_a_bfloat16_model_decodes_through_it_like_through_sdpa() -> None:
    # The tiny Llama (4 heads on 2 key/value heads) in bfloat16, left-padded rows, a prefill then 4 decoding
    # steps through a KV cache: 'auto' picks this module on the CPU, and each step's logits stay within
    # bfloat16 rounding of SDPA's (the model's logits are O(1): 0.1); the prefill is SDPA's in both.
    model = make_tiny_model().to(torch.bfloat16)
    assert attention_for("auto", model) == NAME and attention_for("auto", make_tiny_model()) == "sdpa"
    ids = torch.randint(3, model.config.vocab_size, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0

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
