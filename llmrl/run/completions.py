"""Sample rows of a step's completions for completions.jsonl and the terminal.

The rows are the batch's first `k` (prompt, completion, reward) rows: a deterministic choice that
draws no random numbers, so logging never changes a run.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from torch import Tensor


def due(step: int, every: int) -> bool:
    """Log at step 1 and every `every` steps (steps count from 1); never when `every` is 0."""
    return every > 0 and (step == 1 or step % every == 0)


def _plain(value: Any) -> Any:
    """`value` when JSON can hold it (text, numbers, chat message lists), else its text."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def sample_rows(step: int, rows: Sequence[dict[str, Any]], completions: Sequence[str], scores: Tensor,
                group_size: int, k: int, parts: dict[str, Tensor] | None = None) -> list[dict[str, Any]]:
    """The first `k` of the N = B·G rows: {step, prompt, completion, reward, [rewards,] <extra columns>}.

    `rows` are the B dataset rows; row i of the batch answers `rows[i // group_size]`. With a reward of
    several terms (`parts`: {label: (N,)}, reward = Σ weight · term), `rewards` holds each term's
    value for the row, unweighted: {label: value}.
    """
    out = []
    for i in range(min(k, len(completions))):
        data = rows[i // group_size]
        extra = {key: _plain(v) for key, v in data.items() if key != "prompt"}
        terms = {"rewards": {label: float(v[i]) for label, v in parts.items()}} if parts and len(parts) > 1 else {}
        out.append({"step": step, "prompt": _plain(data["prompt"]), "completion": completions[i],
                    "reward": float(scores[i]), **terms, **extra})
    return out
