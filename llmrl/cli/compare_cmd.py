"""`llmrl compare`: several algorithms × seeds on the same prompts and budget, then one table."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from ..compare import build_plan, compare as run_compare, parse_algos, parse_seeds
from .compare_display import CompareDisplay, budget_line, differences_table, print_results
from .console import RunConsole
from .errors import friendly

IMPORTED = time.time()


def process_started() -> float:
    """The `time.time()` at which this process started (Linux: its start in clock ticks after boot,
    /proc/self/stat field 22, against /proc/uptime), so the imports count too; else the module's import."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return IMPORTED
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


@friendly
def compare(
    algos: str = typer.Option(..., "--algos", "-a", help="Comma-separated algorithm presets, e.g. grpo,rloo,ppo (see `llmrl algos`)."),
    out: Path = typer.Option(..., "--out", "-o", help="Compare folder: one run folder per (algo, seed), summary.json, report.md, plots."),
    seeds: str = typer.Option("0", "--seeds", "-s", help="Comma-separated seeds, e.g. 0,1,2; every algorithm runs every seed."),
    steps: Optional[int] = typer.Option(None, "--steps", "-n", help="Training steps of every run."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model of every run: 'tiny', 'tiny-tools' or 'tiny-guess' (built-in), a name from `llmrl models`, a hub id, a local folder or a .gguf file."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Task of every run: arithmetic (default), chat_sum, calc, chat_calc, chat_calc_tools, chat_calc_json, guess, guess_signs, ta:ENV_ID (a TextArena game), rg:NAME (reasoning-gym; `llmrl tasks`) or A,B,… (a mixture)."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="YAML recipe applied to every run (its 'algo' is replaced)."),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="key=value applied to every run (repeatable; `llmrl config` lists keys)."),
    match: str = typer.Option("rows", "--match", help="'rows': same rows per step (B × G), each algorithm keeps its G; 'prompts': same B and G for all, so every step trains on identical prompts."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a compare with a different plan already in --out."),
) -> None:
    """Train several algorithms on identical prompts, seeds and budget; compare them in one table.

    Rerunning the same command continues: finished runs are reused, interrupted ones resume.
    """
    names = parse_algos(algos)
    seed_list = parse_seeds(seeds)
    plan = build_plan(names, seed_list, out, steps=steps, recipe=recipe, sets=sets, match=match,
                      overrides={"model.name": model, "task": task})
    console = RunConsole()
    if plan.differences():
        console.print(differences_table(plan))
    else:
        console.print("One algorithm: its runs differ only in 'seed'.")
    console.print(budget_line(plan))
    command = shlex.join(["llmrl", "compare", *sys.argv[2:]]) if sys.argv[1:2] == ["compare"] else "llmrl compare"
    with CompareDisplay(plan, console) as display:
        summary = run_compare(plan, out, display.reporter_for, overwrite=overwrite, log=display.log, command=command,
                              started=process_started())
    print_results(console, summary, out)
