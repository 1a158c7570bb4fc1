"""load_base: a model name from the config → (causal LM, tokenizer), frozen, on its device."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..config import precision
from ..config.memory import size_text
from ..config.model_defaults import device_kind
from ..config.schema import ModelConfig
from ..errors import ConfigError
from . import obtain, quantized, quantized_cache
from .attention import set_attention
from .logit_head import check_head, probe_row

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str, device: str = "cpu", model: str | None = None) -> torch.dtype:
    """The torch dtype a model.dtype / engine.dtype names; 'auto' (a Config built without load_config,
    which resolves it) is this hardware's fastest for `device` and the model named `model`
    (config/precision.py: a model under hidden size 256 stays float32), as load_config would pick."""
    if name == precision.AUTO:
        name = precision.fastest_dtype(device_kind(device), model=model)[0]
    return DTYPES[name]

BUILTIN_MODELS: dict[str, Callable[[bool], Path]] = {}
"""Built-in model names → `build(show_progress) -> folder` (the `tiny` model is registered by
`llmrl.tasks`, whose arithmetic split it is warm-started on)."""


def register_builtin_model(name: str, build: Callable[[bool], Path]) -> None:
    BUILTIN_MODELS[name] = build


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("'model.device' is cuda but no CUDA device is available; use cpu or auto.")
    return torch.device(name)


def model_source(cfg: ModelConfig, show_progress: bool = True) -> tuple[str, str | None]:
    """(folder or hub id, gguf file name or None); `tiny` is built and cached on first use, a
    catalogued name (`llmrl models`) is its cached copy once `llmrl models get` made it, and a
    `.gguf` file is loaded through its cached plain copy (so the second element is None today)."""
    if cfg.name in BUILTIN_MODELS:
        return str(BUILTIN_MODELS[cfg.name](show_progress)), None
    path = Path(cfg.name).expanduser()
    if not path.exists() and (obtained := obtain.resolve(cfg.name)) is not None:  # `llmrl models get NAME`
        return str(obtained), None
    if path.suffix == ".gguf":  # de-quantised once into a cached safetensors copy (models/gguf.py)
        from .gguf import plain_copy


        return str(plain_copy(path, trust_remote_code=cfg.trust_remote_code)), None
    looks_local = path.is_absolute() or cfg.name.startswith((".", "~")) or path.exists()
    if looks_local and not (path / "config.json").is_file():
        if (path / "reward.json").is_file():  # `llmrl reward train`'s folder: an adapter on a base, not a model
            raise ConfigError(f"'{path}' is a reward run (llmrl reward train), not a model: score with it through "
                              f"--reward {path}, and give its base as the model.")
        raise ConfigError(f"Model folder '{path}' does not exist or has no config.json.")
    return (str(path) if looks_local else cfg.name), None


def device_memory(device: torch.device) -> int:
    """Bytes of memory of `device`: the GPU's total, or the machine's physical memory, or less where this
    process's memory cgroup allows less (a container's limit: `cgroup_memory_limit`)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: no bound
        return 2**62
    limit = cgroup_memory_limit()
    return physical if limit is None else min(physical, limit)


