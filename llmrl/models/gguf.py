"""GGUF files → a cached plain safetensors copy, so a `.gguf` model loads fast the second time.

transformers loads a `.gguf` file by de-quantising every tensor (about 15 s for a 135 M model on a
2-core CPU) and marks the result as "quantised", which makes `save_pretrained` refuse it. The copy
is therefore rebuilt as a plain model from the loaded model's config and state dict, saved as
float32 safetensors with the tokenizer and generation config, and reused on every later load:

    $LLMRL_CACHE_DIR (default ~/.cache/llmrl) / gguf / <file stem>-<12 hex of (size, mtime)>/

The folder appears only through an atomic rename of a finished temporary folder.
"""

from __future__ import annotations

import os
import shutil
import struct
import uuid
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..config.cache import cache_root, cached_copy_dir  # noqa: F401  (re-exported: where a copy lives)
from ..errors import ConfigError


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
    kwargs = {"gguf_file": src.name, "trust_remote_code": trust_remote_code}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), dtype=torch.float32, **kwargs)
    except Exception as exc:  # a file cut short or altered fails inside the gguf reader in many ways
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, (struct.error, EOFError)):  # the reader ran past the end of the file
            first = f"the file is cut short or damaged ({first[:200]})"
        elif not isinstance(exc, (OSError, ValueError)):
            first = f"{type(exc).__name__}: {first}"
        raise ConfigError(f"Cannot load model '{src}' as a causal LM: {first[:300]}") from None
    try:
        config = loaded.config
        for attr in ("quantization_config", "_pre_quantization_dtype"):
            if hasattr(config, attr):
                delattr(config, attr)
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict())
        plain.generation_config = loaded.generation_config
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, out)
        except OSError:  # another process finished first: use its copy
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
