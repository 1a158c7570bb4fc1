"""export_run: a run's trained actor → a standalone Hugging Face model folder (or just its adapter).

The merged folder holds `model.safetensors`, `config.json`, `generation_config.json`, the
tokenizer files and a model card, README.md (card.py), and loads with `AutoModelForCausalLM.from_pretrained(DIR)` without llmrl or peft:
every LoRA layer is folded into its base weight (W ← W + (α/r)·B·A, computed in float32) and every
`modules_to_save` copy (the tiny model's trained norms) replaces the frozen original. The result is
cast to the requested dtype only after merging.

Everything is written into a temporary sibling folder and renamed into place, so a failed export
never leaves a half-written model under the final name. `push_to_hub` then uploads the folder (hub.py).
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from transformers import PreTrainedModel
from transformers.utils import logging as hf_logging

from ..errors import LLMRLError
from ..run.actor import actor_source, load_actor, merge_actor, run_config
from ..models.load import DTYPES
from ..run.folder import MARKER, RUN_PARTS
from .card import card
from .hub import hub_token, push
from .names import point_adapter


@dataclass(frozen=True)
class Exported:
    """What `export_run` wrote: the folder, its kind ('merged' | 'adapter'), the dtype, where the
    actor weights came from (the final adapter or a checkpoint), the run's model.quantize ('none',
    or the 4-bit kind whose de-quantised weights a merged export holds) and, after --push-to-hub, the
    URL of the hub commit."""

    path: Path
    kind: str
    dtype: str
    source: str
    quantize: str = "none"
    pushed: str | None = None


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


def _publish(tmp: Path, out: Path) -> None:
    """Move the finished temporary folder to `out`, replacing what was there."""
    _readable(tmp)
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    os.replace(tmp, out)


def _unquantized(model: PreTrainedModel) -> PreTrainedModel:
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


def _write_merged(run_dir: Path, tmp: Path, dtype: str) -> None:
    """A 4-bit base's run merges into deq(W_q), as peft does for QLoRA (`load_actor(dequantize=True)`)."""
    stack, tokenizer, _ = load_actor(run_dir, dtype="float32", device="cpu", dequantize=True)
    model = _unquantized(merge_actor(stack)).to(DTYPES[dtype])
    model.config.dtype = dtype
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if not (tmp / "generation_config.json").is_file() and model.generation_config is not None:
        model.generation_config.save_pretrained(tmp)


def _write_adapter(run_dir: Path, tmp: Path, dtype: str) -> None:
    stack, _, _ = load_actor(run_dir, dtype="float32", device="cpu")
    stack.peft.to(DTYPES[dtype])
    staging = tmp / ".peft"
    stack.peft.save_pretrained(str(staging), selected_adapters=["actor"])
    for f in (staging / "actor").iterdir():  # peft puts a named adapter in a subfolder
        os.replace(f, tmp / f.name)
    shutil.rmtree(staging)


def export_run(run_dir: str | Path, out: str | Path, *, dtype: str = "float32", adapter_only: bool = False,
               overwrite: bool = False, push_to_hub: str | None = None, private: bool = False) -> Exported:
    """Write the run's actor to `out`: merged into the base weights, or (`adapter_only`) as a PEFT adapter,
    with its model card; then, with `push_to_hub` (a hub repository id), upload the folder there (a new
    repository made `private`, hub.py)."""
    run_dir, out = Path(run_dir), Path(out)
    if dtype not in DTYPES:
        raise LLMRLError(f"Unknown dtype '{dtype}'; valid: {', '.join(DTYPES)}.")
    if not (run_dir / "config.yaml").is_file():
        raise LLMRLError(f"'{run_dir}' is not a run folder (no config.yaml); nothing to export.")
    source = actor_source(run_dir)  # fails early when the run saved no actor yet
    check_out(out, overwrite, run_dir)
    token = hub_token(push_to_hub) if push_to_hub else None  # before minutes of merging
    config = run_config(run_dir)
    kind = "adapter" if adapter_only else "merged"
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        was = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            (_write_adapter if adapter_only else _write_merged)(run_dir, tmp, dtype)
        finally:
            if was:
                hf_logging.enable_progress_bar()
        point_adapter(tmp, config.model.name)  # the adapter names its base by hub id or not at all
        card(config, run_dir, source, kind, dtype, push_to_hub or out.name).save(tmp / "README.md")
        _publish(tmp, out)
    except OSError as exc:
        raise LLMRLError(f"Cannot write the export to '{out}': {exc.strerror or exc}.", exit_code=1) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    done = Exported(out, kind, dtype, source.describe(), config.model.quantize)
    if push_to_hub:
        url = push(out, push_to_hub, token or "", f"llmrl export of the run {run_dir.name} ({kind}, {dtype})", private)
        done = replace(done, pushed=url)
    return done
