"""Small helpers shared by the math table tests."""

from __future__ import annotations

import torch

ATOL = dict(atol=1e-4, rtol=0)


def close(actual, expected) -> None:
    """assert_close with the project's tight math tolerance (atol 1e-4, rtol 0)."""
    if isinstance(actual, torch.Tensor):
        expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, **ATOL)


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def m(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def digit_share(prompts: list[str], completions: list[str], answer: list[str]) -> list[float]:
    """A dense reward a random model earns too: the share of digits in the completion."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def digits_task(name: str = "digits", success: float = 1.0):
    """The arithmetic prompts with `digit_share` as reward, for runs on a random tiny model."""
    from llmrl.tasks import Task, get_task

    base = get_task("arithmetic")
    return Task(name, base.train, base.eval, digit_share, success=success)


def is_timing(key: str) -> bool:
    """A metrics-row key that holds wall seconds (`step_time_s`, `time_<phase>_s`): never compared."""
    return key == "step_time_s" or (key.startswith("time_") and key.endswith("_s"))
