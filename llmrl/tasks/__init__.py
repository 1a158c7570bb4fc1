"""Tasks: prompts with their extra columns, and a reward over completions.

A reward function is a plain callable `reward(prompts, completions, **columns) -> list[float]`
returning one float per completion; `columns` are the dataset's other columns, row-aligned.
A prompt is a string or a list of chat messages `{role, content}` (`models/prompts.py` renders it).

`task_from_config` is what a run uses: the rows of `data.dataset` (or of the built-in `task`) and
the reward of `reward.functions` (or the built-in task's own reward).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import ConfigError
from ..models.load import register_builtin_model
from ..models.tiny import ensure_tiny
from ..rewards.builtin import first_number, numeric
from . import arithmetic, chat_sum

if TYPE_CHECKING:
    from ..config import Config

RewardFn = Callable[..., Sequence[float]]


@dataclass(frozen=True)
class Task:
    """train/eval rows are dicts with a 'prompt' and any other columns the reward uses.
    `success` is the reward at or above which a completion counts as correct (for accuracy).
    `metrics`: {name: fn} reward-like functions giving 1.0 or 0.0 per completion, whose mean every
    evaluation reports besides the accuracy (chat_sum: `strict_accuracy`, only the first number
    stated counts); they never enter training."""

    name: str
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    reward: RewardFn
    success: float = 1.0
    metrics: dict[str, RewardFn] = field(default_factory=dict)


def _arithmetic() -> Task:
    train, held_out = arithmetic.splits()
    rows = lambda xs: [{"prompt": x.prompt, "answer": x.answer} for x in xs]  # noqa: E731
    return Task("arithmetic", rows(train), rows(held_out), arithmetic.exact_match)


def _chat_sum() -> Task:
    train, held_out = chat_sum.splits()
    return Task("chat_sum", train, held_out, numeric, metrics={"strict_accuracy": first_number})


TASKS: dict[str, Callable[[], Task]] = {"arithmetic": _arithmetic, "chat_sum": _chat_sum}


def tiny_corpus() -> list[tuple[str, str]]:
    """What the built-in `tiny` model is warm-started on: the arithmetic train split's (prompt, answer)."""
    return [(x.prompt, x.answer) for x in arithmetic.splits()[0]]


register_builtin_model("tiny", lambda show_progress: ensure_tiny(tiny_corpus, show_progress=show_progress))


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"Unknown task '{name}'; valid tasks: {', '.join(TASKS)}.")
    return TASKS[name]()


def task_from_config(config: "Config") -> Task:
    """The run's task: dataset rows or a built-in task, with the configured rewards when given."""
    if config.data.dataset:
        from .dataset import dataset_splits

        train, held_out = dataset_splits(config.data)
        task = Task(Path(config.data.dataset).stem or config.data.dataset, train, held_out, _no_reward)
        source = config.data.dataset
    else:
        task = get_task(config.task)
        source = f"task {config.task}"
    if not config.reward.functions:
        if task.reward is _no_reward:
            raise ConfigError("A dataset needs a reward: pass --reward NAME or set reward.functions "
                              "(built-ins: exact_match, numeric, first_number, math, format, length_penalty).")
        return task
    from ..models.load import DTYPES, resolve_device
    from ..rewards import build_reward, check_columns

    columns = lambda rows: {k for row in rows[:1] for k in row if k != "prompt"}  # noqa: E731
    if config.data.eval_dataset and task.eval:  # each file must hold what the rewards read
        check_columns(config.reward.functions, columns(task.eval), config.data.eval_dataset)
    reward = build_reward(config.reward.functions, columns=columns(task.train or task.eval), source=source,
                          device=resolve_device(config.model.device), dtype=DTYPES[config.model.dtype],
                          batch_size=config.reward.batch_size, trust_remote_code=config.model.trust_remote_code)
    return replace(task, reward=reward, success=config.reward.success)


def _no_reward(prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
    raise AssertionError("a dataset task has no reward of its own")
