"""User errors become one sentence on stderr and a non-zero exit code, never a traceback."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import typer

from ..parallel.distributed import PeerLost
from ..errors import LLMRLError


def _prints(exc: BaseException) -> bool:
    """Whether this process reports `exc`: in a data-parallel run every rank raises the same agreed
    error, so rank 0 alone prints it; another rank speaks only when it lost the others (rank 0
    may be the one that died)."""
    return os.environ.get("RANK", "0") == "0" or isinstance(exc, PeerLost)


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Typer command: LLMRLError → 'error: …' on stderr and its exit code; Ctrl-C → 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LLMRLError as exc:
            if _prints(exc):
                print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:
            if _prints(exc):
                print("error: interrupted.", file=sys.stderr)
            raise typer.Exit(130) from None

    return wrapper
