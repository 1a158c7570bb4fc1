"""Rich terminal output of `llmrl compare`: what differs, a live view of every run, the result tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..compare.plan import Plan, RunSpec
from ..compare.report import COST, OUTCOME, VARIANCE, cell, columns, prompt_verdict
from ..config import Config
from ..run.evaluate import EvalResult
from ..run.memory import RoleCost
from ..run.folder import read_run
from .console import RunConsole


def differences_table(plan: Plan) -> Table:
    """Every setting whose resolved value differs between the algorithms."""
    table = Table(title="What differs between the algorithms (every other setting is identical)")
    table.add_column("setting")
    for algo in plan.algos:
        table.add_column(algo, justify="right")
    for key, values in plan.differences().items():
        table.add_row(key, *(repr(values[a]) for a in plan.algos))
    return table


def budget_line(plan: Plan) -> str:
    first = [r for r in plan.runs if r.seed == plan.seeds[0]]
    sizes = ", ".join(f"{r.algo} {r.config.rollout.prompts_per_step} × {r.config.rollout.num_generations}" for r in first)
    seeds = ", ".join(map(str, plan.seeds))
    return (f"{len(plan.runs)} runs, {first[0].config.steps} steps each, {first[0].rows_per_step} rows per step "
            f"(prompts × samples: {sizes}; matched by {plan.match}); seeds {seeds} change only 'seed'.")


class CompareDisplay:
    """One progress line per run (status, steps, reward so far, KL, accuracy) plus an overall line."""

    def __init__(self, plan: Plan, console: Console | None = None) -> None:
        self.console = console or RunConsole()
        self.progress = Progress(
            TextColumn("[bold]{task.description:<18}"), TextColumn("{task.fields[status]:<10}"), BarColumn(),
            MofNCompleteColumn(), TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), console=self.console,
        )
        total = sum(r.config.steps for r in plan.runs)
        self.overall = self.progress.add_task("all runs", total=total, status="", stats="")
        self.tasks = {r.name: self.progress.add_task(r.name, total=r.config.steps, start=False, status="waiting", stats="")
                      for r in plan.runs}

    def __enter__(self) -> "CompareDisplay":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def log(self, message: str) -> None:
        self.progress.console.print(message)

    def reporter_for(self, spec: RunSpec, state: str) -> "RunLine":
        line = RunLine(self, spec, self.tasks[spec.name])
        if state == "done":
            line.mark(spec.config.steps, "reused")
            summary = read_run(spec.config.out or "").summary or {}
            line.accuracy = summary.get("eval_accuracy_after")
            if summary.get("reward_mean_last") is not None:
                line.rewards = [summary["reward_mean_last"]]
            line.kl = summary.get("kl_last")
            line._stats()
        return line


class RunLine:
    """The Reporter of one run inside a compare: updates that run's progress line."""

    interactive = False

    def __init__(self, display: CompareDisplay, spec: RunSpec, task: TaskID) -> None:
        self.display, self.spec, self.task = display, spec, task
        self.progress = display.progress
        self.accuracy: float | None = None
        self.rewards: list[float] = []
        self.kl: float | None = None

    def mark(self, completed: int, status: str) -> None:
        self.progress.update(self.task, completed=completed, status=status)
        self.progress.update(self.display.overall, advance=completed)

    def start(self, config: Config, costs: list[RoleCost], run_dir: Path) -> None:
        self.progress.start_task(self.task)
        self.progress.update(self.task, status="evaluating")

    def evaluated(self, step: int, result: EvalResult | None) -> None:
        if result is not None:
            self.accuracy = result.accuracy
        self._stats()

    def resumed(self, step: int) -> None:
        self.mark(step, "resumed")

    def step(self, row: dict[str, Any]) -> None:
        self.rewards.append(row["reward_mean"])
        self.kl = row.get("kl")
        self.progress.update(self.task, advance=1, status="training")
        self.progress.update(self.display.overall, advance=1)
        self._stats()

    def _stats(self) -> None:
        parts = []
        if self.rewards:
            mean = f" (mean {sum(self.rewards) / len(self.rewards):.3f})" if len(self.rewards) > 1 else ""
            parts.append(f"reward {self.rewards[-1]:.3f}{mean}")
        if self.kl is not None:
            parts.append(f"KL {self.kl:.3f}")
        if self.accuracy is not None:
            parts.append(f"acc {100 * self.accuracy:.1f} %")
        self.progress.update(self.task, stats="  ".join(parts))

    def stopped(self) -> None:
        self.progress.update(self.task, status="stopped")

    def end(self, summary: dict[str, Any]) -> None:
        self.progress.update(self.task, status="done")


def _table(title: str, spec: list, summary: dict[str, Any]) -> Table:
    algos = summary["algos"]
    cols = columns(spec, algos)
    table = Table(title=title)
    table.add_column("algo")
    for _, header, _, _ in cols:
        table.add_column(header, justify="right")
    for algo, stats in algos.items():
        table.add_row(algo, *(cell(stats[c], f, u) for c, _, u, f in cols))
    return table


def print_results(console: Console, summary: dict[str, Any], out: Path) -> None:
    """The three result tables, the prompt check and where the files are."""
    n = len(summary["plan"]["seeds"])
    console.print(_table(f"Outcome (mean ± std over {n} seed{'s' * (n > 1)})", OUTCOME, summary))
    console.print(_table("Cost", COST, summary))
    console.print(_table("Variance (advantages; actor minibatch gradients g_m, pre-clip)", VARIANCE, summary))
    check = summary["prompts"]
    verdicts = "; ".join(f"seed {s}: {prompt_verdict(v)}" for s, v in check["seeds"].items())
    console.print(f"Prompts read by the algorithms — {verdicts}.")
    console.print(f"Wall time of this command: {summary['wall_time_s']:.0f} s (the runs' own: "
                  f"{summary['runs_wall_time_s']:.0f} s). "
                  f"Files: [bold]{out}[/]/summary.json, report.md, {', '.join(summary['plots'].values())}")
