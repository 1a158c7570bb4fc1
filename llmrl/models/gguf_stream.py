"""A .gguf file → one float32 `model.safetensors`, de-quantised one tensor at a time.

Loading the whole GGUF model and saving it held every weight twice in float32 (the loaded model and
the plain copy rebuilt from it: above 14 GiB for the 1.78 B Qwen2.5-Coder-1.5B). Here the weights never
exist together:

    GGUF tensor i (memory-mapped by gguf.GGUFReader, Q4_K/Q6_K/Q8_0/F16/F32 … blocks)
        ──gguf.dequantize, CHUNK_BYTES of float32 rows at a time──▶ float32 array, the tensor's shape
        ──transformers' tensor processor (Llama: q/k rows back from llama.cpp's rotary order)──▶
        ──transformers' GGUF → HF name map──▶ written at its offset in model.safetensors

so the peak is about the largest tensor in float32 (the embedding or LM head: vocabulary × hidden × 4
bytes) plus one chunk, whatever the number of layers. The tensor processor, the name map and the set of
weights saved are transformers' own: its GGUF loader's TENSOR_PROCESSORS and get_gguf_hf_weights_map
applied to the model built on the meta device (no memory), and save_pretrained's removal of tied
weights. The header is written as safetensors writes it (names sorted, offsets in that order, padded
to 8 bytes), so the file is byte for byte what `from_pretrained(gguf_file=…)` then `save_pretrained`
wrote (tests/test_gguf_stream.py compares them on every quantisation type the catalogue's files use).

Architectures that transformers converts with its newer GGUF weight conversions (`is_gguf_arch_supported`:
qwen35, lfm2, …) are not streamed: models/gguf.py loads those whole, as before.
"""

from __future__ import annotations

import json
import mmap
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from ..errors import ConfigError

CHUNK_BYTES = 4 << 20  # float32 bytes de-quantised at a time: gguf's dequantize holds its input several
#                        times over in temporaries (and, whole, its output twice)
WEIGHTS = "model.safetensors"


@contextmanager
def reading(src: Path) -> Iterator[None]:
    """Turn a failure to read or convert `src` into one sentence: a file cut short or altered fails
    inside the gguf reader or transformers in many ways (struct.error, EOFError, ValueError, …)."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, (struct.error, EOFError)):  # the reader ran past the end of the file
            first = f"the file is cut short or damaged ({first[:200]})"
        elif not isinstance(exc, (OSError, ValueError)):
            first = f"{type(exc).__name__}: {first}"
        raise ConfigError(f"Cannot load model '{src}' as a causal LM: {first[:300]}") from None


def streamable(src: Path) -> bool:
    """Whether transformers reads `src` with its legacy GGUF loader (every architecture but the few
    its newer weight conversions handle), the one whose steps `write_weights` repeats."""
    try:
        from transformers.integrations.gguf import is_gguf_arch_supported, read_gguf_metadata
    except ImportError:  # a transformers without the newer loader reads every architecture the legacy way
        return True
    with reading(src):
        metadata, _ = read_gguf_metadata(str(src))
        return not is_gguf_arch_supported(metadata["general.architecture"])


def meta_model(src: Path, trust_remote_code: bool = False) -> torch.nn.Module:
    """The causal LM of `src`'s config (read from its metadata only) with its weights on the meta
    device: names, shapes and tied weights, no memory. Its config is the plain one (no GGUF
    quantisation_config), float32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with reading(src):
        config = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name, trust_remote_code=trust_remote_code)
        for attr in ("quantization_config", "_pre_quantization_dtype"):
            if hasattr(config, attr):
                delattr(config, attr)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)


def write_config(model: torch.nn.Module, folder: Path) -> None:
    """config.json and generation_config.json as save_pretrained writes them for `model` in float32."""
    model.config.dtype = "float32"
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    if model.can_generate():
        model.generation_config.save_pretrained(folder)


