"""`llmrl compare`: algorithms side by side on the same prompts, seeds and budget.

    plan.py       which runs, resolved configs, what differs, how the budget is matched
    runner.py     DIR/compare.json, then train / resume / reuse each run in this process
    aggregate.py  per-run numbers, mean ± std per algorithm, the prompt-stream check
    report.py     summary.json and report.md

`compare` strings them together; the CLI (cli/compare_cmd.py) adds the live view and the tables.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from ..run.reporting import Reporter
from .plan import Plan, RunSpec, build_plan, parse_algos, parse_seeds
from .report import summarize, write
from .runner import prepare, run_plan

__all__ = ["Plan", "RunSpec", "build_plan", "compare", "parse_algos", "parse_seeds"]


def compare(plan: Plan, out: Path, reporter_for: Callable[[RunSpec, str], Reporter], *, overwrite: bool = False,
            log: Callable[[str], None] = lambda _: None, command: str = "llmrl compare",
            started: float | None = None) -> dict[str, Any]:
    """Run (or continue) `plan` in `out`; write the plots, summary.json and report.md; return the summary.

    `started`: the `time.time()` at which the command began (default: now), so that the summary's
    wall time is the command's, from its start to the summary made.
    """
    from ..run.plots import draw_compare  # late: matplotlib

    started = time.time() if started is None else started
    prepare(out, plan, overwrite)
    runs = run_plan(plan, reporter_for, log)
    groups = {algo: [runs[r.name] for r in plan.runs if r.algo == algo] for algo in plan.algos}
    plots = draw_compare(groups, out)
    summary = {**summarize(plan, runs, plots), "wall_time_s": time.time() - started}
    write(out, summary, command)
    return summary
