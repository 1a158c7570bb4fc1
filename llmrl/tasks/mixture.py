"""Several tasks in one run, with weights: `task: mix` and `mix.tasks`, or `task: A,B,…` (equal weights).

    task: mix
    mix:
      tasks:
        - {name: rg:leg_counting, weight: 2}
        - {name: rg:basic_arithmetic, config: {max_terms: 3}}
        - chat_sum                                   # a bare name: weight 1

Train rows: one list in which task k (weight w_k) holds n_k = max(1, round(rg.train_size · w_k / Σw))
rows (a reasoning-gym task generates n_k questions; a built-in task's rows are repeated or cut to
n_k) from its train rows less any whose prompt is held out by any task of the mixture (`unseen`: one
task under two settings, or two tasks that share questions, could otherwise train on another entry's
held-out question), shuffled by the run's prompt order like any task's rows: a step's prompts come from task k
with probability about w_k / Σw. Held-out rows: the tasks' held-out rows interleaved one by one
(k = 1, 2, …, 1, 2, …), so the first eval.size held out cover every task about equally, whatever the
weights. Every row carries a `task` column (the entry's name, `#2`, `#3` … added to a repeated
name); the reward and each metric score a row with its own task's functions, and evaluations report
`accuracy/<task>` and `<metric>/<task>` besides the totals (`Task.by`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Collection, Mapping, Sequence

from ..errors import ConfigError
from . import rg

ENTRY_KEYS = ("name", "weight", "config")
Rows = list[dict[str, Any]]
Fn = Callable[..., Sequence[float]]


def split_names(task: str, builtin: Collection[str] = ()) -> list[str]:
    """'a,rg:b?x=[1,2],c' → ['a', 'rg:b?x=[1,2]', 'c']: commas inside brackets or braces belong to a
    value, and so does a comma inside a task's settings (after its '?') unless what follows it starts
    a task (rg:… or one of `builtin`): 'rg:b?ops=+,-,c' → ['rg:b?ops=+,-', 'c']."""
    parts, depth, cur = [], 0, ""
    for i, ch in enumerate(task):
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0 and ("?" not in cur or _starts_task(task[i + 1 :], builtin)):
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    if any(not p for p in parts):
        raise ConfigError(f"Task '{task}' has an empty name between its commas.")
    return parts


def _starts_task(rest: str, builtin: Collection[str]) -> bool:
    """Whether `rest` (the text after a comma) begins with a task's name."""
    head = rest.strip()
    return head.startswith((rg.PREFIX, "ta:")) or head.split("?", 1)[0].split(",", 1)[0].strip() in builtin


def entries(task: str, mix_tasks: list[dict[str, Any]] | None,
            builtin: Collection[str] = ()) -> list[tuple[str, float, dict[str, Any]]]:
    """[(name, weight, settings)] of a mixture (`task: mix` with mix.tasks, or 'A,B'; `builtin`: the
    built-in tasks' names), checked."""
    if task != "mix":
        if mix_tasks:
            raise ConfigError(f"'mix.tasks' is set but task is '{task}'; set task: mix to train on the mixture.")
        return [(name, 1.0, {}) for name in split_names(task, builtin)]
    if not mix_tasks:
        raise ConfigError("task 'mix' trains on the tasks of mix.tasks, which is empty; list them, "
                          "e.g. mix.tasks: [{name: rg:leg_counting, weight: 2}, {name: chat_sum}].")
    out = []
    for spec in mix_tasks:
        bad = [k for k in spec if k not in ENTRY_KEYS]
        if bad:
            raise ConfigError(f"mix.tasks entry {spec!r} has unknown key '{bad[0]}'; its keys: {', '.join(ENTRY_KEYS)}.")
        name, weight, settings = spec.get("name"), spec.get("weight", 1.0), spec.get("config") or {}
        if not isinstance(name, str) or not name.strip() or name == "mix" or len(split_names(name, builtin)) != 1:
            raise ConfigError(f"mix.tasks entry {spec!r} needs a 'name': one task (arithmetic, chat_sum or rg:NAME).")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"mix.tasks entry '{name}': 'weight' must be a number > 0, got {weight!r}.")
        if not isinstance(settings, Mapping):
            raise ConfigError(f"mix.tasks entry '{name}': 'config' must be a mapping of the generator's settings.")
        out.append((name, float(weight), dict(settings)))
    return out


def labels(names: Sequence[str]) -> list[str]:
    """Each name, with '#2', '#3', … added to its repeats."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def train_counts(weights: Sequence[float], train_size: int) -> list[int]:
    """n_k = max(1, round(train_size · w_k / Σw))."""
    total = sum(weights)
    return [max(1, round(train_size * w / total)) for w in weights]


def interleave(lists: Sequence[Rows]) -> Rows:
    """[a0, b0, c0, a1, b1, …]: one row of each list in turn until all are used."""
    out = []
    for i in range(max((len(x) for x in lists), default=0)):
        out += [x[i] for x in lists if i < len(x)]
    return out


def unseen(trains: Sequence[Rows], held_outs: Sequence[Rows], names: Sequence[str]) -> list[Rows]:
    """Each task's train rows without those whose prompt (a string, or chat messages compared as JSON) is a
    held-out prompt of any task; a task left with none is refused."""
    def key(row: dict[str, Any]) -> str:
        return row["prompt"] if isinstance(row["prompt"], str) else json.dumps(row["prompt"], sort_keys=True)

    held = {key(r) for rows in held_outs for r in rows}
    out = [[r for r in rows if key(r) not in held] for rows in trains]
    for name, rows, kept in zip(names, trains, out, strict=True):
        if rows and not kept:
            raise ConfigError(f"Every train question of '{name}' is held out by another task of the mixture; "
                              "give its entries settings that make other questions.")
    return out


def cycle(rows: Rows, n: int) -> Rows:
    """The first n rows of rows, rows, rows, …"""
    return [rows[i % len(rows)] for i in range(n)]


def with_keys(rows: Rows, keys: Sequence[str]) -> Rows:
    """Every row with every key (None where it had none), so that the rows make one table of columns."""
    return [{k: r.get(k) for k in keys} for r in rows]


def dispatch(fns: Mapping[str, Fn], columns_of: Mapping[str, set[str]], name: str) -> Fn:
    """fn(prompts, completions, task, **columns): each row scored by `fns[its task]` on that task's rows,
    with the columns that task's own rows have."""

    def call(prompts: Sequence[Any], completions: Sequence[str], task: Sequence[str], **columns: Any) -> list[float]:
        out = [0.0] * len(completions)
        for label, fn in fns.items():
            idx = [i for i, t in enumerate(task) if t == label]
            if not idx:
                continue
            cols = {k: [v[i] for i in idx] for k, v in columns.items() if k in columns_of[label]}
            if "task" in columns_of[label]:
                cols["task"] = [label] * len(idx)
            got = fn([prompts[i] for i in idx], [completions[i] for i in idx], **cols)
            for i, value in zip(idx, got, strict=True):
                out[i] = float(value)
        return out

    call.__qualname__ = name
    return call


def reached(fn: Fn, success: float) -> Fn:
    """1.0 where fn's reward ≥ success: a task's accuracy as a metric, for a task without the metric."""
    return lambda prompts, completions, **columns: [1.0 if r >= success else 0.0 for r in fn(prompts, completions, **columns)]
