"""The decode-time saving of models/decoding.py: the skinny LM head."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from llmrl.models.decoding import SKINNY_ROWS, skinny_head, skinny_linear

from tests.conftest import make_tiny_model


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