def cgroup_memory_limit(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """The smallest memory limit of this process's memory cgroup and its ancestors, in bytes; None where
    there is none (or no cgroups). cgroup v2: `memory.max` under the unified path (`0::/path`); v1: the
    memory controller's `memory.limit_in_bytes` ("unlimited" there is a number near 2^63)."""
    try:
        lines = Path(proc).read_text(errors="replace").splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and controllers == "":
            base, name = Path(root), "memory.max"
        elif "memory" in controllers.split(","):
            base, name = Path(root) / "memory", "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):  # the cgroup, then each ancestor up to the root
            try:
                text = (base.joinpath(*parts[:depth]) / name).read_text(errors="replace").strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < 2**60:
                limits.append(int(text))
    return min(limits) if limits else None


def stored_numbers(folder: Path) -> int | None:
    """How many numbers the safetensors files of a model folder hold (read from their headers, no
    weight loaded); None without such files (a hub id, .bin weights)."""
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    from safetensors import safe_open

    total = 0
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            total += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return total


def check_fits(name: str, source: str, dtype: torch.dtype, device: torch.device, four_bit: bool = False,
               budget: Any = None) -> None:
    """Refuse, before loading, a model whose weights alone in `dtype` exceed the memory of `device`, or
    `budget` where given (a run's memory/budget.Budget: its `bytes`, `describe()`): a lower bound (the
    weights, nothing of a step), so a refused model could never have run. With a 4-bit base (`four_bit`)
    every number counts half a byte, its least (the embedding stays in `dtype`)."""
    try:
        numbers = stored_numbers(Path(source))
    except Exception:  # noqa: BLE001 - an unreadable header: the load itself says what is wrong
        return
    if numbers is None:
        return
    need = numbers * (0.5 if four_bit else torch.finfo(dtype).bits // 8)
    have = device_memory(device) if budget is None else budget.bytes
    where = f"{size_text(have)} of memory of {device.type}" if budget is None else budget.describe()
    if need > have:
        held = "4-bit" if four_bit else str(dtype).split('.')[-1]
        raise ConfigError(f"Model '{name}' has {numbers / 1e9:,.2f} B parameters: its {held} weights alone need "
                          f"{size_text(need)}, more than the {where}; a run of it needs at least "
                          f"{size_text(need * 1.5)} (the weights and room for a step) or, where the hardware has it, "
                          "model.dtype=bfloat16.")


def load_failure(exc: BaseException, source: str) -> str:
    """What went wrong loading a model, in a few words: the exception's first line, the weights file
    named when safetensors could not read it (a file cut short or altered)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, KeyError):
        return f"missing entry {first}"
    if type(exc).__name__ == "SafetensorError":
        files = sorted(p.name for p in Path(source).glob("*.safetensors")) if Path(source).is_dir() else []
        shown = ", ".join(files[:3]) or "its .safetensors file"
        return f"the weights file {shown} cannot be read ({first}); it is damaged or incomplete."
    if isinstance(exc, (OSError, ValueError)):
        return first
    return f"{type(exc).__name__}: {first}"


CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_causal(name: str, model: PreTrainedModel) -> None:
    """Refuse a checkpoint saved as another kind of model (e.g. ...ForSequenceClassification):
    AutoModelForCausalLM would load its body and silently put a random LM head on top."""
    archs = getattr(model.config, "architectures", None) or []
    if archs and not any(a.endswith(CAUSAL_HEADS) for a in archs):
        raise ConfigError(f"Model '{name}' is a {archs[0]}, not a causal language model; its LM head would be random.")


def load_base(cfg: ModelConfig, show_progress: bool = True,
              budget: Any = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The frozen causal LM and its tokenizer (left padding, a pad token guaranteed), refused where its weights
    exceed the device's memory or a run's `budget` (`check_fits`) or where llmrl's LM head does not reproduce
    its own logits (models/logit_head.py)."""
    source, gguf = model_source(cfg, show_progress)
    device = resolve_device(cfg.device)
    dtype, four_bit = torch_dtype(cfg.dtype, cfg.device, cfg.name), cfg.quantize != quantized.NONE
    check_fits(cfg.name, source, dtype, device, four_bit, budget)
    kwargs = {"trust_remote_code": cfg.trust_remote_code, **({"gguf_file": gguf} if gguf else {})}
    placed: dict = {}
    dtype_name, copy, model = str(dtype).removeprefix("torch."), None, None
    if four_bit:  # loaded straight into 4-bit layers on its device (transformers' bitsandbytes path)
        quantized.bitsandbytes()  # the package's install command in one sentence where it is missing
        copy = quantized_cache.cached(source, cfg.quantize, dtype_name)  # quantised by an earlier run
        placed = {"device_map": {"": device.index or 0} if device.type == "cuda" else {"": "cpu"}}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        if copy is not None:  # None where the copy is unreadable (said in one line, deleted)
            model = quantized_cache.load(copy, dtype=dtype, **kwargs, **placed)
        if model is None:
            copy = None
            quantize = {"quantization_config": quantized.quantization_config(cfg.quantize, dtype)} if four_bit else {}
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs, **placed, **quantize)
    except Exception as exc:  # transformers, tokenizers and safetensors raise many kinds for a broken file
        raise ConfigError(f"Cannot load model '{cfg.name}' as a causal LM: {load_failure(exc, source)}") from None
    check_causal(cfg.name, model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if four_bit:
        quantized.prepare(cfg.name, model, cfg.quantize)  # placed by device_map: a 4-bit model refuses .to()
        if copy is None:  # later runs load this copy, not the float checkpoint (models/quantized_cache.py)
            quantized_cache.store(model, source, cfg.quantize, dtype_name)
        quantized.release_checkpoint(model)  # no view of a memory-mapped file is left: the mapping closes
    else:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    set_attention(model, cfg.attention)
    check_head(cfg.name, model, probe_row(tokenizer, model.get_input_embeddings().num_embeddings))
    return model, tokenizer
