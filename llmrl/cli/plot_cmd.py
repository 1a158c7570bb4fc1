"""`llmrl plot`: draw finished (or running) runs together: reward, KL and held-out accuracy vs step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import ConfigError
from ..run.folder import Run, read_run
from .errors import friendly


def expand(paths: list[Path]) -> list[Run]:
    """Run folders as given; a compare folder (with compare.json) stands for all of its runs."""
    runs: list[Run] = []
    for p in paths:
        record = p / "compare.json"
        if record.is_file():
            names = json.loads(record.read_text())["runs"]
            runs += [read_run(p / n) for n in names if (p / n / "config.yaml").is_file()]
        else:
            runs.append(read_run(p))
    return runs


def default_target(paths: list[Path]) -> Path:
    """Where the plot goes without --out: into the one folder given (a run or a compare folder),
    else ./curves.png."""
    return paths[0] / "curves.png" if len(paths) == 1 else Path("curves.png")


@friendly
def plot(
    run_dirs: list[Path] = typer.Argument(..., help="Run folders (or compare folders) to draw together."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Image file (.png, .svg or .pdf). Default: curves.png in the one run or compare folder given, else curves.png here."),
) -> None:
    """Draw runs together: train reward, KL to the reference and held-out accuracy vs step."""
    from ..run.plots import check_target, draw_runs  # late: matplotlib

    runs = expand(run_dirs)
    empty = [str(r.path) for r in runs if not r.metrics]
    if empty:
        raise ConfigError(f"'{empty[0]}' has no logged steps yet; nothing to plot.")
    target = out or default_target(run_dirs)
    check_target(target)
    draw_runs(runs, target)
    typer.echo(f"wrote {target}")
