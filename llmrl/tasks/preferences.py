"""Preference pairs in TRL's format → the texts a reward model scores, through the `datasets` library.

A pairs dataset is a local `.jsonl`/`.json`, `.csv` or `.parquet` file (or a folder of them), or a Hugging
Face hub name, loaded as tasks/dataset.py loads a task's (`pairs.split` of a hub dataset, `pairs.max_rows`).
Its rows are TRL's preference type (https://huggingface.co/docs/trl/dataset_formats), in one of three forms:

  - explicit prompt, text:            prompt "…", chosen "…", rejected "…"
        chosen text = prompt + chosen
  - explicit prompt, conversational:  prompt [messages], chosen [assistant message(s)], rejected [...]
        chosen text = the conversation prompt + chosen (a string answer is read as one assistant message)
  - implicit prompt:                  chosen and rejected alone, each a text or a whole conversation
        chosen text = the text, or the conversation

A conversation is rendered by `models.prompts.conversation_text` (the chat template, tokenize=False; without
one the contents joined by newlines), so that r(x, y) reads here exactly what an RL run's reward model reads
for (prompt, completion) (`models.prompts.reward_text`). An optional margin column m ≥ 0 per pair
(`pairs.margin_column`, default: a column named 'margin' where there is one) enters the loss as
−log σ(r_w − r_l − m).

The held-out pairs: `pairs.eval_dataset` when given, else the share `pairs.eval_fraction` held out by the
fixed shuffle of tasks/dataset.py's `split_rows` (seed `pairs.split_seed`, independent of the run's seed).
Every way a row can be wrong is a ConfigError naming the dataset and the row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..config.reward_run import PairsConfig
from ..errors import ConfigError
from ..models.prompts import conversation_text, uses_chat
from .dataset import _load_hub, _load_local, is_local, split_rows

COLUMNS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class Pair:
    """One preference, as the scorer reads it: the full texts of r(x, y_w) and r(x, y_l)."""

    chosen: str  # the prompt rendered + the chosen answer
    rejected: str  # the prompt rendered + the rejected answer
    margin: float = 0.0  # m ≥ 0: r_w must lead r_l by m (0: plain Bradley–Terry)
    row: int = 0  # 0-based index of the row in its dataset (messages name row + 1)


def load_pairs(cfg: PairsConfig, tokenizer: Any) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out) pairs of `cfg.dataset` (and `cfg.eval_dataset` when given); see the module
    docstring. `tokenizer` renders conversations; its lengths are checked by `check_lengths`."""
    if not cfg.dataset:
        raise ConfigError("A reward run needs preference pairs: pass --data FILE (or set pairs.dataset).")
    if cfg.chat_template == "on" and not uses_chat(tokenizer):
        raise ConfigError("'pairs.chat_template' is on but the model's tokenizer has no chat template; use auto.")
    pairs = read_pairs(cfg.dataset, cfg, tokenizer, cfg.split)
    if cfg.eval_dataset:
        return pairs, read_pairs(cfg.eval_dataset, cfg, tokenizer, cfg.eval_split)
    if cfg.eval_fraction > 0 and max(1, round(len(pairs) * cfg.eval_fraction)) >= len(pairs):
        raise ConfigError(f"Dataset '{cfg.dataset}' has {len(pairs)} pair(s): holding out pairs.eval_fraction="
                          f"{cfg.eval_fraction} leaves none to train on; give more pairs, a smaller fraction or "
                          "pairs.eval_dataset.")
    return split_rows(pairs, cfg.eval_fraction, cfg.split_seed, cfg.dataset)  # type: ignore[arg-type, return-value]


def read_pairs(name: str, cfg: PairsConfig, tokenizer: Any, split: str) -> list[Pair]:
    """Every pair of dataset `name` (the first `cfg.max_rows`), validated and rendered."""
    table = _load_local(name) if is_local(name) else _load_hub(name, split)
    if name.lower().endswith(".csv"):  # a CSV column of digits loads as numbers: the texts are its strings
        import datasets

        for column in set(COLUMNS) & set(table.column_names):
            table = table.cast_column(column, datasets.Value("string"))
    if cfg.max_rows is not None:
        table = table.select(range(min(cfg.max_rows, len(table))))
    if len(table) == 0:
        raise ConfigError(f"Dataset '{name}' is empty.")
    columns = table.column_names
    missing = [c for c in ("chosen", "rejected") if c not in columns]
    if missing:
        raise ConfigError(f"Dataset '{name}' has no {' or '.join(repr(c) for c in missing)} column (columns: "
                          f"{', '.join(columns)}); preference pairs need chosen and rejected, and optionally prompt "
                          "(TRL's preference format).")
    margin = margin_column(cfg.margin_column, columns, name)
    return [pair_of(raw, i, name, tokenizer, margin) for i, raw in enumerate(table)]


def margin_column(configured: str | None, columns: Sequence[str], name: str) -> str | None:
    """The column margins are read from: `pairs.margin_column` (which must exist), else 'margin' if present."""
    if configured is None:
        return "margin" if "margin" in columns else None
    if configured not in columns:
        raise ConfigError(f"Dataset '{name}' has no margin column '{configured}' (pairs.margin_column; columns: "
                          f"{', '.join(columns)}).")
    return configured


