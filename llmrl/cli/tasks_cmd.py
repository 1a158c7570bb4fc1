"""`llmrl tasks`: the built-in tasks and, with the reasoning-gym extra, its datasets; `llmrl tasks NAME`
shows one task's settings and its first held-out prompt."""

from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..tasks import TASKS, get_task, rg
from .errors import friendly


def _first_line(obj: Any) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    return doc[0].strip() if doc else ""


def listing() -> dict[str, Any]:
    """{'builtin': [{name, about}], 'reasoning_gym': [{name, category, about}] or None, 'reasoning_gym_version'}."""
    from .. import tasks

    builtin = [{"name": n, "about": _first_line(getattr(tasks, n, None) or fn)} for n, fn in TASKS.items()]
    version = rg.version()
    found = None
    if version is not None:
        from reasoning_gym.factory import DATASETS

        found = [{"name": f"rg:{n}", "category": DATASETS[n][0].__module__.split(".")[1], "about": rg.describe(n)}
                 for n in rg.names()]
    return {"builtin": builtin, "reasoning_gym": found, "reasoning_gym_version": version}


def detail(name: str) -> dict[str, Any]:
    """One task: its settings (reasoning-gym: the generator's, with defaults) and its first held-out row."""
    settings: dict[str, Any] = {}
    if rg.is_rg(name):
        rg.require()
        base, _ = rg.parse(name)
        if base in rg.names():
            settings = rg.config_fields(base)
        task = get_task(name, train_size=4, eval_size=1)
    else:
        task = get_task(name)
    row = task.eval[0]
    return {"name": name, "settings": settings, "train_rows": len(task.train) if not rg.is_rg(name) else None,
            "held_out_rows": len(task.eval) if not rg.is_rg(name) else None,
            "metrics": ["accuracy", *task.metrics], "example": {"prompt": row["prompt"], "answer": row.get("answer")}}


@friendly
def tasks(
    name: Optional[str] = typer.Argument(None, help="Show one task: its settings and first held-out prompt (e.g. rg:leg_counting)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """List the tasks `--task` takes: the built-in ones and, with `pip install 'llmrl[reasoning-gym]'`, reasoning-gym's."""
    report = detail(name) if name else listing()
    if as_json:
        typer.echo(json.dumps(report, default=str))
        return
    console = Console()
    if name:
        console.print(f"[bold]{escape(name)}[/bold]: metrics {', '.join(report['metrics'])}")
        if report["settings"]:
            table = Table(title="settings (rg:NAME?key=value&…, or rg.config / mix.tasks[].config in a recipe)")
            table.add_column("key")
            table.add_column("default")
            for key, value in report["settings"].items():
                table.add_row(key, escape(repr(value)))
            console.print(table)
        prompt = report["example"]["prompt"]
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
        console.print("first held-out prompt:\n" + escape(text) + f"\nanswer: {escape(str(report['example']['answer']))}")
        return
    table = Table(title="Tasks (--task NAME; several: --task A,B or task: mix with mix.tasks)")
    for col in ("task", "kind", "what"):
        table.add_column(col)
    for t in report["builtin"]:
        table.add_row(t["name"], "built-in", escape(t["about"]))
    for t in report["reasoning_gym"] or []:
        table.add_row(t["name"], f"reasoning-gym {t['category']}", escape(t["about"]))
    console.print(table)
    if report["reasoning_gym"] is None:
        console.print(f"reasoning-gym's ~100 tasks (rg:NAME) need its package: {rg.INSTALL}.")
    else:
        console.print(f"reasoning-gym {report['reasoning_gym_version']}: `llmrl tasks rg:NAME` shows a task's settings.")
