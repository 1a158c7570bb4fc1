"""The run folder: config.yaml, metrics.jsonl, summary.json, adapters/ and value_head.safetensors.

Every file but the metrics log is written atomically (temporary name, fsync, rename), so a crash
never leaves a half-written file under its final name.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from safetensors.torch import save_file

from ..config import Config, to_tree
from ..errors import LLMRLError, RunFailed
from ..models.stack import PolicyStack

MARKER = "config.yaml"
RUN_PARTS = ("adapters", "checkpoints", "tensorboard", "value_head.safetensors", MARKER, "metrics.jsonl",
             "summary.json", "completions.jsonl", "curves.png")  # every entry a run folder can hold (README)


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary sibling, fsync and rename."""
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _finite(value: Any) -> Any:
    """`value` with every NaN or ±inf float (a skipped update's loss, say) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def to_json(value: Any, **kwargs: Any) -> str:
    """json.dumps that writes valid JSON only: non-finite floats become null (never `NaN`/`Infinity`)."""
    return json.dumps(_finite(value), allow_nan=False, **kwargs)


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines log; a last line cut short (a crash or a full disk mid-write) is dropped."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise LLMRLError(f"Line {i + 1} of {path} is not valid JSON.") from None
    return rows


def _step_of(line: str) -> float:
    """The 'step' of a JSON log line; a line cut short by a crash or a full disk counts as never logged."""
    try:
        return json.loads(line).get("step", 0)
    except json.JSONDecodeError:
        return float("inf")


class RunFolder:
    """Writes one run's files under `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, path: Path, overwrite: bool = False) -> "RunFolder":
        """A fresh folder; one that already holds a run is refused unless `overwrite`."""
        if (path / MARKER).exists():
            if not overwrite:
                raise LLMRLError(f"'{path}' already holds a run; pass --overwrite to replace it.")
            shutil.rmtree(path)
        elif path.is_dir() and any(path.iterdir()):  # never mix a run into, or later delete, other files
            raise LLMRLError(f"'{path}' is not empty and holds no run; choose an empty or new --out folder.")
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise LLMRLError(f"Cannot write to run folder '{path}': {exc.strerror}.", exit_code=1) from None
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> "RunFolder":
        """An existing run folder, to resume."""
        if not (path / MARKER).is_file():
            raise LLMRLError(f"'{path}' is not a run folder (no {MARKER}); nothing to resume.")
        return cls(path)

    def truncate_metrics(self, steps: int) -> None:
        """Keep the rows of the first `steps` steps in metrics.jsonl and completions.jsonl (rows
        logged after the checkpoint are redone)."""
        for name in ("metrics.jsonl", "completions.jsonl"):
            f = self.path / name
            if not f.exists():
                continue
            rows = [line for line in f.read_text().splitlines() if line.strip()]
            kept = [line for line in rows if _step_of(line) <= steps]
            atomic_write(f, "".join(line + "\n" for line in kept))

    def write_config(self, config: Config) -> None:
        atomic_write(self.path / MARKER, yaml.safe_dump(to_tree(config), sort_keys=False))

    def _append(self, name: str, lines: list[str]) -> None:
        """Append lines to a log file; a write that fails (disk full, …) stops the run cleanly."""
        try:
            with open(self.path / name, "a") as fh:
                fh.writelines(lines)
        except OSError as exc:
            raise RunFailed(f"Cannot append to {self.path / name}: {exc.strerror or exc}.") from None

    def log_metrics(self, row: dict[str, Any]) -> None:
        self._append("metrics.jsonl", [to_json(row) + "\n"])

    def log_completions(self, rows: list[dict[str, Any]]) -> None:
        """Append sampled {step, prompt, completion, reward, …} rows to completions.jsonl."""
        self._append("completions.jsonl", [to_json(r, ensure_ascii=False) + "\n" for r in rows])

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write(self.path / "summary.json", to_json(summary, indent=2) + "\n")

    def save_models(self, stack: PolicyStack) -> None:
        """adapters/actor and adapters/critic in PEFT format; the value head as safetensors."""
        roles = ["actor"] + (["critic"] if stack.has_critic else [])
        stack.peft.save_pretrained(str(self.path / "adapters"), selected_adapters=roles)
        if stack.value_head is not None:
            tensors = {k: v.detach().cpu().contiguous() for k, v in stack.value_head.state_dict().items()}
            save_file(tensors, str(self.path / "value_head.safetensors"))


@dataclass(frozen=True)
class Run:
    """A finished (or running) run read back from disk."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None


def read_run(path: str | Path) -> Run:
    """Load a run folder's config, metrics and summary (None while the run is unfinished)."""
    p = Path(path)
    if not (p / MARKER).is_file():
        raise LLMRLError(f"'{p}' is not a run folder (no {MARKER}).")
    config = yaml.safe_load((p / MARKER).read_text())
    metrics_file = p / "metrics.jsonl"
    metrics = json_lines(metrics_file) if metrics_file.exists() else []
    summary_file = p / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
    return Run(p, config, metrics, summary)


class ReaderFolder(RunFolder):
    """The run folder as seen by the processes of a data-parallel run other than rank 0: they read
    it (to resume) but never write to it; rank 0 alone writes config, metrics, completions, models
    and summary."""

    def truncate_metrics(self, steps: int) -> None:
        pass

    def write_config(self, config: Config) -> None:
        pass

    def _append(self, name: str, lines: list[str]) -> None:  # metrics.jsonl, completions.jsonl
        pass

    def write_summary(self, summary: dict[str, Any]) -> None:
        pass

    def save_models(self, stack: PolicyStack) -> None:
        pass