def pair_of(raw: dict[str, Any], i: int, name: str, tokenizer: Any, margin: str | None) -> Pair:
    """Row i of dataset `name` as a Pair, or a ConfigError naming the row."""
    where = f"Row {i + 1} of dataset '{name}'"
    for side in ("chosen", "rejected"):
        check_answer(raw[side], side, where)
    if isinstance(raw["chosen"], str) != isinstance(raw["rejected"], str):
        kinds = {side: "text" if isinstance(raw[side], str) else "messages" for side in ("chosen", "rejected")}
        raise ConfigError(f"{where}: chosen is {kinds['chosen']} but rejected is {kinds['rejected']}; give both in one "
                          "form (TRL's standard or conversational).")
    chosen, rejected = (render(raw, side, where, tokenizer) for side in ("chosen", "rejected"))
    if chosen == rejected:
        raise ConfigError(f"{where}: chosen and rejected are identical, so the pair prefers nothing; drop the row.")
    return Pair(chosen, rejected, margin_of(raw[margin], where) if margin else 0.0, i)


def render(raw: dict[str, Any], side: str, where: str, tokenizer: Any) -> str:
    """The text of `side` ('chosen' or 'rejected', checked by `check_answer`) of one row, in its form (see the
    module docstring)."""
    answer, prompt = raw[side], raw.get("prompt")
    if "prompt" not in raw:  # implicit prompt: the answer is the whole text or conversation
        if isinstance(answer, str):
            return answer
        check_assistant(answer, f"the {side} conversation", where)
        return templated(tokenizer, answer, f"the {side} conversation", where)
    check_prompt(prompt, where)
    if isinstance(prompt, str):
        if not isinstance(answer, str):
            raise ConfigError(f"{where}: the prompt is text but the {side} answer is a list of messages; give both "
                              "as text or both as messages (TRL's standard or conversational form).")
        return prompt + answer
    messages = [{"role": "assistant", "content": answer}] if isinstance(answer, str) else list(answer)
    check_assistant(messages, f"the {side} answer", where)
    return templated(tokenizer, [*prompt, *messages], f"the prompt and {side} answer", where)


def templated(tokenizer: Any, messages: list[dict[str, Any]], what: str, where: str) -> str:
    """`conversation_text`, a chat template's own refusal (raise_exception: roles that do not alternate, a
    system turn it does not take) becoming a ConfigError naming the row."""
    try:
        return conversation_text(tokenizer, messages)
    except Exception as exc:  # jinja2's TemplateError and whatever else a template's code raises
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{where}: the chat template refuses {what} ({first}).") from None


def check_answer(answer: Any, side: str, where: str) -> None:
    """A chosen or rejected value: a non-empty string or a non-empty list of {role: str, content: str}."""
    if isinstance(answer, str):
        if not answer.strip():
            raise ConfigError(f"{where} has an empty {side} answer.")
        return
    if not isinstance(answer, list):
        kind = "missing" if answer is None else f"of type {type(answer).__name__}"
        raise ConfigError(f"{where}: the {side} answer is {kind}, not a string or a list of {{role, content}} "
                          "messages.")
    if not answer:
        raise ConfigError(f"{where} has an empty {side} answer (an empty list of messages).")
    check_messages(answer, f"the {side} answer", where)


def check_prompt(prompt: Any, where: str) -> None:
    """An explicit prompt: a non-empty string or a non-empty list of {role: str, content: str}."""
    if isinstance(prompt, str) and prompt.strip():
        return
    if isinstance(prompt, list) and prompt:
        check_messages(prompt, "the prompt", where)
        return
    kind = "missing" if prompt is None else "empty" if not prompt else f"of type {type(prompt).__name__}"
    raise ConfigError(f"{where}: the prompt is {kind}, not a non-empty string or list of {{role, content}} messages.")


def check_messages(messages: list[Any], what: str, where: str) -> None:
    for j, msg in enumerate(messages, 1):
        if not (isinstance(msg, dict) and isinstance(msg.get("role"), str) and isinstance(msg.get("content"), str)):
            raise ConfigError(f"{where}: message {j} of {what} is not a {{role: str, content: str}} mapping "
                              f"(got {msg!r}).")


def check_assistant(messages: list[dict[str, Any]], what: str, where: str) -> None:
    """A conversation a reward model scores holds an assistant turn (the answer it judges) that is not blank."""
    said = [m["content"] for m in messages if m["role"] == "assistant"]
    if not said:
        roles = ", ".join(m["role"] for m in messages)
        raise ConfigError(f"{where}: {what} has no assistant turn (roles: {roles}), so there is no answer to score.")
    if not any(c.strip() for c in said):
        raise ConfigError(f"{where}: {what} has only empty assistant turns, so there is no answer to score.")


def margin_of(value: Any, where: str) -> float:
    """A row's margin: a finite number ≥ 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise ConfigError(f"{where}: the margin is {value!r}, not a finite number ≥ 0.")
    return float(value)


def check_lengths(pairs: Sequence[Pair], tokenizer: Any, limit: int, split: str) -> None:
    """Refuse the first pair whose chosen or rejected text is over `limit` tokens (`tokenizer(text)`, its
    default special tokens, as the scorer tokenizes it): a reward model never reads a truncated answer.
    `split` names the set in the message ('train', 'held-out')."""
    for side in ("chosen", "rejected"):
        texts = [getattr(p, side) for p in pairs]
        lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]] if texts else []
        for pair, n in zip(pairs, lengths):
            if n > limit:
                raise ConfigError(f"Row {pair.row + 1} of the {split} pairs is too long: its {side} text is {n} tokens, "
                                  f"over the limit of {limit} (pairs.max_length, default the model's context window); "
                                  "shorten or drop it.")
