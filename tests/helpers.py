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
