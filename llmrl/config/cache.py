"""Where llmrl keeps what it builds once (the tiny models, .gguf copies, the models `llmrl models get`
obtains, the dtype probe's results):
`$LLMRL_CACHE_DIR`, else `$XDG_CACHE_HOME/llmrl`, else `~/.cache/llmrl`. Plain path logic, below the
models that fill it (models/gguf.py, models/tiny.py) and the settings that read it (dtype_probe.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """`$LLMRL_CACHE_DIR`, else `$XDG_CACHE_HOME/llmrl` (default `~/.cache/llmrl`)."""
    root = os.environ.get("LLMRL_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "llmrl"


def catalog_dir(name: str, root: Path | None = None) -> Path:
    """Where `llmrl models get NAME` keeps the plain copy of a catalogued model (models/obtain.py)."""
    return (root or cache_root()) / "models" / name


def cached_copy_dir(gguf: Path, root: Path | None = None) -> Path:
    """Where the plain copy of `gguf` lives; the key changes when the file's size or mtime does."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return (root or cache_root()) / "gguf" / f"{gguf.stem}-{key}"


def quantized_copy_dir(name: str, kind: str, dtype: str, key: str, root: Path | None = None) -> Path:
    """Where the 4-bit copy (`kind`, products in `dtype`) of the model folder named `name` lives; `key`:
    the digest of what the copy depends on (models/quantized_cache.py)."""
    return (root or cache_root()) / "quantized" / f"{name}-{kind}-{dtype}-{key}"
