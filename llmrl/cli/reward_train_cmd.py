"""`llmrl reward train`: a reward model (LoRA adapter + score head on the base) from preference pairs."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..config.reward_run import load_reward_config
from ..errors import ConfigError
from ..reward_model.folder import finished, stored_config
from ..reward_model.train import train_reward
from .errors import friendly


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


@friendly
def reward_train(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="The base: as `llmrl train --model` takes it "
                                        "(built-in, `llmrl models get` name, hub id, folder). Key model.name."),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="Preference pairs in TRL's format (prompt + chosen + "
                                       "rejected, text or conversations; or chosen + rejected whole conversations): a "
                                       ".jsonl/.parquet/.csv file or a hub dataset name. Key pairs.dataset."),
    eval_data: Optional[str] = typer.Option(None, "--eval-data", help="Held-out pairs from this file or hub name "
                                            "(default: hold out pairs.eval_fraction of --data). Key pairs.eval_dataset."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="YAML recipe of a reward run (see recipes/)."),
    epochs: Optional[float] = typer.Option(None, "--epochs", help="Passes over the training pairs. Key rm.epochs."),
    seed: Optional[int] = typer.Option(None, "--seed", "-s", help="Seed of the shuffles and the head's start."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run folder. Default: runs/reward-<data>-<time>."),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="Any other setting as key=value, e.g. --set rm.lr=5e-5 "
                                             "(model.*, lora.*, pairs.*, rm.*, checkpoint.*; docs/reward-models.md)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run already in --out."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the reward run in this folder from its "
                                          "newest checkpoint."),
) -> None:
    """Train a reward model r(x, y) on preference pairs with the Bradley–Terry loss −log σ(r(x, y_w) − r(x, y_l)):
    a LoRA adapter and a score head on the base (float, or 4-bit with --set model.quantize=nf4). Prints held-out
    pairwise accuracy before → after; RUN/adapter is a peft SEQ_CLS adapter; `llmrl train --reward RUN` scores
    with it on the same base, `llmrl export RUN` writes a sequence classifier."""
    if resume is not None:
        if any(v is not None for v in (model, data, eval_data, recipe, epochs, seed, out)) or sets or overwrite:
            raise ConfigError("--resume continues a reward run with its own settings; give no other option with it.")
        stored_config(resume)  # an RL run, a folder that holds no run, a damaged config.yaml: one sentence
        if finished(resume):
            print(f"'{resume}' has finished; nothing to resume (its reward model is in {resume / 'adapter'}).")
            return
        config = load_reward_config()
    else:
        overrides = {"model.name": model, "pairs.dataset": data, "pairs.eval_dataset": eval_data, "rm.epochs": epochs,
                     "seed": seed, "out": str(out) if out else None}
        config = load_reward_config(str(recipe) if recipe else None, overrides, sets)
    console = Console(stderr=True)
    columns = (TextColumn("[bold]reward model[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with ExitStack() as held:
        bars: list[Progress] = []  # the bar starts with the first step: an input refused before it prints one line

        def show(step: int, steps: int, row: dict) -> None:
            if not bars:
                bars.append(held.enter_context(Progress(*columns, console=console, transient=False)))
                bars[0].add_task("train", total=steps, info="")
            held_out = f"  held-out {_percent(row['eval_accuracy'])}" if "eval_accuracy" in row else ""
            bars[0].update(bars[0].task_ids[0], completed=step, total=steps, info=f"loss {row['loss']:.3f}{held_out}")

        result = train_reward(config, overwrite=overwrite, resume=resume, progress=show)
    b, a = result.before, result.after
    took = f"{result.steps} steps, {result.seconds:.1f} s, peak {result.peak_rss_mib:.0f} MiB"
    if not a:  # pairs.eval_fraction=0 and no pairs.eval_dataset: nothing held out to measure
        Console().print(f"No held-out pairs (pairs.eval_fraction=0, no pairs.eval_dataset), so no accuracy ({took}).")
    else:
        Console().print(f"Held-out pairwise accuracy {_percent(b.get('eval_accuracy'))} → "
                        f"{_percent(a.get('eval_accuracy'))}, mean margin {b.get('eval_margin', float('nan')):+.3f} → "
                        f"{a.get('eval_margin', float('nan')):+.3f} ({took})")
    Console().print(f"Reward model in [bold]{result.path}[/]: score with `llmrl train --reward {result.path}`, "
                    f"export with `llmrl export {result.path} --out DIR`.")
