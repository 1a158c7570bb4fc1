"""A 4-bit frozen base (`model.quantize`: nf4 or fp4) under the actor, the critic and the reference.

QLoRA's recipe, through the library a GPU user's QLoRA uses (bitsandbytes, via transformers'
`BitsAndBytesConfig`): every linear layer of the decoder holds its weight W (out, in) as 4-bit codes
in blocks of 64 with one absmax scale per block (`double quant`: the scales themselves 8-bit, as
QLoRA), so a layer costs ≈ out·in·(4 + 8.5/64 + …)/8 bytes, about 0.52 bytes a number against 4 in
float32. The LM head and the embedding stay in `model.dtype` (transformers keeps the output layer
unquantized). A layer computes  y = deq(W_q)·x + b  in `model.dtype`, deq(W_q) made afresh each call;
peft's LoRA layers for bitsandbytes add s·B·(A·x) on top, so

    actor     deq(W_q)·x + s·B_a·(A_a·x)      (LoRA `actor`)
    critic    deq(W_q)·x + s·B_c·(A_c·x)      (LoRA `critic`, then the value head)
    reference deq(W_q)·x                      (adapters disabled)

share one quantized copy; A, B, the value head and AdamW's state stay float32 as on a float base.

One kernel for every call. On a CPU with avx512_bf16, bitsandbytes converts a 4-bit layer in eval
mode to a packed layout at its first no-grad call and from then on runs every call — gradient calls
included — through a fused kernel that computes in bfloat16 and has no backward (a gradient forward
then fails, or the layers below get no gradient through it). llmrl keeps its stack in eval mode
(stack.py), so `prepare` turns that conversion off: every call dequantizes and multiplies in
`model.dtype`, so generation, log π_old, log π_θ and log π_ref are one function, alike on every CPU.
Measured (2-core AMD EPYC with avx512_bf16, one thread, one 896 → 4864 layer, docs/performance.md):
the fused kernel 0.30 / 1.84 ms at 8 / 64 rows against dequantize-and-multiply's 1.91 / 6.75 ms and
float32's 1.38 / 6.01 ms; 2048 rows 176 ms, as float32.

Generation. Decoding a token multiplies a few rows by every weight, so dequantizing every weight at
every token costs more than the product (Qwen2.5-Coder-0.5B, 64 rows × 64 tokens: 2.17× float32's
merged and packed generate phase). On the CPU the `hf` engine therefore makes, while it generates,
the same transient copies it makes of a float base (`engine.merge_lora`, `engine.pack_weights`):
each 4-bit layer's deq(W_q) — with the actor's s·B·A added where it has LoRA — packed for oneDNN, one
layer at a time, freed after (merged.py, packed.py). That is a float copy of the linear layers during
the generate phase only (1.4 GB at 0.5B in float32, listed in the start-up table); both settings off
keep generation on the 4-bit layers (what a GPU, where a 4-bit model is the point,
always does: bitsandbytes' CUDA kernels read the codes). Export merges into deq(W_q) of the base as
the run loaded it (its own model.dtype, so its cached copy: run/actor.py), the matrices the run
multiplied by (`dequantized`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError

KINDS = ("nf4", "fp4")  # model.quantize's 4-bit kinds (bitsandbytes' quant_type)
NONE = "none"


def bitsandbytes() -> Any:
    """The bitsandbytes module (its import's warning about a hub kernel is silenced in llmrl/__init__.py);
    ConfigError when the package is missing."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise ConfigError("model.quantize needs the bitsandbytes package, which is not installed; "
                          "pip install 'llmrl[quant]' (or model.quantize=none).") from None
    return bnb


def quantization_config(kind: str, compute_dtype: torch.dtype) -> Any:
    """transformers' BitsAndBytesConfig for `kind` (nf4 | fp4): 4-bit codes in blocks of 64, the scales
    double-quantized (QLoRA's), products in `compute_dtype` (the run's model.dtype)."""
    bitsandbytes()
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=kind, bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype)


def four_bit_layers(model: nn.Module) -> list[nn.Module]:
    """Every bitsandbytes 4-bit linear layer of `model` (peft's LoRA wrappers excluded: their base layer counts)."""
    if not is_loaded():
        return []
    import bitsandbytes as bnb

    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def is_loaded() -> bool:
    """Whether bitsandbytes was imported (a run without model.quantize never imports it)."""
    import sys

    return "bitsandbytes" in sys.modules


def prepare(name: str, model: nn.Module, kind: str) -> None:
    """Check a base just loaded with `kind` and make every 4-bit layer compute by dequantize-and-multiply
    (the module docstring). Refuses a model in which nothing was quantized."""
    layers = four_bit_layers(model)
    if not layers:
        raise ConfigError(f"model.quantize={kind}: model '{name}' has no linear layer bitsandbytes could quantize "
                          "(its layers are of other kinds); use model.quantize=none.")
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False


