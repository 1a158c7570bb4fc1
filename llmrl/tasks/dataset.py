"""User datasets → task rows, through the `datasets` library.

A dataset is a local `.jsonl`/`.json`, `.csv` or `.parquet` file (or a folder of them), or a
Hugging Face hub name. Each row becomes `{"prompt": <prompt>, <every other column>: <value>}`;
the prompt (column `data.prompt_column`) is a non-empty string or a non-empty list of chat
messages `{role: str, content: str}`. The other columns reach the reward function row-aligned.
A column named like a field llmrl itself passes or logs (`TAKEN`: the reward's `prompts` and
`completions` arguments; `prompt`, `completion`, `reward`, `step` of completions.jsonl) is renamed
`dataset_<name>` (TRL's prompt/completion format: the reference completion reaches the reward and
completions.jsonl as `dataset_completion`), so it never replaces the model's completion or reward.

Train/eval split: `data.eval_dataset` when given, else a fixed held-out share: the row indices are
shuffled with `random.Random(data.split_seed)` (independent of the run's seed) and the first
round(n · eval_fraction) (at least 1 when the fraction is > 0) are the eval split.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from ..config.schema import DataConfig
from ..errors import ConfigError
from ..rewards.builtin import check_answer

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
TAKEN = ("prompt", "prompts", "completion", "completions", "reward", "step")  # see the module docstring
Rows = list[dict[str, Any]]


def is_local(name: str) -> bool:
    """A path (existing, or with a data-file suffix, or starting with . / ~) rather than a hub name."""
    p = Path(name).expanduser()
    return p.exists() or p.suffix.lower() in FORMATS or name.startswith((".", "/", "~"))


def load_rows(name: str, cfg: DataConfig, split: str | None = None, answers: dict[str, str] | None = None) -> Rows:
    """Every row of dataset `name`, validated, with the prompt under the key 'prompt'. `answers`
    {column: built-in reward}: the columns a built-in reward reads, each row's value checked
    (`rewards.builtin.check_answer`)."""
    table = _load_local(name) if is_local(name) else _load_hub(name, split or cfg.split)
    if cfg.max_rows is not None:
        table = table.select(range(min(cfg.max_rows, len(table))))
    if len(table) == 0:
        raise ConfigError(f"Dataset '{name}' is empty.")
    if cfg.prompt_column not in table.column_names:
        cols = ", ".join(table.column_names)
        raise ConfigError(f"Dataset '{name}' has no '{cfg.prompt_column}' column (columns: {cols}); "
                          f"set data.prompt_column.")
    keys = column_keys([c for c in table.column_names if c != cfg.prompt_column])
    rows = []
    for i, raw in enumerate(table):
        check_prompt(raw[cfg.prompt_column], name, i + 1)
        row = {"prompt": raw[cfg.prompt_column], **{keys[k]: v for k, v in raw.items() if k in keys}}
        for column, reader in (answers or {}).items():
            if column in row:  # a missing column is named by the reward itself (rewards/__init__.py)
                check_answer(row[column], column, reader, f"Row {i + 1} of dataset '{name}'")
        rows.append(row)
    return rows


def column_keys(columns: list[str]) -> dict[str, str]:
    """Column name → its key in a row: the name itself, or `dataset_<name>` for a name in `TAKEN`
    (prefixed again while it would meet another column's name)."""
    keys = {}
    for c in columns:
        key = c
        while key in TAKEN or (key != c and key in columns):
            key = f"dataset_{key}"
        keys[c] = key
    return keys


def check_prompt(prompt: Any, name: str, row: int) -> None:
    """Raise a ConfigError naming the dataset and the 1-based row unless `prompt` is well formed."""
    where = f"Row {row} of dataset '{name}'"
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError(f"{where} has an empty prompt.")
        return
    if not isinstance(prompt, list) or not prompt:
        kind = {type(None): "missing", list: "an empty list"}.get(type(prompt), f"of type {type(prompt).__name__}")
        raise ConfigError(f"{where}: the prompt is {kind}, not a string or a list of {{role, content}} messages.")
    for j, msg in enumerate(prompt, 1):
        if not (isinstance(msg, dict) and isinstance(msg.get("role"), str) and isinstance(msg.get("content"), str)):
            raise ConfigError(f"{where}: message {j} of the prompt is not a {{role: str, content: str}} mapping "
                              f"(got {msg!r}).")


def split_rows(rows: Rows, fraction: float, seed: int, name: str) -> tuple[Rows, Rows]:
    """(train, eval) by a fixed seeded shuffle; see the module docstring."""
    if fraction <= 0:
        return rows, []
    n_eval = max(1, round(len(rows) * fraction))
    if n_eval >= len(rows):
        raise ConfigError(f"Dataset '{name}' has {len(rows)} rows; holding out data.eval_fraction={fraction} "
                          f"leaves none to train on. Give more rows, a smaller fraction or data.eval_dataset.")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[:n_eval])
    return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in order[:n_eval]]


def dataset_splits(cfg: DataConfig, answers: dict[str, str] | None = None) -> tuple[Rows, Rows]:
    """(train, eval) rows of `cfg.dataset` (and `cfg.eval_dataset` when given); `answers` as in `load_rows`."""
    assert cfg.dataset is not None
    rows = load_rows(cfg.dataset, cfg, answers=answers)
    if cfg.eval_dataset:
        return rows, load_rows(cfg.eval_dataset, cfg, split=cfg.split if not is_local(cfg.eval_dataset) else None,
                               answers=answers)
    return split_rows(rows, cfg.eval_fraction, cfg.split_seed, cfg.dataset)


def _load_local(name: str) -> Any:
    import datasets

    path = Path(name).expanduser()
    if not path.exists():
        raise ConfigError(f"Dataset file '{name}' does not exist.")
    if path.is_dir():
        return _call(lambda: datasets.load_dataset(str(path), split="train"), name)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(f"Dataset file '{name}' has an unsupported format; use .jsonl, .json, .csv or .parquet.")
    if path.stat().st_size == 0 or (kind != "parquet" and not path.read_text(errors="replace").strip()):
        raise ConfigError(f"Dataset '{name}' is empty.")
    if kind == "json":
        _check_json_lines(path, name)
    return _call(lambda: datasets.load_dataset(kind, data_files=str(path), split="train"), name)


def _check_json_lines(path: Path, name: str) -> None:
    """Name the first line that is not a JSON object (a .json file holding one array is also fine)."""
    text = path.read_text(errors="replace")
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"Line {n} of dataset '{name}' is not valid JSON ({exc.msg}).") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"Line {n} of dataset '{name}' is not a JSON object (got {type(obj).__name__}).")


def _load_hub(name: str, split: str) -> Any:
    import datasets

    return _call(lambda: datasets.load_dataset(name, split=split), name, hub=True)


def _call(load: Any, name: str, hub: bool = False) -> Any:
    import datasets

    datasets.disable_progress_bars()
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own error log (with a traceback) of a broken file
    try:
        return load()
    except (Exception, StopIteration) as exc:  # the datasets library raises many kinds; one sentence for all
        cause = exc.__cause__ or exc
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        where = "from the Hugging Face hub" if hub else "from file"
        raise ConfigError(f"Cannot load dataset '{name}' {where}: {first}") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
