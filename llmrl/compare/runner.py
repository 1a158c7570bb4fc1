"""Run a compare's plan in this process, one run after another, continuing where a previous call stopped.

DIR/compare.json records the plan. On a later call with the same plan each run is

    done      its summary.json exists and covers every step   → reused as it is (not retrained)
    resume    it has a checkpoint                              → trainer.train(..., resume=True)
    fresh     anything else (nothing, or a run that died before its first checkpoint) → trained anew

A DIR that holds a compare with a different plan is refused unless `overwrite`, which deletes it.
"""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from ..run.checkpoint import list_checkpoints
from ..run.reporting import Reporter
from ..run.loop import train
from ..errors import LLMRLError
from ..run.memory import reset_peak_memory
from ..run.folder import Run, atomic_write, read_run
from .plan import Plan, RunSpec

PLAN_FILE = "compare.json"


def plan_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences between two plan fingerprints ('steps: 3 → 5', …), at most five."""
    changes = [f"{k}: {old.get(k)} → {new[k]}" for k in ("algos", "seeds", "match") if old.get(k) != new[k]]
    if not changes:
        old_runs, new_runs = old.get("runs", {}), new["runs"]
        for name, flat in new_runs.items():
            before = old_runs.get(name, {})
            changes += [f"{k}: {before.get(k)!r} → {v!r}" for k, v in flat.items() if before.get(k) != v]
            if changes:
                break
    return sorted(set(changes))[:5]


def prepare(out: Path, plan: Plan, overwrite: bool = False) -> None:
    """Make `out` hold this plan: create it, accept the same plan, or refuse/replace another one."""
    record = out / PLAN_FILE
    new = json.loads(json.dumps(plan.fingerprint(), default=str))  # as it reads back from the file
    if record.is_file():
        old = json.loads(record.read_text())
        if old != new:
            if not overwrite:
                changed = "; ".join(plan_changes(old, new))
                raise LLMRLError(
                    f"'{out}' holds a compare with a different plan ({changed}); "
                    f"rerun its own command, pass --overwrite to replace it, or choose another --out."
                )
            shutil.rmtree(out)
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise LLMRLError(f"'{out}' exists and is not a compare folder (no {PLAN_FILE}); choose another --out.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(record, json.dumps(new, indent=2) + "\n")
    except OSError as exc:
        raise LLMRLError(f"Cannot write to compare folder '{out}': {exc.strerror}.", exit_code=1) from None


def status(spec: RunSpec) -> str:
    """'done', 'resume' or 'fresh' (see the module docstring)."""
    path = Path(spec.config.out or "")
    summary = path / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("steps") == spec.config.steps:
        return "done"
    if (path / "config.yaml").is_file() and list_checkpoints(path):
        return "resume"
    return "fresh"


def run_plan(plan: Plan, reporter_for: Callable[[RunSpec, str], Reporter],
             log: Callable[[str], None] = lambda _: None) -> dict[str, Run]:
    """Train (or reuse, or resume) every run of `plan` in order; returns the finished runs by name."""
    runs: dict[str, Run] = {}
    for spec in plan.runs:
        state = status(spec)
        reporter = reporter_for(spec, state)
        if state == "done":
            log(f"{spec.name}: finished earlier, reused (not retrained)")
            runs[spec.name] = read_run(spec.config.out or "")
            continue
        log(f"{spec.name}: {'resuming from its newest checkpoint' if state == 'resume' else 'training'}")
        reset_peak_memory()
        try:
            runs[spec.name] = train(spec.config, reporter, overwrite=True, resume=state == "resume")
        except LLMRLError as exc:
            raise type(exc)(f"{spec.name}: {exc} Rerun the same llmrl compare command to continue.",
                            exit_code=exc.exit_code) from None
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return runs
