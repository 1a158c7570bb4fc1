"""The `hf` engine decodes the actor through W + s·B·A (models/merged.py): the actor's tokens and
log-probs, no LoRA product on the way, and the base given back bit for bit."""

from __future__ import annotations

import pytest
import torch

from llmrl.config.schema import LoraConfig
from llmrl.engines.base import GenerationRequest, SamplingSettings, row_keys
from llmrl.engines.hf import HFEngine
from llmrl.models.merged import merged_actor, mergeable
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer

from tests.conftest import make_tiny_model

TOK = build_char_tokenizer()


def _stack(**lora: object) -> PolicyStack:
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model(), LoraConfig(r=4, **lora), with_critic=True)
    for p in stack.parameters_of("actor"):  # B ≠ 0: the actor is far from the base
        torch.nn.init.normal_(p, std=0.3)
    return stack


def _request(greedy: bool, role: str = "actor") -> GenerationRequest:
    ids = torch.tensor([TOK.encode(p) for p in ("12+34=", "56+7=9", "8*9=72")])
    mask = torch.ones_like(ids, dtype=torch.bool)
    g = 3
    keys = None if greedy else row_keys(7, 1, torch.arange(3).repeat_interleave(g), torch.arange(g).repeat(3))
    return GenerationRequest(ids, mask, g, SamplingSettings(6), keys, logprobs=True, role=role)


def _lora_calls(stack: PolicyStack) -> list[int]:
    """A counter of forwards through any lora_A module (the unmerged adapter path)."""
    calls = [0]
    for name, m in stack.peft.named_modules():
        if name.endswith("lora_A.actor"):
            m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("greedy", [True, False])
def test_merged_decoding_draws_the_actors_tokens_with_its_logprobs_and_no_lora_product(greedy: bool) -> None:
    stack = _stack()
    assert mergeable(stack)
    calls = _lora_calls(stack)
    plain = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, merge=False).generate(_request(greedy))
    through_adapters = calls[0]
    merged = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, merge=True).generate(_request(greedy))
    assert through_adapters > 0 and calls[0] == through_adapters  # the merged decode ran no LoRA product
    assert torch.equal(merged.response_ids, plain.response_ids) and torch.equal(merged.response_mask, plain.response_mask)
    assert merged.logprobs is not None and plain.logprobs is not None
    assert float(plain.logprobs.abs().max()) > 0.5
    # W′x vs Wx + s·B(Ax) in float32: the same logits up to rounding (~1e-6 here), far inside 1e-4
    torch.testing.assert_close(merged.logprobs, plain.logprobs, atol=1e-4, rtol=0)


def test_the_base_gets_back_its_own_tensors_and_the_reference_is_unchanged_bit_for_bit() -> None:
    stack = _stack()
    base = {n: p for n, p in stack.peft.named_parameters() if "base_layer" in n}
    before = {n: (p.data.data_ptr(), p.detach().clone()) for n, p in base.items()}
    ids = torch.tensor([TOK.encode("12+34=5")])

    def reference_logits() -> torch.Tensor:
        with stack.use("reference"):
            return stack.lm(input_ids=ids).logits

    ref = reference_logits()
    with pytest.raises(RuntimeError, match="boom"), stack.use("actor"), merged_actor(stack):
        assert not torch.equal(next(iter(base.values())), before[next(iter(base))][1])  # W′ is in place
        raise RuntimeError("boom")  # the body fails: W comes back all the same
    HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id).generate(_request(False))
    for n, p in base.items():
        assert p.data.data_ptr() == before[n][0] and torch.equal(p, before[n][1]), n
    assert torch.equal(reference_logits(), ref)
    with stack.use("actor"):  # the adapters are active again: the actor is not the base
        assert not torch.allclose(stack.lm(input_ids=ids).logits, ref, atol=1e-3)


def test_the_reference_role_and_a_trained_module_copy_decode_through_the_adapters() -> None:
    stack = _stack(modules_to_save=["norm"])
    assert not mergeable(stack)  # the trained norm copy is not a LoRA product: it cannot merge
    calls = _lora_calls(stack)
    merged = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, merge=True).generate(_request(True))
    assert calls[0] > 0
    plain = HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, merge=False).generate(_request(True))
    assert torch.equal(merged.response_ids, plain.response_ids) and torch.equal(merged.logprobs, plain.logprobs)
    stack = _stack()
    calls = _lora_calls(stack)
    HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id).generate(_request(True, role="reference"))
    assert calls[0] == 0  # the reference runs no adapter either way, and W is the base's


def test_a_bfloat16_actor_decodes_through_its_adapters() -> None:
    stack = _stack()
    stack.peft.to(torch.bfloat16)
    assert not mergeable(stack)  # s·B·A rounded into bfloat16's 8-bit mantissa would lose small updates
    calls = _lora_calls(stack)
    HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id).generate(_request(True))
    assert calls[0] > 0


def test_the_start_up_table_counts_the_merged_copy_and_a_nested_merge_is_refused() -> None:
    stack = _stack()
    adapted = [m.get_base_layer().weight for n, m in stack.peft.named_modules() if hasattr(m, "lora_A") and "actor" in m.lora_A]
    n = sum(w.numel() for w in adapted)
    assert n > 0
    assert HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id).memory() == [
        ("hf engine: merged actor W + s·B·A (while generating)", n, 4 * n)]  # float32: 4 bytes a number
    assert HFEngine(stack, TOK.eos_token_id, TOK.pad_token_id, merge=False).memory() == []
    assert HFEngine(_stack(modules_to_save=["norm"]), TOK.eos_token_id, TOK.pad_token_id).memory() == []
    with stack.use("actor"), merged_actor(stack):
        assert not mergeable(stack)  # already merged: a second merge would add s·B·A twice
    assert mergeable(stack)


def test_episodes_through_the_kept_cache_decode_the_merged_actor_as_the_adapters_do() -> None:
    from tests.test_hf_turns import _episodes, _engine

    merged, plain = _engine(), _engine()
    plain.merge = False
    calls = _lora_calls(merged.stack)
    a, b = _episodes(merged, reuse_cache=True), _episodes(plain, reuse_cache=True)
    assert calls[0] == 0  # every turn of every episode decoded through W′
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.context_mask, b.context_mask)
    torch.testing.assert_close(a.behaviour_logprobs, b.behaviour_logprobs, atol=1e-4, rtol=0)
