"""User errors become one sentence on stderr and a non-zero exit code, never a traceback."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import typer

from ..errors import LLMRLError


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Typer command: LLMRLError → 'error: …' on stderr and its exit code; Ctrl-C → 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LLMRLError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            print("error: interrupted.", file=sys.stderr)
            raise typer.Exit(130) from None

    return wrapper
