"""train: the one loop every algorithm shares (one step: `one_step.py`).

    setup → evaluate → for step in range(steps): run_step, evaluate when due, log, checkpoint when due
          → last checkpoint → evaluate → save adapters, summary and curves

The loop never names an algorithm: `session.plan_for` reads the estimator's `needs` into a
`StepPlan`. Under torchrun with W > 1 processes every rank runs this loop on its B/W prompts of
each step; rank 0 alone reports and writes the run folder.
"""

from __future__ import annotations

import time
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

from ..config import Config, precision
from ..errors import LLMRLError, PluginError, RunFailed
from ..parallel.distributed import DistContext, distributed
from .evaluate import EvalResult
from .folder import Run, folder_locks, read_run
from .memory import PhasePeaks, engine_costs, role_costs
from .one_step import run_step
from .reporting import NullReporter, Reporter
from .session import Session, record_steps, run_eval, setup
from .checkpoint import list_checkpoints, newest_step
from .crash import LOG, unexpected, write_log
from .signals import graceful_stop
from .state import Progress, checkpoint, crashed, fail, restore, weights_version
from .summary import LEGITIMATE, draw_curves, eval_scalars, optimizer_steps, summarize
from .trackers import Trackers, check_available, open_trackers


def train(config: Config, reporter: Reporter | None = None, overwrite: bool = False, resume: bool = False) -> Run:
    """Run `config` to the end and return the finished run read back from its folder.

    With `resume`, `config.out` must hold a run with a checkpoint: it continues from the newest one
    and, on CPU with the same settings, produces the same metrics as an uninterrupted run.

    Launched by torchrun with W > 1 processes, every process calls this; rank 0 alone reports and
    writes the run folder (the others return the run with empty metrics).

    A dtype 'auto' (a Config built in Python; load_config resolves its own) is resolved first, so that
    config.yaml names the dtype the run trained in.
    """
    config = precision.resolved(config)
    with distributed(config.model.device, config.dist.timeout_s) as dist, folder_locks() as taken:
        try:
            return _train(config, (reporter or NullReporter()) if dist.is_main else NullReporter(), overwrite, resume,
                          dist)
        except Exception as exc:
            if isinstance(exc, LLMRLError):
                raise
            raise _outside_steps(exc, taken()) from None


def _outside_steps(exc: Exception, folders: list[Path]) -> LLMRLError:
    """The last resort for an error nothing foresaw outside a step (setup, the first or last evaluation,
    saving the models): its traceback in RUN/error.log once the run folder exists, and where to go on."""
    folder = folders[0] if folders else None
    log = write_log(exc, folder / LOG, "llmrl " + " ".join(sys.argv[1:])) if folder else None
    saved = newest_step(folder) if folder and list_checkpoints(folder) else None
    after = (f" Training state after step {saved} is checkpointed; fix the cause and continue with: "
             f"llmrl train --resume {folder}" if saved is not None else "")
    return unexpected(exc, "The run" + (f" in {folder}" if folder else ""), log, after)


def _train(config: Config, reporter: Reporter, overwrite: bool, resume: bool, dist: DistContext) -> Run:
    t0 = time.perf_counter()
    check_available(config.log.report_to)
    start, elapsed = 0, 0.0
    peaks = PhasePeaks(config.model.device)  # each phase's peak memory: metrics rows and summary.json
    with peaks("load"):
        s = setup(config, reporter, overwrite, resume, dist)  # writes config.yaml as its last act
    with nullcontext() if resume else _nothing_trained_yet(s):
        reporter.start(config, role_costs(s.stack) + engine_costs(s.engine), s.folder.path)
        with peaks("load"):
            restored = restore(s) if resume else None
        if resume:  # only now: a resume refused (no readable checkpoint) leaves config.yaml as it was
            s.dist.main_only(lambda: record_steps(s.folder, config))
        if restored is not None:
            start, before, elapsed = restored
            reporter.resumed(start)
        else:
            with peaks("evaluate"):
                before = run_eval(s)
    reporter.evaluated(0, before)
    trackers = open_trackers(config, s.folder.path, start) if s.dist.is_main else Trackers([])
    if before is not None and start == 0:
        trackers.log(eval_scalars(before), step=0)
    wall = lambda: elapsed + time.perf_counter() - t0  # noqa: E731
    progress = Progress(saved=start)
    with graceful_stop() as stop, _close_on_error(trackers):
        try:
            for step in range(start, config.steps):
                _one_step(s, step, reporter, trackers, stop, progress, before, wall, peaks)
        except RunFailed as exc:
            reporter.stopped()
            if isinstance(exc, PluginError):  # checked before the step's update; one inside it (a policy loss) may
                exc.consistent = exc.consistent and weights_version(s) == progress.version  # follow a pass's step
            fail(s, exc, progress, before, wall)
        except KeyboardInterrupt:
            reporter.stopped()
            raise LLMRLError(
                f"Interrupted; the newest checkpoint is after step {progress.saved}. "
                f"Continue with: llmrl train --resume {s.folder.path}", exit_code=130
            ) from None
        except Exception as exc:  # nothing foresaw it (a bug, a user module's own error): the last resort
            if isinstance(exc, LLMRLError):
                raise
            reporter.stopped()
            fail(s, crashed(s, exc, step, progress), progress, before, wall)
    return _finish(s, reporter, trackers, progress, before, wall, peaks)


