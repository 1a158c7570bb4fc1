"""Checkpoints: everything needed to continue a run bit-identically, written atomically.

    RUN/checkpoints/step-000040/
        trainable.safetensors   actor and critic LoRA weights and the value head, by parameter name
        state.pt                optimizer states, KL controller, RNG states, step, eval-before result

A checkpoint is built in a temporary sibling folder (files fsynced) and renamed into place, so a
crash while saving never leaves a broken `step-*` folder; only the newest `keep` are kept.
`state.pt` is read back with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .errors import LLMRLError

PATTERN = re.compile(r"^step-(\d{6,})$")


def trainable_state(stack: Any) -> dict[str, torch.Tensor]:
    """Name → tensor for every trainable parameter of the stack (both adapters and the head)."""
    named = dict(stack.named_parameters())
    wanted = {id(p) for role in stack.trainable_roles() for p in stack.parameters_of(role)}
    return {n: p.detach().cpu().contiguous().clone() for n, p in named.items() if id(p) in wanted}


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
        save_file(trainable_state(stack), str(tmp / "trainable.safetensors"))
        torch.save(state, tmp / "state.pt")
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LLMRLError(f"Cannot write checkpoint {final}: {exc.strerror or exc}.", exit_code=1) from None
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


def load_checkpoint(path: Path, stack: Any) -> dict[str, Any]:
    """Copy the saved weights into `stack` and return the saved state dict."""
    weights = load_file(str(path / "trainable.safetensors"))
    named = dict(stack.named_parameters())
    missing = set(weights) ^ set(trainable_state(stack))
    if missing:
        raise LLMRLError(f"Checkpoint {path} does not match this model (parameters differ: {sorted(missing)[:3]}).")
    with torch.no_grad():
        for name, tensor in weights.items():
            named[name].copy_(tensor)
    return torch.load(path / "state.pt", weights_only=True)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
