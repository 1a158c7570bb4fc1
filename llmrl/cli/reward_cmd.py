"""`llmrl reward`: reward models from preference pairs; `llmrl reward pairs` makes the pairs from a verifier."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..errors import ConfigError, LLMRLError
from .console import RunConsole
from .errors import friendly

reward = typer.Typer(
    name="reward",
    help="Reward models from preference pairs: `llmrl reward pairs` samples pairs labelled by a task's verifier.",
    no_args_is_help=True,
)


@reward.command()
@friendly
def pairs(
    model: str = typer.Option(..., "--model", "-m", help="The policy that samples: a model folder, a hub id, 'tiny', a .gguf file, or a run folder (its trained actor)."),
    out: Path = typer.Option(..., "--out", "-o", help="The JSONL file to write, one pair a line in TRL's preference format."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="A task with a checker: arithmetic, chat_sum, rg:NAME (reasoning-gym), A,B (a mixture); or a dataset with --set data.dataset=FILE --set reward.functions=[NAME]. Default: arithmetic."),
    split: str = typer.Option("train", "--split", help="train, or eval: the held-out split (no prompt of it is a train prompt)."),
    prompts: Optional[int] = typer.Option(None, "--prompts", "-n", help="Sample the first N prompts of the split. Default: all of them."),
    samples: int = typer.Option(4, "--samples", "-k", help="K completions per prompt (≥ 2)."),
    pairs_per_prompt: int = typer.Option(1, "--pairs-per-prompt", "-p", help="At most P pairs per prompt (distinct right × wrong completions)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="Sampling temperature. Default: rollout.temperature (1.0)."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Longest completion. Default: rollout.max_new_tokens (the model's default)."),
    seed: int = typer.Option(0, "--seed", "-s", help="Seed of the completions and of the choice of pairs."),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="Any other setting as key=value, as `llmrl train` reads it (repeatable)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it is a pairs file llmrl wrote."),
) -> None:
    """Sample K completions per prompt with the model's own policy, grade them with the task's reward,
    and write pairs (chosen = right, rejected = wrong, same prompt) in TRL's preference format: the
    gold-reward setup of Gao et al. 2022 (docs/reward-models.md)."""
    from ..reward_model.verifier_pairs import check_out, make_pairs, open_source, write_pairs

    if temperature is not None and not 0 < temperature < math.inf or max_new_tokens is not None and max_new_tokens < 1:
        raise ConfigError("--temperature must be a finite number > 0 and --max-new-tokens ≥ 1.")
    check_out(out, overwrite)
    overrides = {"rollout.temperature": temperature, "rollout.max_new_tokens": max_new_tokens, "seed": seed}
    console = RunConsole()
    src = open_source(model, task, split, prompts=prompts, samples=samples, pairs_per_prompt=pairs_per_prompt,
                      overrides=overrides, sets=sets, show_progress=console.is_terminal)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        job = bar.add_task(f"sampling {src.settings.samples} per prompt", total=len(src.rows))
        result = make_pairs(src.engine, src.tokenizer, src.rows, src.task.reward, src.task.success, src.settings,
                            role=src.role, on_prompts=lambda n: bar.advance(job, n))
    if not result.pairs:
        raise LLMRLError(f"No prompt gave a pair, so nothing was written: {result.summary()} Raise --samples or "
                         "--temperature, or sample a model that gets some right.", exit_code=1)
    check_out(out, overwrite)  # again: the file may have appeared while the model sampled
    write_pairs(out, result.pairs)
    console.print(f"{result.summary()} Pairs in {out}.", markup=False, highlight=False)


from .reward_train_cmd import reward_train  # noqa: E402  (the lead's command, beside `pairs`)

reward.command(name="train")(reward_train)
