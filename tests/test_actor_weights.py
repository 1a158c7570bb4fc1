"""The vllm engine's merged sync is built one decoder layer at a time (engines/actor_weights.buckets):
the same tensors as all at once, never a fused group split, and a peak of one layer's W′."""

from __future__ import annotations

import torch

from llmrl.config.schema import LoraConfig
from llmrl.engines.actor_weights import FUSED, actor_tensors, buckets, changed_names
from llmrl.models.stack import PolicyStack, of_adapter

from tests.conftest import make_tiny_model


def _stack() -> PolicyStack:
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model(), LoraConfig(r=4, alpha=8.0, modules_to_save=["norm", "lm_head"]),
                        with_critic=False)
    with torch.no_grad():
        for name, p in stack.peft.named_parameters():
            if of_adapter(name, "actor"):
                p.normal_(std=0.3)
    return stack


def test_buckets_are_whole_layers_in_order() -> None:
    names = changed_names(_stack())
    cut = buckets(names)
    assert [n for b in cut for n in b] == names  # nothing lost, nothing reordered
    # 2 decoder layers (q k v o gate up down and both norms each), then the final norm, then the head
    assert [len(b) for b in cut] == [9, 9, 1, 1]
    assert cut[0][0].startswith("model.layers.0.") and all(n.startswith("model.layers.0.") for n in cut[0])
    assert cut[2:] == [["model.norm.weight"], ["lm_head.weight"]]
    for bucket in cut:  # a fused group (q, k, v) lands in one bucket, whole
        for group in FUSED:
            leaves = {n.split(".")[-2] for n in bucket}
            assert not leaves & set(group) or set(group) <= leaves


def test_bucketed_tensors_equal_all_at_once_and_peak_at_one_layer() -> None:
    stack = _stack()
    names = changed_names(stack)
    whole = actor_tensors(stack, names, torch.float32)
    sizes = []
    for bucket in buckets(names):
        part = actor_tensors(stack, bucket, torch.float32)
        assert all(torch.equal(part[n], whole[n]) for n in bucket)
        sizes.append(sum(t.numel() * t.element_size() for t in part.values()))
    total = sum(t.numel() * t.element_size() for t in whole.values())
    assert sum(sizes) == total and max(sizes) < total / 2
