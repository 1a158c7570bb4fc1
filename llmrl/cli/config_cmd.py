"""`llmrl config`: every setting with its resolved value and help text."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

from ..config import load_config, to_tree
from ..config.domains import describe
from ..config.load import field_types, flatten
from .errors import friendly


@friendly
def config(
    algo: Optional[str] = typer.Option(None, "--algo", "-a", help="Show the values this algorithm's preset gives."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Resolve for this model: the built-in tiny has its own defaults, any other model a real model's for its device."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="Apply this recipe too."),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="key=value overrides, as for `llmrl train`."),
    as_yaml: bool = typer.Option(False, "--yaml", help="Print the resolved config as YAML (a recipe to start from)."),
) -> None:
    """List every setting (dotted key, value, domain, help), resolved for --algo/--recipe/--set.

    The domain is what a value must be (type, range or choices), checked before anything loads."""
    cfg = load_config(recipe, {"algo": algo, "model.name": model}, sets)
    if as_yaml:
        typer.echo(yaml.safe_dump(to_tree(cfg), sort_keys=False), nl=False)
        return
    values = flatten(to_tree(cfg))
    table = Table(title=f"Settings for algo '{cfg.algo}', model '{cfg.model.name}'")
    for col in ("key", "value", "domain", "help"):
        table.add_column(col)
    for key, (tp, f) in field_types().items():
        table.add_row(key, repr(values[key]), describe(tp, f.metadata), f.metadata.get("help", ""))
    Console().print(table)