@contextmanager
def _nothing_trained_yet(s: Session) -> Iterator[None]:
    """A new run's start-up table and first evaluation: Ctrl-C there says how to start it again; a
    plug-in's bad output there (a reward, an environment in the evaluation's episodes) is found before
    the first step: exit 2."""
    try:
        yield
    except KeyboardInterrupt:
        raise LLMRLError(f"Interrupted before the first step; nothing was trained. Start it again with: "
                         f"llmrl train --resume {s.folder.path}", exit_code=130) from None
    except PluginError as exc:
        raise PluginError(f"{exc} Nothing was trained (this was the evaluation before the first step); fix the cause "
                          f"and start it again with: llmrl train --resume {s.folder.path}", exit_code=2) from None


def _one_step(s: Session, step: int, reporter: Reporter, trackers: Trackers, stop: Any, progress: Progress,
              before: EvalResult | None, wall: Callable[[], float], peaks: PhasePeaks) -> None:
    """Train step `step`, evaluate when due, log (with each phase's peak memory), checkpoint when due;
    raise RunFailed after `update.max_bad_steps` non-finite steps in a row, KeyboardInterrupt when a
    stop was requested."""
    config = s.config
    progress.version = weights_version(s)
    peaks.start_step()
    report = run_step(s, step, peaks)
    row = report.row
    if config.eval.every and (step + 1) % config.eval.every == 0 and step + 1 < config.steps:
        with peaks("evaluate"):
            result = run_eval(s)
        row = {**row, "eval_accuracy": result.accuracy if result else None, "eval_reward": result.reward_mean if result else None,
               **({f"eval_{k}": v for k, v in result.metrics.items()} if result else {})}
        reporter.evaluated(step + 1, result)
    row = {**row, **peaks.step}
    s.folder.log_metrics(row)
    trackers.log(row)
    if report.logged:
        s.folder.log_completions(report.logged)
        show = getattr(reporter, "completions", None)  # a reporter may not show them
        if show is not None:
            show(report.logged)
    reporter.step(row)
    progress.bad = progress.bad + 1 if row["skipped_updates"] else 0
    if progress.bad >= config.update.max_bad_steps:
        newest = f"; the newest good checkpoint is after step {progress.saved}" if progress.saved else ""
        raise RunFailed(
            f"Stopped: {progress.bad} steps in a row had a non-finite loss or gradient (last at step {step + 1}){newest}."
        )
    every = config.checkpoint.every
    stopping = s.dist.any(stop.requested)  # every rank stops at the same step
    if stopping or (every and (step + 1) % every == 0):
        with peaks("checkpoint"):
            checkpoint(s, step + 1, before, wall())
        progress.saved = step + 1
    if stopping and step + 1 < config.steps:
        raise KeyboardInterrupt


def _finish(s: Session, reporter: Reporter, trackers: Trackers, progress: Progress, before: EvalResult | None,
            wall: Callable[[], float], peaks: PhasePeaks) -> Run:
    """Last checkpoint, final evaluation; rank 0 saves the models, summary (with the run's peak of each
    phase) and curves."""
    config = s.config
    if progress.saved < config.steps:
        with peaks("checkpoint"):
            checkpoint(s, config.steps, before, wall())
    with peaks("evaluate"):
        after = run_eval(s)
    reporter.evaluated(config.steps, after)
    if after is not None:
        trackers.log(eval_scalars(after), step=config.steps)
    if not s.dist.is_main:
        s.dist.barrier()  # wait for rank 0 to write the models and the summary
        return Run(s.folder.path, {}, [], None)
    s.folder.save_models(s.stack)
    history = read_run(s.folder.path).metrics
    summary = summarize(config, history, before, after, wall(), s.folder.path, optimizer_steps(s.opts["actor"]),
                        peaks.run, s.memory.peak_bytes if s.memory else None)
    s.folder.write_summary(summary)
    draw_curves(s.folder.path)
    trackers.close()
    reporter.end(summary)
    s.dist.barrier()
    if summary["no_update"] is not None and not summary["no_update"].startswith(LEGITIMATE):
        raise RunFailed(f"No update was applied in the run's {summary['steps']} steps: {summary['no_update']}; the "
                        f"adapters saved in {s.folder.path} are the initial ones.")
    return read_run(s.folder.path)


@contextmanager
def _close_on_error(trackers: Any) -> Iterator[None]:
    """Close the trackers when the loop stops with an error; a finished run closes them at its end."""
    try:
        yield
    except BaseException:
        trackers.close()
        raise
