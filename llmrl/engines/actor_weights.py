"""The actor's weights as the plain model's tensors: what an engine with its own copy of the model
needs after an update, and how to tell whether anything changed.

For a LoRA layer with frozen weight W (out, in), adapter matrices A (r, in), B (out, r) and
scale s = α / r, the actor's weight is W' = W + s·B·A (peft's `get_delta_weight`; for an embedding
(vocab, hidden) W' = W + s·(B·A)ᵀ from its `lora_embedding_A` (r, vocab) and `lora_embedding_B` (hidden, r)). A
`lora.modules_to_save` module (e.g. a trained norm) is replaced by the actor's trained copy.
Every other tensor of the model is the frozen base's and never changes.

Tensors are named as in the plain Hugging Face checkpoint (`model.layers.0.self_attn.q_proj.weight`),
which is what an inference engine's loader reads. Engines that stack several checkpoint tensors
into one kernel tensor (vLLM's qkv_proj, gate_up_proj) need every member of a stack pushed
together, so `changed_names` widens a changed tensor to its whole group (`FUSED`).
"""

from __future__ import annotations

from typing import Iterator

import torch
from peft.tuners.lora import LoraLayer
from peft.utils import ModulesToSaveWrapper
from torch import Tensor, nn

from ..models.stack import PolicyStack

ADAPTER = "actor"
PREFIX = "base_model.model."  # peft's wrapper path in front of the plain model's module names
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Sibling projections an engine may stack into one kernel tensor; all are pushed when one changes."""


def _plain(name: str) -> str:
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def _has_actor_lora(module: nn.Module) -> bool:
    """A LoRA layer with an actor adapter: a linear layer's (lora_A) or an embedding's (lora_embedding_A)."""
    return isinstance(module, LoraLayer) and (ADAPTER in module.lora_A or ADAPTER in module.lora_embedding_A)


def _factors(module: LoraLayer) -> tuple[Tensor, Tensor]:
    """The actor's (A, B) of a LoRA layer; s·B·A = 0 when either is all zero (peft starts a linear
    layer with B = 0, an embedding with A = 0)."""
    if ADAPTER in module.lora_A:
        return module.lora_A[ADAPTER].weight, module.lora_B[ADAPTER].weight
    return module.lora_embedding_A[ADAPTER], module.lora_embedding_B[ADAPTER]


def _adapted_modules(stack: PolicyStack) -> Iterator[tuple[str, nn.Module]]:
    """(plain module name, module) of every LoRA layer (linear or embedding) and modules_to_save
    wrapper holding an actor copy."""
    for name, module in stack.peft.named_modules():
        if _has_actor_lora(module):
            yield _plain(name), module
        elif isinstance(module, ModulesToSaveWrapper) and ADAPTER in module.modules_to_save:
            yield _plain(name), module


def _siblings(module_name: str) -> list[str]:
    """`module_name` and the other members of its `FUSED` group (same parent module)."""
    parent, _, leaf = module_name.rpartition(".")
    for group in FUSED:
        if leaf in group:
            return [f"{parent}.{g}" for g in group]
    return [module_name]


def changed_names(stack: PolicyStack) -> list[str]:
    """The plain names of the tensors the actor can change, widened to whole `FUSED` groups, in
    the model's order. (LoRA layers change `.weight`; a modules_to_save copy every tensor it has.)"""
    modules = dict(stack.peft.named_modules())
    wanted: list[str] = []
    for name, module in _adapted_modules(stack):
        if isinstance(module, ModulesToSaveWrapper):
            wanted += [f"{name}.{t}" for t, _ in module.modules_to_save[ADAPTER].named_parameters()]
            continue
        for sibling in _siblings(name):
            if PREFIX + sibling in modules or sibling in modules:
                wanted.append(f"{sibling}.weight")
    return list(dict.fromkeys(wanted))


def _layer_key(name: str) -> str:
    """The decoder layer a tensor belongs to (its name up to the first number: `model.layers.3`),
    or the tensor's own name outside the layer list (`model.norm.weight`, `lm_head.weight`)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return name


def buckets(names: list[str]) -> list[list[str]]:
    """`names` (from `changed_names`, in the model's order) cut into per-layer buckets: a sync builds
    and pushes one bucket's merged tensors at a time, so its peak extra memory is one layer's W′, not
    the whole model's. A `FUSED` group lies inside one layer, so it is never split."""
    out: list[list[str]] = []
    for name in names:
        if out and _layer_key(out[-1][-1]) == _layer_key(name):
            out[-1].append(name)
        else:
            out.append([name])
    return out


def _base_weight(stack: PolicyStack, module_name: str) -> Tensor:
    module = stack.peft.get_submodule(PREFIX + module_name)
    return (module.base_layer if isinstance(module, LoraLayer) else module).weight


@torch.no_grad()
def actor_tensors(stack: PolicyStack, names: list[str], dtype: torch.dtype) -> dict[str, Tensor]:
    """{plain name: the actor's tensor} for `names` (from `changed_names`), computed in float32
    (W + s·B·A) and cast to `dtype`, on the CPU-or-device the model lives on."""
    out: dict[str, Tensor] = {}
    for full in names:
        module_name, _, tensor = full.rpartition(".")
        module = stack.peft.get_submodule(PREFIX + module_name)
        if isinstance(module, ModulesToSaveWrapper):
            value = module.modules_to_save[ADAPTER].get_parameter(tensor).float()
        elif _has_actor_lora(module):
            value = module.base_layer.weight.float() + module.get_delta_weight(ADAPTER).float()
        else:  # a fused sibling the adapter leaves alone
            value = _base_weight(stack, module_name).float()
        out[full] = value.to(dtype).contiguous()
    return out


@torch.no_grad()
def actor_is_base(stack: PolicyStack) -> bool:
    """True when the actor computes exactly what the frozen base does: every LoRA B is 0 (peft's
    initialisation, so s·B·A = 0) and every modules_to_save copy equals its original."""
    for _, module in _adapted_modules(stack):
        if isinstance(module, ModulesToSaveWrapper):
            copy, original = module.modules_to_save[ADAPTER], module.original_module
            if not all(torch.equal(a, b) for a, b in zip(copy.parameters(), original.parameters())):
                return False
        elif all(f.count_nonzero() for f in _factors(module)):
            return False
    return True


class ActorSnapshot:
    """A copy of the actor's trainable tensors (adapter and modules_to_save copies: small next to
    the base), to tell exactly whether any changed since it was taken, however it was written."""

    def __init__(self, stack: PolicyStack) -> None:
        self._copy = [p.detach().clone() for p in stack.parameters_of(ADAPTER)]

    def matches(self, stack: PolicyStack) -> bool:
        return all(torch.equal(a, p.detach()) for a, p in zip(self._copy, stack.parameters_of(ADAPTER)))
