"""Tasks: prompts with their extra columns, and a reward over completions.

A reward function is a plain callable `reward(prompts, completions, **columns) -> list[float]`
returning one float per completion; `columns` are the dataset's other columns, row-aligned.
A prompt is a string or a list of chat messages `{role, content}` (`models/prompts.py` renders it).

`task_from_config` is what a run uses: the rows of `data.dataset` (or of `task`: a built-in task, a
reasoning-gym one `rg:NAME` (rg.py), or several at once, mixture.py) and the reward of
`reward.functions` (or the task's own reward).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import ConfigError
from ..models.load import register_builtin_model
from ..models.prompts import as_messages
from ..models.tiny import default_cache_dir, ensure_tiny
from ..rewards.builtin import first_number, numeric
from ..envs.guess import guessed
from . import arithmetic, calc, chat_sum, guess, mixture, rg, textarena

if TYPE_CHECKING:
    from ..config import Config
    from ..config.schema import RolloutConfig

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
    by: str | None = None
    """A row column (a mixture's `task`) by whose values evaluations also report each metric:
    `accuracy/<value>`, `<metric>/<value>` (`run/evaluate.per_group`)."""
    env: str | None = None
    """The environment its episodes run in (`rollout.env` overrides it; llmrl/envs/); None: one turn."""
    tool_format: str | None = None
    """The tool-call format its prompts show (their worked example's), used where rollout.tool_format is auto."""


def _arithmetic() -> Task:
    train, held_out = arithmetic.splits()
    rows = lambda xs: [{"prompt": x.prompt, "answer": x.answer} for x in xs]  # noqa: E731
    return Task("arithmetic", rows(train), rows(held_out), arithmetic.exact_match)


def _chat_sum() -> Task:
    train, held_out = chat_sum.splits()
    return Task("chat_sum", train, held_out, numeric, metrics={"strict_accuracy": first_number})


def _calc() -> Task:
    train, held_out = calc.splits()
    return Task("calc", train, held_out, arithmetic.exact_match, env=calc.ENV)


def _chat_calc() -> Task:
    """The chat tool task: "What is a*b + c*d?" after a worked calculator call, in episodes (calc.py)."""
    train, held_out = calc.chat_splits()
    return Task("chat_calc", train, held_out, arithmetic.exact_match, env=calc.ENV, tool_format=calc.CHAT_FORMAT)


def _chat_calc_tools() -> Task:
    """chat_calc's questions with no worked example: the calculator is offered only through the chat
    template's `tools=`, calls parsed in rollout.tool_format (calc.py)."""
    train, held_out = calc.chat_splits(demo=None)
    return Task("chat_calc_tools", train, held_out, arithmetic.exact_match, env=calc.ENV)


def _chat_calc_json() -> Task:
    """chat_calc's questions after a worked example whose call is a bare JSON object (calc.JSON_DEMO), the
    calculator also offered through the template's `tools=`; calls read in the json format (calc.py)."""
    train, held_out = calc.chat_splits(demo=calc.JSON_DEMO)
    return Task("chat_calc_json", train, held_out, arithmetic.exact_match, env=calc.ENV, tool_format=calc.JSON_FORMAT)


def _guess() -> Task:
    train, held_out = guess.splits()
    return Task("guess", train, held_out, guessed, env=guess.ENV)


def _guess_signs() -> Task:
    """The guessing game in the tiny models' characters: '(20 29)', answered '+' or '-' (guess.py)."""
    train, held_out = guess.sign_splits()
    return Task("guess_signs", train, held_out, guessed, env=guess.ENV)


TASKS: dict[str, Callable[[], Task]] = {"arithmetic": _arithmetic, "chat_sum": _chat_sum, "calc": _calc,
                                        "chat_calc": _chat_calc, "chat_calc_tools": _chat_calc_tools,
                                        "chat_calc_json": _chat_calc_json, "guess": _guess,
                                        "guess_signs": _guess_signs}


def with_task_format(rollout: RolloutConfig, task: Task) -> RolloutConfig:
    """`rollout` with tool_format set to the task's own where it is 'auto' and the task names one (its
    prompts' worked example shows a call in that format)."""
    if rollout.tool_format != "auto" or task.tool_format is None:
        return rollout
    return replace(rollout, tool_format=task.tool_format)


TINY_TOOLS = "tiny-tools"
TOOLS_VERSION = "1"
TOOLS_STEPS = 1000  # twice `tiny`'s: copying a call and the tool's answer back needs them (docs/environments.md)
"""`tiny-tools`: the built-in tiny model's architecture warm-started on `calc.tool_transcripts` (a share of
calculator calls) instead of sums, for TOOLS_STEPS steps; its cache folder is tiny-tools-<TOOLS_VERSION>: bump it when they change."""


TINY_GUESS = "tiny-guess"
GUESS_VERSION = "2"  # 2: warm-started on the train split of held-out ranges (issue 45)
GUESS_STEPS = 1000
"""`tiny-guess`: the tiny architecture warm-started on `guess.sign_transcripts` (games of `guess_signs`, most
scanning upward, some halving the range the '+'/'-' answers allow), for GUESS_STEPS steps; cached in
tiny-guess-<GUESS_VERSION>."""


def tiny_corpus() -> list[tuple[str, str]]:
    """What the built-in `tiny` model is warm-started on: the arithmetic train split's (prompt, answer)."""
    return [(x.prompt, x.answer) for x in arithmetic.splits()[0]]


register_builtin_model("tiny", lambda show_progress: ensure_tiny(tiny_corpus, show_progress=show_progress))
register_builtin_model(TINY_GUESS, lambda show_progress: ensure_tiny(
    guess.sign_transcripts, default_cache_dir(TINY_GUESS, GUESS_VERSION), show_progress=show_progress, steps=GUESS_STEPS))
register_builtin_model(TINY_TOOLS, lambda show_progress: ensure_tiny(
    calc.tool_transcripts, default_cache_dir(TINY_TOOLS, TOOLS_VERSION), show_progress=show_progress, steps=TOOLS_STEPS))


def get_task(name: str, settings: dict[str, Any] | None = None, *, train_size: int = 1000, eval_size: int = 500,
             split_seed: int = 1234, reward: str = "strict", answer: str = "tag", label: str | None = None) -> Task:
    """One task: a built-in (`TASKS`), a reasoning-gym one, 'rg:NAME?k=v…' with `settings` under the
    query's own (rg.py: train_size questions, eval_size held out, seeds from split_seed), or a TextArena
    game 'ta:ENV_ID' (textarena.py: train_size games, eval_size held out)."""
    if rg.is_rg(name):
        source = rg.load(name, settings, train_size=train_size, eval_size=eval_size, split_seed=split_seed,
                         answer=answer)
        train, held_out = rg.rows(source, label or name)
        fn, metrics = rg.reward_fns(source, reward)
        return Task(label or name, train, held_out, fn, metrics=metrics)
    if textarena.is_textarena(name):
        if settings:
            raise ConfigError(f"Task '{name}' is a TextArena game and takes no config; its registered id names it.")
        train, held_out = textarena.splits(name, train_size=train_size, eval_size=eval_size, split_seed=split_seed)
        return Task(label or name, train, held_out, textarena.no_task_reward, env=name)
    if name not in TASKS:
        raise ConfigError(f"Unknown task '{name}'; valid tasks: {', '.join(TASKS)}, rg:NAME "
                          "(a reasoning-gym dataset; `llmrl tasks` lists them) or ta:ENV_ID (a TextArena game).")
    if settings:
        raise ConfigError(f"Task '{name}' is built in and takes no config; only rg:NAME tasks do.")
    task = TASKS[name]()
    return replace(task, name=label) if label else task


def task_slug(task: str) -> str:
    """A task setting as a folder-name part: 'rg:leg_counting?max_animals=3' → 'rg-leg_counting-max_animals-3'."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", task).strip("-") or "task"


def build_task(config: "Config") -> Task:
    """The task of `config.task` (with `rg.*` and `mix.tasks`): one task, or a mixture (mixture.py)."""
    eval_size = config.rg.eval_size or max(config.eval.size, 1)  # a larger pool only starves a small task's train set
    kw = dict(eval_size=eval_size, split_seed=config.data.split_seed, reward=config.rg.reward,
              answer=config.rg.answer)
    parts = mixture.entries(config.task, config.mix.tasks, TASKS)
    if config.task != "mix" and len(parts) == 1:
        return get_task(config.task, config.rg.config, train_size=config.rg.train_size, **kw)
    if config.rg.config:
        raise ConfigError("'rg.config' holds the settings of a single task rg:NAME; in a mixture give each task "
                          "its own (mix.tasks: [{name: rg:NAME, config: {...}}]).")
    names = mixture.labels([name for name, _, _ in parts])
    counts = mixture.train_counts([w for _, w, _ in parts], config.rg.train_size)
    tasks = [get_task(name, settings, train_size=n, label=label, **kw)
             for (name, _, settings), label, n in zip(parts, names, counts, strict=True)]
    if played := [t.name for t in tasks if t.env]:  # a mixture's rows run one turn: the game would be lost
        raise ConfigError(f"'{played[0]}' is played in episodes in its own environment, which a mixture does not "
                          "run (its rows are one turn each); train it on its own.")
    return mix_tasks(tasks, counts)


def mix_tasks(tasks: list[Task], counts: list[int]) -> Task:
    """One task of `tasks` (their names distinct): task k gives counts[k] train rows (mixture.py), none of
    them a question any task holds out (`mixture.unseen`)."""
    pools = mixture.unseen([t.train for t in tasks], [t.eval for t in tasks], [t.name for t in tasks])
    train = [{**r, "task": t.name} for t, pool, n in zip(tasks, pools, counts, strict=True) for r in mixture.cycle(pool, n)]
    held_out = mixture.interleave([[{**r, "task": t.name} for r in t.eval] for t in tasks])
    keys = list(dict.fromkeys(k for t in tasks for r in t.train[:1] + t.eval[:1] for k in (*r, "task")))
    own = {t.name: {k for r in t.train[:1] + t.eval[:1] for k in r if k != "prompt"} for t in tasks}
    name = ",".join(t.name for t in tasks)
    metric_names = list(dict.fromkeys(m for t in tasks for m in t.metrics))
    metrics = {m: mixture.dispatch({t.name: t.metrics.get(m) or mixture.reached(t.reward, t.success) for t in tasks},
                                   own, f"{name} ({m})") for m in metric_names}
    reward = mixture.dispatch({t.name: t.reward for t in tasks}, own, name)
    if len({t.success for t in tasks}) > 1:
        raise ConfigError("The tasks of a mixture must share one success threshold.")
    return Task(name, mixture.with_keys(train, keys), mixture.with_keys(held_out, keys), reward,
                success=tasks[0].success, metrics=metrics, by="task")


def task_from_config(config: "Config") -> Task:
    """The run's task: dataset rows or a built-in task, with the configured rewards when given and
    data.system_prompt put first in each prompt that has no system message (`with_system_prompt`)."""
    task = _task_from_config(config)
    return with_system_prompt(task, config.data.system_prompt)


def with_system_prompt(task: Task, system: str | None) -> Task:
    """`task` with {"role": "system", "content": system} first in every train and held-out prompt that does
    not open with a system message (a string prompt becomes [system, user]); None: `task` as it is."""
    if system is None:
        return task

    def one(row: dict[str, Any]) -> dict[str, Any]:
        messages = as_messages(row["prompt"])
        if messages and messages[0].get("role") == "system":
            return row
        return {**row, "prompt": [{"role": "system", "content": system}, *messages]}

    return replace(task, train=[one(r) for r in task.train], eval=[one(r) for r in task.eval])


def _task_from_config(config: "Config") -> Task:
    if config.data.dataset:
        from ..rewards.builtin import answer_readers
        from .dataset import dataset_splits

        train, held_out = dataset_splits(config.data, answer_readers(config.reward.functions))
        task = Task(Path(config.data.dataset).stem or config.data.dataset, train, held_out, _no_reward)
        source = config.data.dataset
    else:
        task = build_task(config)
        source = f"task {config.task}"
    if not config.reward.functions:
        if task.reward is _no_reward:
            raise ConfigError("A dataset needs a reward: pass --reward NAME or set reward.functions "
                              "(built-ins: exact_match, numeric, first_number, math, format, length_penalty).")
        return task
    from ..models.load import resolve_device, torch_dtype
    from ..rewards import build_reward, check_columns

    columns = lambda rows: {k for row in rows[:1] for k in row if k != "prompt"}  # noqa: E731
    if config.data.eval_dataset and task.eval:  # each file must hold what the rewards read
        check_columns(config.reward.functions, columns(task.eval), config.data.eval_dataset)
    dtype = torch_dtype(config.model.dtype, config.model.device, config.model.name)
    reward = build_reward(config.reward.functions, columns=columns(task.train or task.eval), source=source,
                          device=resolve_device(config.model.device), dtype=dtype,
                          batch_size=config.reward.batch_size, trust_remote_code=config.model.trust_remote_code)
    if config.data.dataset:
        return replace(task, reward=reward, success=config.reward.success)
    # a built-in task's own verifier stays an evaluation metric: the gold beside a learned (proxy) reward
    from .mixture import reached

    gold = {"gold_accuracy": reached(task.reward, task.success)}
    return replace(task, reward=reward, success=config.reward.success, metrics={**task.metrics, **gold})


def _no_reward(prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
    raise AssertionError("a dataset task has no reward of its own")
