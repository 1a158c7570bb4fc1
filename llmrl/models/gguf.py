"""GGUF files → a cached plain safetensors copy, so a `.gguf` model loads fast the second time.

The copy is float32 safetensors with the tokenizer (and chat template) and generation config, built once
and reused on every later load:

    $LLMRL_CACHE_DIR (default ~/.cache/llmrl) / gguf / <file stem>-<12 hex of (size, mtime)>/

The weights are de-quantised one tensor at a time straight into `model.safetensors` (gguf_stream.py:
the peak is about the largest tensor in float32, not the model twice), with transformers' own name
map and permutations, so the file is what transformers' GGUF loading then `save_pretrained` writes.
The few architectures transformers converts with its newer GGUF weight conversions are loaded whole
instead: transformers marks such a model "quantised", which makes `save_pretrained` refuse it, so a
plain model is rebuilt from its config and state dict and saved. The folder appears only through an
atomic rename of a finished temporary folder.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..config.cache import cache_root, cached_copy_dir  # noqa: F401  (re-exported: where a copy lives)
from ..errors import ConfigError
from .gguf_stream import meta_model, reading, streamable, write_config, write_weights


def require_gguf() -> None:
    """transformers reads a .gguf file with the `gguf` package (a dependency of llmrl); without it,
    one sentence with the install command instead of transformers' traceback."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ConfigError("Reading a .gguf model needs the 'gguf' package, which is not installed: "
                          "pip install 'gguf>=0.10'.") from None


def plain_copy(gguf: str | Path, out_dir: Path | None = None, trust_remote_code: bool = False) -> Path:
    """A folder with the de-quantised model of `gguf` (float32 safetensors + tokenizer); built once.

    `out_dir` defaults to the cache folder of `cached_copy_dir`; an existing complete folder is
    returned as is.
    """
    src = Path(gguf).expanduser()
    if src.is_dir():
        raise ConfigError(f"Model file '{src}' is a folder, not a .gguf file.")
    if not src.is_file():
        raise ConfigError(f"Model file '{src}' does not exist.")
    if src.stat().st_size == 0:
        raise ConfigError(f"Model file '{src}' is empty.")
    out = Path(out_dir) if out_dir else cached_copy_dir(src)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    require_gguf()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with reading(src):
            tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name,
                                                      trust_remote_code=trust_remote_code)
        tmp.mkdir()
        if streamable(src):
            model = meta_model(src, trust_remote_code)
            write_weights(src, model, tmp)
            write_config(model, tmp)
        else:
            _loaded_whole(src, trust_remote_code).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, out)
        except OSError:  # another process finished first: use its copy
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _loaded_whole(src: Path, trust_remote_code: bool) -> torch.nn.Module:
    """`src` loaded whole by transformers and rebuilt as a plain float32 model (twice the model's
    float32 size at the peak): for the architectures `streamable` leaves out."""
    with reading(src):
        loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32,
                                                      trust_remote_code=trust_remote_code)
    config = loaded.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    return plain
