"""`llmrl eval`: accuracy of a model or a trained run on held-out prompts (or a file's rows), greedy and pass@k."""

from __future__ import annotations

import json
import math
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..envs.tools import FORMATS
from ..errors import ConfigError
from ..model_eval import eval_model
from .errors import friendly


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def render(report: dict[str, Any]) -> Table:
    """The report as a rich table: one row per metric."""
    held_out = report["prompts_from"] == "the held-out split"
    where = f"{report['prompts']} held-out prompts" if held_out else report["prompts_from"]
    in_env = f" in environment {report['env']}" if report.get("env") else ""
    in_env += f", {report['tool_format']} calls" if report.get("tool_format") else ""
    table = Table(title=f"{report['evaluated']} on {report['task']}{in_env} ({where})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("accuracy (greedy)", _pct(report["greedy"]["accuracy"]))
    table.add_row("mean reward (greedy)", f"{report['greedy']['reward_mean']:.4f}")
    greedy = report["greedy"]
    if "strict_accuracy" in greedy:
        how = "<answer> tags" if "lenient_accuracy" in greedy else "first number stated"
        table.add_row(f"strict accuracy (greedy, {how})", _pct(greedy["strict_accuracy"]))
    if "lenient_accuracy" in greedy:
        table.add_row("lenient accuracy (greedy, last line or number)", _pct(greedy["lenient_accuracy"]))
    for key in (k for k in greedy if "/" in k):  # a mixture's numbers per task
        metric, task = key.split("/", 1)
        table.add_row(f"{metric.replace('_', ' ')} of {task} (greedy)", _pct(greedy[key]))
    if "turns_mean" in greedy:  # episodes
        table.add_row("turns per episode (greedy)", f"{greedy['turns_mean']:.2f}")
        table.add_row("tool calls per episode (greedy)", f"{greedy['tool_calls_per_episode']:.2f}")
    if "eos_rate" in greedy:
        table.add_row("EOS rate (greedy)", _pct(greedy["eos_rate"]))
        table.add_row("response length (greedy, tokens)", f"{greedy['response_len']:.1f}")
    sampled = report.get("sampled")
    if sampled:
        how = f"{sampled['samples']} samples, T={sampled['temperature']:g}"
        table.add_row(f"mean reward (sampled, {how})", f"{sampled['reward_mean']:.4f}")
        for key in sorted((k for k in sampled if k.startswith("pass@")), key=lambda k: int(k[5:])):
            table.add_row(key, _pct(sampled[key]))
    return table


@friendly
def eval(  # noqa: A001 - the command is called `eval`
    model: str = typer.Option(..., "--model", "-m", help="A run folder (its trained actor), a model folder, a hub id, a .gguf file, 'tiny', 'tiny-tools' or 'tiny-guess'."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Task: arithmetic, chat_sum, calc, chat_calc, chat_calc_tools, chat_calc_json, guess, guess_signs, rg:NAME (reasoning-gym; `llmrl tasks`), ta:ENV_ID (a TextArena game) or A,B (a mixture). Default: the run's task (or arithmetic)."),
    dataset: Optional[str] = typer.Option(None, "--dataset", "-d", help="Score every row of this .jsonl/.csv/.parquet file (or `datasets` hub name) instead of a task."),
    reward: Optional[str] = typer.Option(None, "--reward", help="Reward for --dataset rows: exact_match, numeric, first_number, math, format, length_penalty, module:function or file.py:function. Default: the run's rewards."),
    samples: int = typer.Option(4, "--samples", "-k", help="K sampled completions per prompt for pass@1 and pass@K (0: greedy only)."),
    size: Optional[int] = typer.Option(None, "--size", "-n", help="Prompts to score (held-out ones, or the first rows of --dataset). Default: the run's eval.size."),
    seed: int = typer.Option(0, "--seed", "-s", help="Seed of the sampled completions."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="Sampling temperature. Default: the run's rollout.temperature."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Longest completion. Default: the run's rollout.max_new_tokens."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu, cuda or auto. Default: the run's model.device."),
    env: Optional[str] = typer.Option(None, "--env", help="Score in episodes in this environment: calculator, guess, ta:ENV_ID (TextArena), module:Class or file.py:Class. Default: the run's rollout.env or the task's own (calc, guess, ta:ENV_ID)."),
    tool_format: Optional[str] = typer.Option(None, "--tool-format", help="With a tool environment, how the model's calls are read: hermes, json or plain (rollout.tool_format). Default: the run's where it set one, else the task's own (chat_calc: plain, chat_calc_json: json), else hermes with a chat template, plain without."),
    system_prompt: Optional[str] = typer.Option(None, "--system-prompt", help="System message put first in each prompt (data.system_prompt; needs a chat template). Default: the run's (a plain model: its template's own)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
) -> None:
    """Score a model on held-out prompts (or the first rows of --dataset, which may be rows it trained
    on): greedy accuracy and mean reward, and pass@1 / pass@K
    over K sampled completions per prompt (the unbiased estimator of Chen et al. 2021)."""
    if samples < 0 or (size is not None and size < 1) or (temperature is not None and not 0 < temperature < math.inf) \
            or (max_new_tokens is not None and max_new_tokens < 1):
        raise ConfigError("--samples must be ≥ 0, --size and --max-new-tokens ≥ 1 and --temperature a finite number > 0.")
    if device is not None and device not in ("cpu", "cuda", "auto"):
        raise ConfigError(f"--device must be one of cpu, cuda, auto; got '{device}'.")
    if dataset is not None and task is not None:
        raise ConfigError("Give --task or --dataset, not both.")
    if tool_format is not None and tool_format not in FORMATS:
        raise ConfigError(f"--tool-format must be one of {', '.join(FORMATS)}; got '{tool_format}'.")
    report = eval_model(model, task=task, dataset=dataset, reward=reward, samples=samples, size=size, seed=seed, temperature=temperature,
                        max_new_tokens=max_new_tokens, device=device, show_progress=not as_json, env=env,
                        tool_format=tool_format, system_prompt=system_prompt)
    if as_json:
        typer.echo(json.dumps(report))
        return
    Console().print(render(report))
