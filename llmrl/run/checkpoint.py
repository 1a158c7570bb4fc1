"""Checkpoints: everything needed to continue a run bit-identically, written atomically.

    RUN/checkpoints/step-000040/
        trainable.safetensors   actor and critic LoRA weights and the value head, by parameter name
        state.pt                optimizer states, KL controller, RNG states, step, eval-before result

A checkpoint is built in a temporary sibling folder (files fsynced) and renamed into place, so a
crash while saving never leaves a broken `step-*` folder; only the newest `keep` are kept. Files are
serialised in memory and written with plain file writes, so a full disk is one `OSError` (ENOSPC)
whatever the format: the temporary folder is removed, older checkpoints are untouched, and the
run stops with `CheckpointFailed`.
`state.pt` is read back with `torch.load(weights_only=True, map_location="cpu")`: optimizer states
saved from a GPU land on the CPU and `Optimizer.load_state_dict` moves them to their parameters'
device, so a checkpoint loads on any rank's GPU (or none) whichever GPU wrote it.
"""

from __future__ import annotations

import errno
import io
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from ..errors import LLMRLError, RunFailed

PATTERN = re.compile(r"^step-(\d{6,})$")


def trainable_state(stack: Any) -> dict[str, torch.Tensor]:
    """Name → tensor for every trainable parameter of the stack (both adapters and the head)."""
    named = dict(stack.named_parameters())
    wanted = {id(p) for role in stack.trainable_roles() for p in stack.parameters_of(role)}
    return {n: p.detach().cpu().contiguous().clone() for n, p in named.items() if id(p) in wanted}


class CheckpointFailed(RunFailed):
    """A checkpoint could not be written (disk full, quota, file size limit, …); older ones are intact."""


FULL = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted",
        errno.EFBIG: "the file size limit was reached"}


def describe(exc: OSError) -> str:
    """'No space left on device (the disk is full)' and the like: the OS reason plus what it means."""
    reason = exc.strerror or str(exc)
    return f"{reason} ({FULL[exc.errno]})" if exc.errno in FULL else reason


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _state_bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _fsync_tree(path: Path) -> None:
    for f in path.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(root: Path, step: int, stack: Any, state: dict[str, Any], keep: int) -> Path:
    """Write checkpoint `step` under `root/checkpoints` atomically and prune to the newest `keep`."""
    folder = root / "checkpoints"
    final = folder / f"step-{step:06d}"
    tmp = folder / f".tmp-step-{step:06d}"
    try:
        folder.mkdir(exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write(tmp / "trainable.safetensors", safetensors_bytes(trainable_state(stack)))
        _write(tmp / "state.pt", _state_bytes(state))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointFailed(f"Cannot write checkpoint {final}: {describe(exc)}.") from None
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    folder = root / "checkpoints"
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(PATTERN.match(p.name).group(1)))  # type: ignore[union-attr]


def newest_step(root: Path) -> int | None:
    """The step of the run's newest complete checkpoint (from its folder name), None without one."""
    found = list_checkpoints(root)
    return int(PATTERN.match(found[-1].name).group(1)) if found else None  # type: ignore[union-attr]


class CheckpointDamaged(LLMRLError):
    """A checkpoint file that cannot be read (cut short, bytes changed, empty, a folder in its place)."""


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0].strip().rstrip(".") if text else type(exc).__name__
    return first[:200]


def read_safetensors(path: Path, what: str) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors file llmrl wrote (`what`: 'checkpoint', 'adapter'); a file that is
    missing, cut short or altered is one sentence naming it."""
    if path.is_dir():
        raise CheckpointDamaged(f"The {what} file {path} is a folder, not a safetensors file.")
    try:
        return load_file(str(path))
    except Exception as exc:  # SafetensorError, OSError, …: the file is not what llmrl wrote
        raise CheckpointDamaged(f"The {what} file {path} cannot be read ({_reason(exc)}); it is damaged or "
                                f"incomplete.") from None


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint's state.pt (optimizer, RNG and KL states); damage is one sentence naming the file."""
    if path.is_dir():
        raise CheckpointDamaged(f"The checkpoint file {path} is a folder, not a torch file.")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # UnpicklingError, RuntimeError (zip archive), EOFError, OSError, …
        raise CheckpointDamaged(f"The checkpoint file {path} cannot be read ({_reason(exc)}); it is damaged or "
                                f"incomplete.") from None
    if not isinstance(state, dict) or not {"step", "optimizers", "rng"} <= state.keys():
        raise CheckpointDamaged(f"The checkpoint file {path} does not hold a checkpoint's state.")
    return state


def load_checkpoint(path: Path, stack: Any) -> dict[str, Any]:
    """Copy the saved weights into `stack` and return the saved state dict; a damaged file raises
    `CheckpointDamaged` before any weight is copied."""
    weights = read_safetensors(path / "trainable.safetensors", "checkpoint")
    state = read_state(path / "state.pt")
    named = dict(stack.named_parameters())
    missing = set(weights) ^ set(trainable_state(stack))
    if missing:
        raise LLMRLError(f"Checkpoint {path} does not match this model (parameters differ: {sorted(missing)[:3]}).")
    bad = next((n for n, t in weights.items() if t.shape != named[n].shape), None)
    if bad is not None:
        raise CheckpointDamaged(f"The checkpoint file {path / 'trainable.safetensors'} holds {bad} with shape "
                                f"{tuple(weights[bad].shape)}, not the model's {tuple(named[bad].shape)}.")
    with torch.no_grad():
        for name, tensor in weights.items():
            named[name].copy_(tensor)
    return state


def rng_state() -> dict[str, Any]:
    """Python's and torch's CPU RNG states, plus the current CUDA device's RNG state once CUDA is in use
    (LoRA dropout on a GPU draws from it); every state is a CPU tensor or a tuple."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())