@torch.no_grad()
def release_checkpoint(model: nn.Module) -> int:
    """Copy every parameter and buffer of a 4-bit base on the CPU (the 4-bit codes with their quantization
    state, the embedding, the LM head, norms, biases) into memory of the process's own, so that nothing
    views the memory-mapped checkpoint any more and the mapping closes. transformers reads a safetensors checkpoint through one mmap and
    keeps the tensors it did not convert as views of it, so without this the mapping stays open for the
    whole run, and with it the page cache of every float weight read while quantising: 5.9 GB of the
    float32 Qwen2.5-Coder-1.5B's 7.1 GB file, counted in a memory cgroup's usage and in the RSS, for
    1.8 GB of tensors still used. Copies tensor by tensor, each `Parameter` object once (tied weights stay tied); returns the
    bytes copied."""
    copied, seen = 0, set()
    for module in model.modules():
        for slots in (module._parameters, module._buffers):
            for t in slots.values():
                if t is None or id(t) in seen or t.device.type != "cpu":
                    continue
                seen.add(id(t))
                t.data = t.data.clone()  # a 4-bit weight keeps its quant_state (an attribute of the Parameter)
                copied += t.numel() * t.element_size()
                state = getattr(t, "quant_state", None)
                for holder in (state, getattr(state, "state2", None)):
                    for attr in ("absmax", "code", "offset"):
                        if isinstance(getattr(holder, attr, None), Tensor):
                            setattr(holder, attr, getattr(holder, attr).clone())
    return copied


def is_quantized(p: Tensor) -> bool:
    """Whether `p` is a bitsandbytes 4-bit weight (its data: packed uint8 codes, two numbers a byte)."""
    return getattr(p, "quant_state", None) is not None


def stored_size(p: Tensor) -> tuple[int, int]:
    """(numbers it stands for, bytes it holds) of a parameter: a 4-bit weight counts the out·in numbers
    of its matrix and the bytes of its codes plus its quantization state (scales, their scales)."""
    state = getattr(p, "quant_state", None)
    if state is None:
        return p.numel(), p.numel() * p.element_size()
    numbers = int(torch.Size(state.shape).numel())
    extra = sum(t.numel() * t.element_size() for t in _state_tensors(state))
    return numbers, p.numel() * p.element_size() + extra


def _state_tensors(state: Any) -> list[Tensor]:
    """The tensors a bitsandbytes QuantState holds: absmax and code, and the nested state's when double-quantized."""
    out = [t for t in (state.absmax, state.code) if isinstance(t, Tensor)]
    nested = getattr(state, "state2", None)
    if nested is not None:
        out += [t for t in (nested.absmax, nested.code) if isinstance(t, Tensor)]
    if isinstance(getattr(state, "offset", None), Tensor):
        out.append(state.offset)
    return out


def is_four_bit(layer: nn.Module) -> bool:
    """Whether `layer` is a bitsandbytes 4-bit linear layer (without importing bitsandbytes)."""
    return is_quantized(getattr(layer, "weight", None)) and isinstance(layer, nn.Linear)


def float_weight(layer: nn.Module) -> Tensor:
    """The matrix a linear layer multiplies by: its weight, or deq(W_q) (a new tensor) for a 4-bit layer."""
    return dequantize_weight(layer) if is_four_bit(layer) else layer.weight


def class_forward(layer: nn.Module, x: Tensor) -> Tensor:
    """The layer's own class forward (a 4-bit layer's dequantize-and-multiply, or nn.Linear's)."""
    return type(layer).forward(layer, x)


@torch.no_grad()
def dequantize_weight(layer: nn.Module) -> Tensor:
    """deq(W_q) of one 4-bit layer: (out, in) in its compute dtype, the very matrix its forward multiplies by."""
    bnb = bitsandbytes()
    w = layer.weight
    return bnb.functional.dequantize_4bit(w.data, w.quant_state).to(layer.compute_dtype or torch.float32)


@torch.no_grad()
def dequantized(model: nn.Module, dtype: torch.dtype = torch.float32) -> nn.Module:
    """`model` with every 4-bit layer replaced by a plain nn.Linear holding deq(W_q) in `dtype` (its bias
    kept), and transformers' quantizer and quantization config removed: a plain model whose forward is
    the quantized one's up to the rounding of the product, which `save_pretrained` writes as ordinary
    weights (what `llmrl export` merges the adapter into, as peft does for QLoRA)."""
    four_bit = set(four_bit_layers(model))
    for name, layer in [(n, m) for n, m in model.named_modules() if m in four_bit]:
        plain = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, dtype=dtype,
                          device=layer.weight.device)
        plain.weight.copy_(dequantize_weight(layer).to(dtype))
        if layer.bias is not None:
            plain.bias.copy_(layer.bias.to(dtype))
        plain.requires_grad_(False)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, plain)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    for attr in ("is_quantized", "is_loaded_in_4bit"):
        if hasattr(model, attr):
            setattr(model, attr, False)
    return model
