"""The run's state between steps: what a checkpoint holds besides the weights, saving it, restoring
it for `--resume`, and how a failed run leaves its folder."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

from ..errors import LLMRLError, RunFailed
from .checkpoint import (CheckpointDamaged, list_checkpoints, load_checkpoint, restore_rng, rng_state,
                         save_checkpoint)
from .crash import LOG, describe, where, write_log
from .evaluate import EvalResult
from .folder import read_run
from .session import Session


@dataclass
class Progress:
    """The loop's running state: newest checkpointed step, non-finite steps in a row."""

    saved: int
    bad: int = 0
    version: int = 0  # the trainable weights' version at the start of the step (`weights_version`)


def weights_version(s: Session) -> int:
    """Σ of the trainable parameters' in-place version counters: unchanged while no optimizer step
    (or any other write) touched them, so a step that failed before its update left the state of the
    last completed step."""
    return sum(p._version for role in s.stack.trainable_roles() for p in s.stack.parameters_of(role))


def crashed(s: Session, exc: Exception, step: int, progress: Progress) -> RunFailed:
    """An exception nothing foresaw in step `step` (0-based) as a RunFailed: its traceback written to
    RUN/error.log, consistent (so `fail` checkpoints) when one process ran it and no weight changed."""
    log = write_log(exc, s.folder.path / LOG, "llmrl " + " ".join(sys.argv[1:])) if s.dist.is_main else None
    err = RunFailed(f"Step {step + 1} failed with {describe(exc)} (an error llmrl did not expect; {where(log)}).")
    err.trace = exc
    err.consistent = s.dist.world_size == 1 and weights_version(s) == progress.version
    return err


def state(s: Session, step: int, before: EvalResult | None, elapsed: float) -> dict[str, Any]:
    """Everything besides the weights that an exact resume needs."""
    return {
        "step": step,
        "optimizers": {role: opt.state_dict() for role, opt in s.opts.items()},
        "kl": s.kl.state_dict(),
        "generator": s.generator.get_state(),
        "rng": rng_state(),
        **({"rng_by_rank": s.dist.gather_objects(rng_state())} if s.dist.active else {}),
        "eval_before": None if before is None else {"accuracy": before.accuracy, "reward_mean": before.reward_mean},
        "elapsed_s": elapsed,
    }


def restore(s: Session) -> tuple[int, EvalResult | None, float] | None:
    """Load the newest readable checkpoint into the session: (completed steps, eval-before, elapsed
    seconds); None for a run that stopped before completing a step and has no checkpoint. A damaged
    newest checkpoint (a file cut short or altered) is skipped with a warning for the one before it."""
    found = s.dist.broadcast_object(list_checkpoints(s.folder.path))
    if not found:
        if s.dist.broadcast_object(read_run(s.folder.path).metrics if s.dist.is_main else []):
            raise LLMRLError(f"'{s.folder.path}' has no checkpoint to resume from; start it again with --overwrite.")
        s.folder.truncate_metrics(0)
        return None  # stopped before its first step: nothing was trained, so it starts from the beginning
    damaged: list[CheckpointDamaged] = []
    for path in reversed(found):
        try:
            saved = _load(s, path)
        except CheckpointDamaged as exc:
            damaged.append(exc)
            continue
        if damaged and s.dist.is_main:
            which = "the checkpoint before it" if len(damaged) == 1 else "the newest one that can be read"
            print(f"warning: {damaged[0]} Resuming from {which}, {path.name}.", file=sys.stderr)
        break
    else:
        raise LLMRLError(f"No checkpoint of '{s.folder.path}' can be read: {damaged[0]} Start the run again with "
                         f"--overwrite.")
    s.folder.truncate_metrics(saved["step"])
    before = saved["eval_before"]
    result = None if before is None else EvalResult(before["accuracy"], before["reward_mean"], [])
    return saved["step"], result, float(saved["elapsed_s"])


def _load(s: Session, path: Any) -> dict[str, Any]:
    """Checkpoint `path` into the session's weights, optimizers, KL controller and RNGs; a state that
    cannot be applied (values altered inside a readable file) is CheckpointDamaged too."""
    saved = load_checkpoint(path, s.stack)
    try:
        for role, opt in s.opts.items():
            opt.load_state_dict(saved["optimizers"][role])
        s.kl.load_state_dict(saved["kl"])
        s.generator.set_state(saved["generator"])
        by_rank = saved.get("rng_by_rank")  # a data-parallel run's per-process RNGs, when the world size matches
        restore_rng(by_rank[s.dist.rank] if by_rank and len(by_rank) == s.dist.world_size else saved["rng"])
        int(saved["step"]), float(saved["elapsed_s"])
    except Exception as exc:  # KeyError, ValueError, TypeError, RuntimeError of a state whose bytes changed
        raise CheckpointDamaged(f"The checkpoint file {path / 'state.pt'} holds a state that cannot be restored "
                                f"({type(exc).__name__}: {str(exc).strip()[:120]}).") from None
    s.engine.sync(s.stack)  # an engine with its own weights was loaded from the base: give it the restored actor
    return saved


def checkpoint(s: Session, step: int, before: EvalResult | None, elapsed: float) -> None:
    """Checkpoint after `step` (rank 0 writes; every rank takes part, a write error stops every rank)."""
    saved = state(s, step, before, elapsed)
    s.dist.main_only(lambda: save_checkpoint(s.folder.path, step, s.stack, saved, s.config.checkpoint.keep))


def fail(s: Session, exc: RunFailed, progress: Progress, before: EvalResult | None,
         wall: Callable[[], float]) -> NoReturn:
    """Checkpoint what is consistent, then re-raise `exc` with how to continue."""
    if exc.consistent:  # every rank raised it (dist.agree), so they can still checkpoint together
        done = s.dist.broadcast_object(len(read_run(s.folder.path).metrics) if s.dist.is_main else 0)
        if done > progress.saved:
            checkpoint(s, done, before, wall())
            progress.saved = done
    if not list_checkpoints(s.folder.path):
        err = RunFailed(f"{exc} No checkpoint was written yet; fix the cause and start again with --overwrite.")
    else:
        err = RunFailed(f"{exc} Training state after step {progress.saved} is checkpointed; fix the cause and "
                        f"continue with: llmrl train --resume {s.folder.path}")
    err.trace = exc.trace
    raise err from None
