"""One base, two adapters, a value head: roles differ, the base is shared and never trained."""

from __future__ import annotations

import gc

import torch

from llmrl.config.schema import LoraConfig, UpdateConfig
from llmrl.models.stack import PolicyStack, layout, token_logprobs
from llmrl.step.update import make_optimizers
from llmrl.run.memory import role_costs

from tests.conftest import make_tiny_model


def _batch():
    ids = torch.tensor([[0, 7, 8, 17], [5, 6, 14, 17]])  # left-padded prompts
    mask = ids != 0
    resp = torch.tensor([[9, 10, 2], [11, 2, 0]])
    rmask = torch.tensor([[True, True, True], [True, True, False]])
    return layout(ids, mask, resp, rmask), resp


def _stack() -> PolicyStack:
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model(), LoraConfig(r=4, alpha=8.0), with_critic=True)
    with torch.no_grad():  # LoRA B starts at zero; give both adapters non-zero, different weights
        for name, p in stack.peft.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    return stack


def test_roles_give_different_outputs_from_one_base() -> None:
    stack = _stack()
    seq, resp = _batch()
    with torch.no_grad():
        outs = {}
        for role in ("actor", "critic", "reference"):
            with stack.use(role):
                outs[role] = token_logprobs(stack.response_logits(seq, 1.0), resp)
        with stack.use("critic"):
            v = stack.values(seq)
    assert v.shape == (2, 3)
    assert not torch.allclose(outs["actor"], outs["reference"], atol=1e-3)
    assert not torch.allclose(outs["critic"], outs["reference"], atol=1e-3)
    assert not torch.allclose(outs["actor"], outs["critic"], atol=1e-3)
    # the reference is exactly the plain base model
    base = make_tiny_model()
    with torch.no_grad():
        logits = base(input_ids=seq.ids, attention_mask=seq.attention, position_ids=seq.positions).logits
    ref = token_logprobs(logits[:, seq.prompt_len - 1 : -1].float(), resp)
    torch.testing.assert_close(outs["reference"], ref, atol=1e-5, rtol=0)


def test_role_context_restores_the_active_adapter() -> None:
    stack = _stack()
    with stack.use("critic"):
        assert stack.peft.active_adapter == "critic"
        with stack.use("reference"):
            pass
    assert stack.peft.active_adapter == "actor"


def test_exactly_one_copy_of_the_base_weights() -> None:
    stack = _stack()
    base_names = [n for n, _ in stack.peft.named_parameters() if "lora_" not in n]
    base_bytes = sum(p.numel() * p.element_size() for n, p in stack.peft.named_parameters() if "lora_" not in n)
    # every tensor alive in the process whose storage matches a base weight's size is that weight
    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.numel() > 0:
            s = obj.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    base_ptrs = {p.untyped_storage().data_ptr() for n, p in stack.peft.named_parameters() if "lora_" not in n}
    assert len(base_ptrs) == len(base_names), "base parameters must not alias each other unexpectedly"
    assert base_ptrs <= set(storages)
    # the adapters and head are small; nothing else the size of the base lives in the stack
    stack_bytes = sum(p.numel() * p.element_size() for p in stack.parameters())
    adapters = sum(c.bytes for c in role_costs(stack)[1:4])
    assert stack_bytes == base_bytes + adapters
    # the critic and reference do not hold a second copy: same modules, same storages
    with stack.use("critic"):
        ptrs_critic = {p.untyped_storage().data_ptr() for n, p in stack.peft.named_parameters() if "lora_" not in n}
    assert ptrs_critic == base_ptrs


def test_optimizers_hold_only_adapter_and_head_parameters() -> None:
    stack = _stack()
    opts = make_optimizers(stack, UpdateConfig())
    base_ids = {id(p) for n, p in stack.peft.named_parameters() if "lora_" not in n}
    for opt in opts.values():
        for group in opt.param_groups:
            assert not base_ids & {id(p) for p in group["params"]}
    head_ids = {id(p) for p in stack.value_head.parameters()}
    assert head_ids <= {id(p) for g in opts["critic"].param_groups for p in g["params"]}
    assert not head_ids & {id(p) for g in opts["actor"].param_groups for p in g["params"]}


def test_modules_to_save_names_every_module_ending_with_the_entry() -> None:
    """lora.modules_to_save=['norm'] trains both norms of every decoder layer and the final norm, for the actor
    and the critic, whatever the installed peft's matching rule (peft 0.22 matches whole dotted components
    only, so 'norm' alone would be `model.norm`: 1 module where the tiny Llama has 2 × 2 + 1 = 5)."""
    from peft.utils import ModulesToSaveWrapper

    stack = PolicyStack(make_tiny_model(), LoraConfig(r=4, alpha=8.0, modules_to_save=["norm"]), with_critic=True)
    wrapped = sorted(n for n, m in stack.lm.named_modules() if isinstance(m, ModulesToSaveWrapper))
    assert wrapped == ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
                       "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm", "model.norm"]
    for name in wrapped:
        adapters = set(dict(stack.lm.named_modules())[name].modules_to_save)
        assert adapters == {"actor", "critic"}, (name, adapters)
