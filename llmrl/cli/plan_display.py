"""`llmrl train … --plan`: the run's memory plan as a table, made and printed without loading a weight."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..config import Config
from ..memory.budget import run_budget, size_text
from ..memory.plan import MemoryPlan
from ..memory.choose import choose, line, refusal
from ..models.load import resolve_device


def plan_table(config: Config, plan: MemoryPlan) -> Table:
    """The held parts once, then each phase's transients and its total (held + transients), the peak marked."""
    table = Table(title=f"Memory plan ({config.model.name}, {config.model.dtype}"
                        f"{'' if config.model.quantize == 'none' else ', ' + config.model.quantize}, {config.algo})")
    for column, justify in (("phase", "left"), ("part", "left"), ("predicted", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    held = {x.name: x for _, items in plan.phases for x in items if x.kind == "held" and x.bytes}
    for i, part in enumerate(held.values()):
        table.add_row("held" if i == 0 else "", escape(part.name), size_text(part.bytes),
                      end_section=i == len(held) - 1)
    for phase, items in plan.phases:
        shown = [x for x in items if x.kind != "held" and x.bytes]
        for i, part in enumerate(shown):
            table.add_row(phase if i == 0 else "", escape(part.name), size_text(part.bytes))
        mark = "  ← peak" if phase == plan.peak_phase else ""
        table.add_row("" if shown else phase, f"[bold]{phase} total (held + transient){mark}[/]",
                      f"[bold]{size_text(plan.phase_bytes(phase))}[/]", end_section=True)
    return table


def show_plan(config: Config, processes: int = 1, console: Console | None = None) -> MemoryPlan:
    """Print the plan of `config` against one of `processes` processes' budget (memory.max or the device's,
    shared on the CPU), after the settings a run chooses to it, the line it says of them and the verdict;
    a run that could not fit is refused after its table, in the run's sentence."""
    console = console or Console()
    budget = run_budget(config, resolve_device(config.model.device), processes)
    choice = choose(config, budget, world=processes)  # the settings a run would choose (memory/choose.py)
    plan = choice.plan
    console.print(plan_table(choice.config, plan))
    if (said := line(choice)) is not None:
        console.print(escape(said))
    fits = "fits in" if plan.peak_bytes <= budget.bytes else "exceeds"
    console.print(f"Predicted peak {size_text(plan.peak_bytes)} ({plan.peak_phase}) {fits} the budget: "
                  f"{budget.describe()}. No weight was loaded.")
    if (refused := refusal(choice)) is not None:
        raise refused
    return plan
