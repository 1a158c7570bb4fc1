"""Rich terminal output of `llmrl train`: memory table, live progress, summary table."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
import torch

from ..config import Config
from ..config.model_defaults import device_kind
from ..config.precision import dtype_note
from ..memory.budget import run_budget
from ..models.load import resolve_device, torch_dtype
from ..run.evaluate import EvalResult
from ..run.memory import RoleCost
from .console import RunConsole


def budget_line(config: Config) -> str:
    """The run's memory budget and where it comes from, in one line (memory/budget.py)."""
    budget = run_budget(config, resolve_device(config.model.device), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    told = "" if config.memory.max is not None else " (--max-memory sets another)"
    return f"Memory budget: {escape(budget.describe())}{told}."


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _clip(text: Any, width: int = 60) -> str:
    """One line of at most `width` characters (chat message lists shown as their text)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


_SCAFFOLD = re.compile(r"<\|[^|<>]{1,40}\|>(?:\s*(?:system|user|assistant|tool)\b)?|</?s>|<pad>")


def turn_text(text: str) -> str:
    """A turn of `completions.jsonl` (decoded with its special tokens) as plain words: the chat
    template's markers ('<|im_end|>', '<|im_start|>user') dropped, whitespace folded."""
    return " ".join(_SCAFFOLD.sub(" ", text).split())


def episode_line(turns: list[dict[str, Any]], width: int = 110) -> str:
    """An episode on one line (rich markup): the model's turns in bold, the environment's dim in ‹ ›,
    clipped to `width` characters of text."""
    parts, used = [], 0
    for t in turns:
        text = turn_text(t["text"]) or "∅"
        room = width - used
        if room <= 1:
            parts.append("…")
            break
        clipped = _clip(text, room)
        used += len(clipped) + 3
        parts.append(f"[bold]{escape(clipped)}[/]" if t["by"] == "model" else f"[dim]‹{escape(clipped)}›[/]")
        if clipped != text:
            break
    return " ".join(parts)


def _phases(row: dict[str, Any]) -> str:
    """Where the step went: 'gen 1.2s fwd 0.3s upd 0.8s' (phases over 5 % of the step)."""
    short = {"generate": "gen", "score": "score", "forward": "fwd", "estimate": "adv", "update": "upd", "sync": "sync"}
    total = row.get("step_time_s") or 0.0
    parts = [f"{name} {row[f'time_{p}_s']:.1f}s" for p, name in short.items()
             if row.get(f"time_{p}_s", 0.0) > 0.05 * total]
    return " ".join(parts)


def prompt_text(prompt: Any) -> Any:
    """What a preview shows of a prompt: a chat prompt's last user message (its last message when no
    message is the user's), a string prompt as it is."""
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        users = [m for m in prompt if m.get("role") == "user"] or prompt
        return users[-1].get("content", "")
    return prompt


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


class RichReporter:
    """Prints to stderr-free stdout via rich; a live bar shows reward, KL and held-out accuracy."""

    interactive = True

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or RunConsole()
        self.progress: Progress | None = None
        self.task_id: Any = None
        self.accuracy: float | None = None
        self.before: EvalResult | None = None
        self.after: EvalResult | None = None
        self.warned_zero = False

    def start(self, config: Config, costs: list[RoleCost], run_dir: Path) -> None:
        four_bit = config.model.quantize != "none"
        held = f", linear layers in {config.model.quantize}" if four_bit else ""
        table = Table(title=f"Memory by role ({config.model.name}, {config.model.dtype}{held}: "
                            f"{dtype_note(config.model.dtype, device_kind(config.model.device), model=config.model.name, threads=config.threads)})")
        table.add_column("role")
        table.add_column("parameters", justify="right")
        table.add_column("memory", justify="right")
        for c in costs:
            table.add_row(c.role, f"{c.params:,}" if c.params else "—", _mib(c.bytes) if c.bytes else "shares base")
        total = sum(c.bytes for c in costs)
        base = costs[0].bytes
        table.add_row("[bold]total[/]", "", f"[bold]{_mib(total)}[/]")
        self.console.print(table)
        if four_bit:  # what the 4-bit codes save against the same base in model.dtype
            full = costs[0].params * torch.finfo(torch_dtype(config.model.dtype, config.model.device)).bits // 8
            self.console.print(f"The {config.model.quantize} base holds {_mib(base)} where {config.model.dtype} "
                               f"would hold {_mib(full)} ({full / max(base, 1):.1f}×).")
        if any(c.role.startswith("critic") for c in costs):  # the saving of one base for three roles
            self.console.print(f"Separate actor, critic and reference models would hold the base weights 3× "
                               f"({_mib(3 * base)}).")
        self.console.print(budget_line(config))
        self.console.print(f"Run folder: [bold]{run_dir}[/]")
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console,
        )
        self.task_id = self.progress.add_task(f"{config.algo}", total=config.steps, stats="evaluating…")
        self.progress.start()

    def evaluated(self, step: int, result: EvalResult | None) -> None:
        if result is None:
            return
        if step == 0:
            self.before = result
        self.after = result
        self.accuracy = result.accuracy

    def resumed(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task_id, completed=step)
        self.console.print(f"Resuming after step {step}.")

    def stopped(self) -> None:
        if self.progress is not None:
            self.progress.stop()

    def step(self, row: dict[str, Any]) -> None:
        if row.get("zero_advantage") and not self.warned_zero:
            self.warned_zero = True
            self.console.print(f"[yellow]step {row['step']}: every advantage was zero, so this update "
                               "had no learning signal (all rewards equal?). Logged as zero_advantage.[/]")
        if row.get("skipped_updates"):
            self.console.print(f"[yellow]step {row['step']}: non-finite loss or gradient; update skipped.[/]")
        kl = "—" if row.get("kl") is None else f"{row['kl']:.3f}"
        stats = f"reward {row['reward_mean']:.3f}  KL {kl}  acc {_pct(self.accuracy)}  {_phases(row)}"
        if self.progress is not None:
            self.progress.update(self.task_id, advance=1, stats=stats)

    shown_completions = 3

    def completions(self, rows: list[dict[str, Any]]) -> None:
        """A few of the step's sampled completions, one line each: prompt (a chat prompt's last user
        message) → completion (reward)."""
        for r in rows[: self.shown_completions]:
            if r.get("turns"):  # an episode: every turn, the environment's answers between the model's
                model_turns = sum(t["by"] == "model" for t in r["turns"])
                self.console.print(f"[dim]step {r['step']}[/]  {escape(_clip(prompt_text(r['prompt']), 40))} → "
                                   f"{episode_line(r['turns'])}  [dim](reward {r['reward']:.3g}, {model_turns} "
                                   f"turn{'s' if model_turns != 1 else ''})[/]", highlight=False)
                continue
            prompt, completion = _clip(prompt_text(r["prompt"])), _clip(r["completion"])
            self.console.print(f"[dim]step {r['step']}[/]  {escape(prompt)} → [bold]{escape(completion)}[/]  "
                               f"[dim](reward {r['reward']:.3g})[/]", highlight=False)

    def end(self, summary: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.stop()
        table = Table(title=f"{summary['algo']} on {summary['task']} ({summary['steps']} steps)")
        table.add_column("metric")
        table.add_column("value", justify="right")
        table.add_row("held-out accuracy (greedy)",
                      f"{_pct(summary['eval_accuracy_before'])} → {_pct(summary['eval_accuracy_after'])}")
        lenient = "eval_lenient_accuracy_after" in summary  # a reasoning-gym task: strict is its <answer> tag
        if "eval_strict_accuracy_after" in summary:
            table.add_row(f"held-out strict accuracy ({'<answer> tag' if lenient else 'first number stated'})",
                          f"{_pct(summary['eval_strict_accuracy_before'])} → {_pct(summary['eval_strict_accuracy_after'])}")
        if lenient:
            table.add_row("held-out lenient accuracy (last line or number)",
                          f"{_pct(summary['eval_lenient_accuracy_before'])} → {_pct(summary['eval_lenient_accuracy_after'])}")
        for key in (k[len("eval_"):-len("_after")] for k in summary if "/" in k and k.endswith("_after")):
            metric, task = key.split("/", 1)  # a mixture's numbers per task
            table.add_row(f"  {metric.replace('_', ' ')} of {escape(task)}",
                          f"{_pct(summary.get(f'eval_{key}_before'))} → {_pct(summary[f'eval_{key}_after'])}")
        if summary.get("eval_eos_rate_after") is not None:
            ends = lambda when: (f"{_pct(summary.get(f'eval_eos_rate_{when}'))} · "  # noqa: E731
                                 f"{_num(summary.get(f'eval_response_len_{when}'))}")
            table.add_row("held-out EOS rate · length (tokens)", f"{ends('before')} → {ends('after')}")
        first, last = summary["reward_mean_first"], summary["reward_mean_last"]
        table.add_row("train reward (first step → last 10 %)", f"{first:.3f} → {last:.3f}" if last is not None else "—")
        table.add_row("KL to reference (per sequence)", "—" if summary["kl_last"] is None else f"{summary['kl_last']:.4f}")
        table.add_row("wall time", f"{summary['wall_time_s']:.1f} s ({summary['step_time_s_mean']:.2f} s/step)")
        table.add_row("peak memory (RSS)", f"{summary['peak_rss_mib']:,.0f} MiB")
        if summary.get("peak_device_mib") is not None:
            table.add_row("peak GPU memory", f"{summary['peak_device_mib']:,.0f} MiB")
        self.console.print(table)
        self.console.print(f"Run folder: [bold]{summary['run_dir']}[/]")
        if summary.get("no_update"):  # the last line says so: a run that changed nothing never ends silently
            self.console.print(f"No update was applied: {escape(summary['no_update'])}.", soft_wrap=True)