def saved_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the weights save_pretrained keeps (tied copies and ignored keys removed),
    sorted by name as safetensors orders float32 tensors."""
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = model.state_dict()
    for key in getattr(model, "_keys_to_ignore_on_save", None) or []:
        state.pop(key, None)
    state = remove_tied_weights_from_state_dict(state, model)
    odd = sorted(k for k, v in state.items() if v.dtype != torch.float32)
    if odd:
        raise ConfigError(f"Cannot convert the .gguf model: its weight {odd[0]} is not float32 in transformers' model.")
    return {k: tuple(state[k].shape) for k in sorted(state)}


def header(shapes: dict[str, tuple[int, ...]]) -> tuple[bytes, dict[str, int]]:
    """The safetensors header of float32 tensors of `shapes` (in that order) and each one's byte offset
    in the file: 8 bytes of header length (little-endian u64), the JSON, padded with spaces to 8 bytes."""
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    begins, at = {}, 0
    for name, shape in shapes.items():
        size = 4 * int(np.prod(shape, dtype=np.int64))
        entries[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + size]}
        begins[name], at = at, at + size
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    return struct.pack("<Q", len(text)) + text, {k: start + v for k, v in begins.items()}


def dequantized(data: np.ndarray, qtype: object, done: Callable[[np.ndarray], None] = lambda rows: None) -> np.ndarray:
    """`gguf.dequantize(data, qtype)`, computed CHUNK_BYTES of output at a time into one float32 array
    (rows of whole blocks: each chunk's values are the same as the whole tensor's); `done(rows)` after
    each chunk of `data`'s rows is read."""
    from gguf import dequantize

    rows = data.reshape(-1, data.shape[-1]) if data.ndim else data.reshape(1, 1)
    first = dequantize(rows[:1], qtype)
    width = first.shape[-1]
    out = np.empty((rows.shape[0], width), dtype=first.dtype)
    step = max(1, CHUNK_BYTES // max(1, width * first.dtype.itemsize))
    for i in range(0, rows.shape[0], step):
        out[i : i + step] = dequantize(rows[i : i + step], qtype)
        done(rows[i : i + step])
    return out.reshape(*data.shape[:-1], width)


def write_weights(src: Path, model: torch.nn.Module, folder: Path) -> Path:
    """De-quantise `src`'s tensors one at a time into `folder/model.safetensors` (see the module's
    docstring); every weight of `saved_shapes(model)` must come from the file."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map,
                                                          load_gguf_checkpoint, read_field)

    shapes = saved_shapes(model)
    head, offsets = header(shapes)
    with reading(src):
        reader = GGUFReader(str(src))
        kind = TENSOR_PROCESSORS.get(read_field(reader, "general.architecture")[0], TensorProcessor)
        # the config as transformers' loader hands it to the processor; the plain one reads none (and the
        # metadata's parse takes seconds for a large vocabulary)
        processor = kind(config=load_gguf_checkpoint(str(src), return_tensors=False)["config"]
                         if kind is not TensorProcessor else {})
        names = get_gguf_hf_weights_map(model, processor)
        reader.fields.clear()  # the metadata's parsed parts (0.5 GB for a vocabulary of 151,936): read above
    side: dict[str, dict[str, torch.Tensor]] = {"tensors": {}}  # what a processor keeps aside (MoE experts)
    written: set[str] = set()
    path = folder / WEIGHTS
    with open(path, "wb") as out:
        out.write(head)
        for tensor in reader.tensors:
            with reading(src):
                weights = dequantized(tensor.data, tensor.tensor_type, lambda rows: _release(reader, rows))
                done = processor.process(weights=weights, name=tensor.name, tensor_key_mapping=names,
                                         parsed_parameters=side)
            del weights
            if done.name in names:
                _put(out, names[done.name], done.weights, shapes, offsets, written, src)
            del done
        for name, value in side["tensors"].items():
            _put(out, name, value.numpy(), shapes, offsets, written, src)
    del reader
    missing = [k for k in shapes if k not in written]
    if missing:
        raise ConfigError(f"Cannot load model '{src}' as a causal LM: the file has no tensor for its weight "
                          f"{missing[0]} ({len(missing)} missing).")
    return path


def _release(reader: object, rows: np.ndarray) -> None:
    """Drop the pages of `rows` (a view of the memory-mapped file) from this process; they stay in the
    page cache. Otherwise every page read counts in the resident memory until the file is closed."""
    whole = getattr(reader, "data", None)
    mapped = getattr(whole, "_mmap", None)  # numpy.memmap's mmap.mmap, from the file's first byte
    if mapped is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    begin = rows.ctypes.data - whole.ctypes.data
    if not 0 <= begin <= len(mapped) - rows.nbytes:
        return
    start = begin - begin % mmap.PAGESIZE
    try:
        mapped.madvise(mmap.MADV_DONTNEED, start, begin + rows.nbytes - start)
    except (OSError, ValueError):
        pass


def _put(out, name: str, weights: np.ndarray, shapes: dict[str, tuple[int, ...]], offsets: dict[str, int],
         written: set[str], src: Path) -> None:
    """Write one weight at its offset, as float32 (transformers' `.to(torch.float32)` of the array)."""
    if name not in shapes:
        return  # a weight save_pretrained drops (a tied copy)
    tensor = torch.from_numpy(np.ascontiguousarray(weights)).to(torch.float32)
    if tuple(tensor.shape) != shapes[name]:
        raise ConfigError(f"Cannot load model '{src}' as a causal LM: its tensor for {name} has shape "
                          f"{tuple(tensor.shape)}, the model's config wants {shapes[name]}.")
    out.seek(offsets[name])
    out.write(memoryview(tensor.numpy()).cast("B"))
    written.add(name)
