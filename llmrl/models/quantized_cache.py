"""A 4-bit base quantised once: later runs load the cached 4-bit checkpoint instead of the float one.

Quantising reads every float weight of the checkpoint, and transformers reads a safetensors file
through one memory mapping that it keeps open for the tensors it did not convert, so a run that
quantised Qwen2.5-Coder-1.5B (a 7.1 GB float32 file) carries 5.9 GB of the file's page cache in its
RSS and in its memory cgroup's usage for as long as it lives, and spends ~50 s on the quantising
itself on a 2-core CPU. The first run that loads a local model folder with `model.quantize` set
therefore writes the quantized model with `save_pretrained` (bitsandbytes' own 4-bit serialisation:
codes, absmax scales and their nested state; the unquantized embedding, LM head and norms in
`model.dtype`), and every later run loads that:

    $LLMRL_CACHE_DIR (default ~/.cache/llmrl) / quantized / <folder>-<kind>-<dtype>-<12 hex of the
    folder's path and its weight files' sizes and mtimes>/

The copy holds the very codes and scales the first run computed, so a run on it computes what the
first run computed (tests/test_quantized_cache.py: identical logits). The folder appears only
through an atomic rename of a finished temporary folder; where it cannot be written (a full disk, a
read-only cache) the run goes on from the model it quantised and says so once. A copy that
cannot be read (truncated, damaged) is said in one line, deleted, and quantised again. A hub id (no local
folder) is not cached: transformers keeps its own copy of the float files.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from ..config.cache import quantized_copy_dir
from .tiny import no_hf_progress_bars

COMPLETE = "llmrl-quantized.json"  # written last inside the temporary folder: its presence marks a whole copy


def cache_dir(source: str, kind: str, dtype: str) -> Path | None:
    """The cache folder of the 4-bit copy of `source`, or None where `source` is no local model folder."""
    folder = Path(source)
    if not (folder / "config.json").is_file():
        return None
    return quantized_copy_dir(folder, kind, dtype)


def cached(source: str, kind: str, dtype: str) -> Path | None:
    """The folder of a finished 4-bit copy of `source`, or None where there is none yet."""
    folder = cache_dir(source, kind, dtype)
    return folder if folder is not None and (folder / COMPLETE).is_file() else None


def load(folder: Path, **kwargs) -> PreTrainedModel | None:
    """The 4-bit model of the copy in `folder`, or None where it cannot be read (a truncated or damaged file):
    then one line on stderr and the copy, which llmrl wrote, is deleted, so this run quantises afresh and
    writes it again."""
    try:
        return AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    except (MemoryError, torch.OutOfMemoryError):  # the copy is whole, the memory full: not the copy's fault
        raise
    except Exception as exc:  # safetensors and transformers raise many kinds for a damaged file
        text = str(exc).strip()
        print(f"llmrl: the cached 4-bit copy {folder} cannot be read ({text.splitlines()[0][:200] if text else type(exc).__name__}); "
              "quantising the float checkpoint again.", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)
        return None


def store(model: PreTrainedModel, source: str, kind: str, dtype: str) -> Path | None:
    """Write the 4-bit `model` (just quantised from `source`) to its cache folder; returns the folder,
    or None where `source` is not cached or the copy could not be written (one line on stderr)."""
    out = cache_dir(source, kind, dtype)
    if out is None:
        return None
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with no_hf_progress_bars():
            model.save_pretrained(tmp, safe_serialization=True)
        (tmp / COMPLETE).write_text(json.dumps({"source": str(Path(source).resolve()), "quantize": kind,
                                                 "dtype": dtype}) + "\n")
        try:
            os.rename(tmp, out)
        except OSError:  # another run finished the same copy first: keep theirs
            if not (out / COMPLETE).is_file():
                raise
    except Exception as exc:  # a best-effort copy: a disk, a permission or a serialisation failure never stops the run
        text = str(exc).strip()
        reason = getattr(exc, "strerror", None) or (text.splitlines()[0][:200] if text else type(exc).__name__)
        print(f"llmrl: the {kind} copy of '{source}' could not be cached in {out.parent} ({reason}); "
              "the next run quantises the float checkpoint again.", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
