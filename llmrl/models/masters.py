"""Float32 master copies of the trained full modules (`lora.modules_to_save`) on a half-precision base.

peft keeps LoRA weights in float32 whatever the base's dtype, but a `modules_to_save` copy (e.g. a
trained norm) inherits the base's float16/bfloat16, in which small AdamW steps round away. Here each
such copy is made float32 and hooked so that the rest of the model still sees the base's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from peft import PeftModel
from peft.utils import ModulesToSaveWrapper
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

HALF = (torch.float16, torch.bfloat16)


def _trainable_copies(peft: PeftModel) -> list[nn.Module]:
    """Every adapter's trainable copy of a `lora.modules_to_save` module (e.g. `...norm.modules_to_save.actor`)."""
    return [m for w in peft.modules() if isinstance(w, ModulesToSaveWrapper) for m in w.modules_to_save.values()]


def _cast(x: object, dtype: torch.dtype) -> object:
    """Floating tensors (alone or in a tuple/list) cast to `dtype`; anything else unchanged."""
    if isinstance(x, Tensor):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


@dataclass
class Master:
    """A trainable copy kept in float32 on a half-precision base: its former dtype and its cast hooks."""

    module: nn.Module
    dtype: torch.dtype
    hooks: list[RemovableHandle]


def float32_masters(peft: PeftModel) -> list[Master]:
    """Make each half-precision trainable `modules_to_save` copy a float32 master module.

    bfloat16's spacing near 1.0 is 2^-7 ≈ 0.008, so AdamW steps of lr · ~1 (1e-5..1e-3) round away
    and a bfloat16 norm weight never changes. The copy's parameters become float32 (its gradients,
    optimizer state, checkpoints and saved adapter follow) and a forward hook casts its floating
    outputs back to the half dtype, so the rest of the model still runs in the base's dtype. A copy
    holding a matrix (a Linear such as an LM head) also gets its floating inputs cast to float32 (a
    matmul takes one dtype); a norm (vector weights) takes the half input as is: transformers' RMSNorm
    computes in float32 and returns `weight * hidden.to(input_dtype)`, which with a float32 weight is
    the exact product, rounded once by the hook, so at the start the copy's output equals the frozen
    original's bit for bit. A copy sharing a parameter with another module (a tied LM head) is left
    as it is. A float32/float64 base has no half copy: nothing changes.
    """
    elsewhere = {id(p) for n, p in peft.named_parameters(remove_duplicate=False) if ".modules_to_save." not in n}
    masters = []
    for copy in _trainable_copies(peft):
        params = list(copy.parameters())
        half = {p.dtype for p in params} & set(HALF)
        if len(half) != 1 or any(id(p) in elsewhere for p in params):
            continue
        dtype = half.pop()
        copy.to(torch.float32)
        hooks = [copy.register_forward_hook(lambda _m, _args, out, dtype=dtype: _cast(out, dtype))]
        if any(p.dim() >= 2 for p in params):
            hooks.append(copy.register_forward_pre_hook(_float32_inputs, with_kwargs=True))
        masters.append(Master(copy, dtype, hooks))
    return masters


def _float32_inputs(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return _cast(args, torch.float32), {k: _cast(v, torch.float32) for k, v in kwargs.items()}


def release(masters: list[Master]) -> None:
    """Undo `float32_masters`: hooks removed, every copy cast back to the dtype it had."""
    for master in masters:
        for hook in master.hooks:
            hook.remove()
        master.module.to(master.dtype)
