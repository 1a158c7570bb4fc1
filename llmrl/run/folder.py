"""The run folder: config.yaml, metrics.jsonl, summary.json, adapters/ and value_head.safetensors.

Every file but the metrics log is written atomically (temporary name, fsync, rename), so a crash
never leaves a half-written file under its final name; files get the permissions the umask gives
(0644 under umask 022), like any other file the user writes.

A folder is a run when its config.yaml is an llmrl config and every entry is one llmrl writes
(`check_reusable`); `--overwrite` removes only those entries, naming them on stderr. While a run writes to
its folder it holds RUN/.lock (its pid, created with O_EXCL): a second run on the same folder is
refused; a lock whose process is gone (kill -9) is stale and taken over.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml
from safetensors.torch import save_file

from ..config import Config, to_tree
from ..errors import LLMRLError, RunFailed
from ..models.load import BUILTIN_MODELS
from ..models.stack import PolicyStack
from ..rewards.builtin import BUILTINS

MARKER = "config.yaml"
RUN_PARTS = ("adapters", "checkpoints", "tensorboard", "value_head.safetensors", MARKER, "metrics.jsonl",
             "summary.json", "completions.jsonl", "curves.png", "error.log",
             "adapter", "reward.json")  # every entry a run (or a reward run, reward_model/folder.py) can hold (README)
LOCK = ".lock"
OWN = (*RUN_PARTS, "wandb", ".wandb-id", LOCK)  # everything llmrl writes into a run folder
CONFIG_KEYS = {"algo", "model", "rollout", "update"}  # top-level keys every stored config.yaml has
REWARD_KEYS = {"model", "pairs", "rm"}  # … and every reward run's (config/reward_run.py)


def file_mode() -> int:
    """The permissions a new file gets under the current umask: 0o666 & ~umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary sibling, fsync and rename; the file gets the
    umask's permissions (mkstemp alone would make it 0600)."""
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), file_mode())
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


def _own(name: str) -> bool:
    """An entry llmrl writes into a run folder, or the temporary sibling of one ('.config.yaml.x1y2')."""
    return name in OWN or any(name.startswith(f".{part}.") for part in RUN_PARTS)


