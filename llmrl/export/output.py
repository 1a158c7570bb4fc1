"""The folder an export writes: what `export_run` returns, the checks on `--out`, the finished temporary
folder renamed into place, and a GGUF-loaded model made savable; shared by merge.py (a run's actor) and
reward.py (a reward run's model).
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from transformers import PreTrainedModel
from transformers.utils import logging as hf_logging

from ..errors import LLMRLError
from ..run.folder import MARKER, RUN_PARTS


@dataclass(frozen=True)
class Exported:
    """What `export_run` wrote: the folder, its kind ('merged' | 'adapter'), the dtype, where the
    actor weights came from (the final adapter or a checkpoint), the run's model.quantize ('none',
    or the 4-bit kind whose de-quantised weights a merged export holds) and, after --push-to-hub, the
    URL of the hub commit; `task` what the export is a model of."""

    path: Path
    kind: str
    dtype: str
    source: str
    quantize: str = "none"
    pushed: str | None = None
    task: str = "causal-lm"  # or "reward": a reward run's AutoModelForSequenceClassification (reward.py)


EXPORT_MARKERS = ("config.json", "adapter_config.json")  # what an earlier export (or any model folder) holds
RUN_MARKERS = (MARKER, "compare.json")  # a run folder, a compare folder


def check_out(out: Path, overwrite: bool, run_dir: Path | None = None) -> None:
    """Refuse an existing, non-empty `out` unless `overwrite`; never replace a file, the run itself, a
    folder that holds it, another run or compare, or a folder that is not a model (--overwrite deletes `out`)."""
    target = out.resolve()
    if run_dir is not None:
        run = run_dir.resolve()
        if target == run or target in run.parents:
            raise LLMRLError(f"--out '{out}' is or contains the run folder '{run_dir}'; choose another --out.")
        if run in target.parents and target.relative_to(run).parts[0] in RUN_PARTS:
            raise LLMRLError(f"--out '{out}' is part of the run folder '{run_dir}'; choose another --out.")
    if out.exists() and not out.is_dir():
        raise LLMRLError(f"'{out}' is a file, not a folder; --out names the folder to write the model into, "
                         f"and llmrl never replaces a file there, so choose another --out.")
    if not out.exists() or not any(out.iterdir()):
        return
    if not overwrite:
        raise LLMRLError(f"'{out}' already exists; pass --overwrite to replace it.")
    if out.is_dir() and (any((out / m).exists() for m in RUN_MARKERS)
                         or not any((out / m).is_file() for m in EXPORT_MARKERS)):
        raise LLMRLError(f"'{out}' holds a run or files other than an exported model; --overwrite replaces only "
                         f"an earlier export (a folder with config.json or adapter_config.json), so choose another --out.")


def _readable(folder: Path) -> None:
    """Give every file the user's usual permissions (some writers create them 0600 via temp files)."""
    umask = os.umask(0)
    os.umask(umask)
    for f in folder.iterdir():
        if f.is_file():
            f.chmod(0o666 & ~umask)


def write_export(out: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` into a temporary sibling folder of `out` with transformers' progress bars off, then the
    folder renamed into place (`publish`): a failed export never leaves a half-written folder under `out`."""
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        was = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            write(tmp)
        finally:
            if was:
                hf_logging.enable_progress_bar()
        publish(tmp, out)
    except OSError as exc:
        raise LLMRLError(f"Cannot write the export to '{out}': {exc.strerror or exc}.", exit_code=1) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: Path, out: Path) -> None:
    """Move the finished temporary folder to `out`, replacing what was there."""
    _readable(tmp)
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    os.replace(tmp, out)


def unquantized(model: PreTrainedModel) -> PreTrainedModel:
    """Drop the quantizer transformers attaches to a model loaded from a GGUF file.

    A GGUF model whose weights were all dequantized to plain tensors (what llmrl trains) still
    carries it, and `save_pretrained` refuses to save it; its weights are ordinary float tensors, so
    removing it is exact. Weights kept in quantized blocks cannot be merged and are refused.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return model
    plain = all(p.dtype.is_floating_point for p in model.parameters()) and not any(
        "gguf" in type(m).__module__ for m in model.modules())
    if not plain:
        raise LLMRLError("The base model's weights are kept quantized, so the adapter cannot be merged into them; "
                         "export with --adapter-only instead.")
    quantizer.remove_quantization_config(model)
    return model
