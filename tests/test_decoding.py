"""The decode-time savings of models/decoding.py: a KV cache with reserved room and the skinny LM head."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model
from transformers import DynamicCache

from llmrl.models.decoding import SKINNY_ROWS, ReservedCache, ReservedLayer, skinny_head, skinny_linear

from tests.conftest import make_tiny_model


def _decode(model, cache, steps: int, reorder: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Logits of a (4, 5) prefill then `steps` greedy (N, 1) steps; `reorder` gathers rows after the prefill."""
    ids = torch.randint(3, model.config.vocab_size, (4, 5), generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(ids)
    out = []
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True).logits[:, -1:]
        if reorder is not None:
            cache.reorder_cache(reorder)
            logits, attention = logits[reorder], attention[reorder]
        for _ in range(steps):
            out.append(logits[:, -1])
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
            logits = model(input_ids=logits[:, -1].argmax(-1)[:, None], attention_mask=attention,
                           past_key_values=cache, use_cache=True).logits
    return out


def test_reserved_cache_decodes_exactly_as_the_dynamic_cache() -> None:
    # The same keys and values reach the attention (views of a buffer instead of fresh torch.cat
    # results), so every logit is the same float: torch.equal, no tolerance. reserve=2 < 6 steps
    # exercises the regrowth path twice; the reorder (4 rows → 6, as after a shared-prompt prefill)
    # the copy of gathered rows into a new buffer.
    model = make_tiny_model()
    for reorder in (None, torch.tensor([0, 0, 1, 2, 3, 3])):
        for reserve in (2, 10):
            plain = _decode(model, DynamicCache(), 6, reorder)
            reserved_cache = ReservedCache(reserve)
            reserved = _decode(model, reserved_cache, 6, reorder)
            assert all(torch.equal(a, b) for a, b in zip(plain, reserved, strict=True))
            layer = reserved_cache.layers[0]
            assert isinstance(layer, ReservedLayer) and reserved_cache.get_seq_length() == 5 + 6  # the prefill, then one position per step


def test_reserved_layer_writes_in_place_while_there_is_room() -> None:
    layer = ReservedLayer(reserve=3)
    k = torch.arange(2 * 1 * 2 * 4, dtype=torch.float32).reshape(2, 1, 2, 4)
    keys, _ = layer.update(k, -k)
    buffer = layer._key_buffer
    assert buffer is not None and buffer.shape == (2, 1, 2 + 3, 4)
    for i in range(3):  # three more positions fit: the same buffer, no copy
        step = torch.full((2, 1, 1, 4), float(i))
        keys, values = layer.update(step, -step)
        assert layer._key_buffer is buffer and keys.data_ptr() == buffer.data_ptr()
    assert keys.shape == (2, 1, 5, 4) and torch.equal(keys[:, :, :2], k) and torch.equal(values[:, :, 4], -step[:, :, 0])
    layer.update(step, -step)  # the sixth position does not fit: a new buffer, the past copied once
    assert layer._key_buffer is not buffer and torch.equal(layer.keys[:, :, :2], k) and layer.get_seq_length() == 6


def test_skinny_head_matches_the_linear_layer_and_is_removed_after() -> None:
    # Each logit is the same H-term dot product computed through the other operand order; in float32
    # the two sums can differ only by rounding, |Σ| · H · 2^-24 ≈ 1e-6 for H = 32 and |logit| < 1,
    # well inside atol 1e-5.
    model = make_tiny_model()
    head = model.get_output_embeddings()
    x = torch.randn(7, 1, head.in_features, generator=torch.Generator().manual_seed(1))
    expected = head(x)
    with skinny_head(model):
        assert "forward" in vars(head)
        got = head(x)
    assert "forward" not in vars(head)
    assert got.shape == expected.shape and got.is_contiguous()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    many = torch.randn(SKINNY_ROWS + 1, head.in_features)
    assert torch.equal(skinny_linear(head, many), head(many))  # many rows: the plain path itself


def test_skinny_head_leaves_an_adapted_lm_head_alone() -> None:
    model = get_peft_model(make_tiny_model(), LoraConfig(r=2, target_modules=["lm_head"]))
    head = model.get_output_embeddings()
    with skinny_head(model):
        assert "forward" not in vars(head)