def _llmrl_config(path: Path) -> bool:
    """Whether `path`/config.yaml is a config llmrl wrote: a mapping with its top-level sections."""
    try:
        tree = yaml.safe_load((path / MARKER).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(tree, dict) and (CONFIG_KEYS <= tree.keys() or REWARD_KEYS <= tree.keys())


def check_reusable(path: Path) -> None:
    """Refuse an --out folder that holds anything but a run: a run is a config.yaml that llmrl wrote
    and nothing but entries llmrl writes (`OWN`); a folder holding only a lock counts as empty."""
    names = sorted(e.name for e in path.iterdir() if e.name != LOCK) if path.is_dir() else []
    if not names:
        return
    if MARKER not in names:  # never mix a run into, or later delete, other files
        raise LLMRLError(f"'{path}' is not empty and holds no run; choose an empty or new --out folder.")
    foreign = [n for n in names if not _own(n)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise LLMRLError(f"'{path}' holds a config.yaml but also files llmrl did not write ({shown}); llmrl never "
                         f"deletes them, so choose an empty or new --out folder.")
    if not _llmrl_config(path):
        raise LLMRLError(f"'{path}/{MARKER}' is not an llmrl run's config; choose an empty or new --out folder.")


def remove_run(path: Path) -> None:
    """Delete a run's entries (all of them llmrl's, `check_reusable`), saying which on stderr; the lock stays."""
    entries = sorted((e for e in path.iterdir() if e.name != LOCK), key=lambda e: e.name)
    shown = ", ".join(e.name + ("/" if e.is_dir() else "") for e in entries)
    print(f"Replacing the run in '{path}' (--overwrite): removing {shown}.", file=sys.stderr)
    for e in entries:
        shutil.rmtree(e) if e.is_dir() and not e.is_symlink() else e.unlink()


_held: set[Path] = set()  # run folders whose lock this process holds


def _start_time(pid: int) -> str:
    """A process's start time (clock ticks since boot, field 22 of /proc/PID/stat), '' where unknown:
    tells the run that wrote a lock from a later process that got the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _holder(lock: Path) -> str | None:
    """Who holds `lock`: its pid while that process lives, None when the lock is stale."""
    try:
        pid_text, _, started = lock.read_text().partition(" ")
    except FileNotFoundError:
        return None
    try:
        pid = int(pid_text)
    except ValueError:  # being written this instant, or damaged: never taken over silently
        return f"unknown; if no run uses the folder, delete {lock}"
    if pid == os.getpid():
        return None  # a dead run's pid, now ours
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    now, started = _start_time(pid), started.strip()
    return str(pid) if not (now and started) or now == started else None


def acquire_lock(path: Path) -> None:
    """Create RUN/.lock (O_EXCL) holding 'pid start-time'; a live holder is refused, a stale lock replaced."""
    key = path.resolve()
    if key in _held:
        return
    lock = path / LOCK
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode())
        except FileExistsError:
            holder = _holder(lock)
            if holder is not None:
                raise LLMRLError(f"'{path}' is in use by another llmrl run (pid {holder}); wait for it to end "
                                 f"or stop it first.") from None
            lock.unlink(missing_ok=True)  # stale: its run was killed
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{os.getpid()} {_start_time(os.getpid())}\n")
        _held.add(key)
        return
    raise LLMRLError(f"'{path}' is in use by another llmrl run that started at the same moment; try again.")


def release_lock(path: Path) -> None:
    """Remove RUN/.lock if this process holds it."""
    key = path.resolve()
    if key in _held:
        _held.discard(key)
        (path / LOCK).unlink(missing_ok=True)


@contextmanager
def folder_locks() -> Iterator[Callable[[], list[Path]]]:
    """Release, on the way out, every run-folder lock taken inside the block (a run's end, its error);
    yields a function that lists the folders locked so far inside the block."""
    before = set(_held)
    try:
        yield lambda: sorted(_held - before)
    finally:
        for key in _held - before:
            release_lock(key)


@atexit.register
def _release_all() -> None:
    for key in list(_held):
        release_lock(key)


def absolute_paths(tree: dict[str, Any]) -> dict[str, Any]:
    """The config tree with every setting that names an existing local path (model, dataset, eval
    dataset, reward file or reward-model folder) made absolute, so --resume and eval work from any
    folder; hub ids, built-in names and 'module:function' stay as given."""
    model, section = dict(tree["model"]), "data" if "data" in tree else "pairs"  # a reward run's data: `pairs`
    data = dict(tree[section])
    if model["name"] not in BUILTIN_MODELS:
        model["name"] = _absolute(model["name"])
    for key in ("dataset", "eval_dataset"):
        data[key] = _absolute(data[key]) if data.get(key) else data.get(key)
    if "reward" not in tree:
        return {**tree, "model": model, section: data}
    reward = dict(tree["reward"])
    if reward.get("functions"):
        reward["functions"] = [_absolute_reward(f) for f in reward["functions"]]
    return {**tree, "model": model, "data": data, "reward": reward}


def _absolute(value: str) -> str:
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


def _absolute_reward(entry: Any) -> Any:
    """A reward.functions entry with its file ('x.py:fn') or reward-model folder made absolute."""
    if isinstance(entry, str):
        return _absolute_reward({"name": entry})["name"]
    entry = dict(entry)
    if isinstance(entry.get("model"), str):
        entry["model"] = _absolute(entry["model"])
    name = entry.get("name")
    if isinstance(name, str):
        target, sep, fn = name.rpartition(":")
        if sep and target.endswith(".py"):
            entry["name"] = f"{_absolute(target)}:{fn}"
        elif not sep and name not in BUILTINS:  # a reward-model folder (a built-in's name stays one)
            entry["name"] = _absolute(name)
    return entry


class RunFolder:
    """Writes one run's files under `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, path: Path, overwrite: bool = False) -> "RunFolder":
        """A fresh folder, locked. A folder that holds a run is refused unless `overwrite`, which
        removes the run's entries (named on stderr); a folder holding anything else is never used."""
        try:
            check_reusable(path)
            path.mkdir(parents=True, exist_ok=True)
            acquire_lock(path)
        except OSError as exc:  # permissions, a file in the way, a name too long for the file system
            raise LLMRLError(f"Cannot write to run folder '{path}': {exc.strerror}.", exit_code=1) from None
        if (path / MARKER).exists():
            if not overwrite:
                release_lock(path)
                raise LLMRLError(f"'{path}' already holds a run; pass --overwrite to replace it.")
            remove_run(path)
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> "RunFolder":
        """An existing run folder, to resume, locked."""
        if not (path / MARKER).is_file():
            raise LLMRLError(f"'{path}' is not a run folder (no {MARKER}); nothing to resume.")
        try:
            acquire_lock(path)
        except OSError as exc:
            raise LLMRLError(f"Cannot write to run folder '{path}': {exc.strerror}.", exit_code=1) from None
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

    def write_config(self, config: Any) -> None:
        """RUN/config.yaml (a Config, or a reward run's RewardRunConfig), with local paths made absolute
        (`absolute_paths`)."""
        atomic_write(self.path / MARKER, yaml.safe_dump(absolute_paths(to_tree(config)), sort_keys=False))

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
