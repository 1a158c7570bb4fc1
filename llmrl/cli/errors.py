"""User errors become one sentence on stderr and a non-zero exit code, never a traceback."""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any, Callable

import typer

from ..parallel.distributed import PeerLost
from ..errors import LLMRLError


def _prints(exc: BaseException) -> bool:
    """Whether this process reports `exc`: in a data-parallel run every rank raises the same agreed
    error, so rank 0 alone prints it; another rank speaks only when it lost the others (rank 0
    may be the one that died)."""
    return os.environ.get("RANK", "0") == "0" or isinstance(exc, PeerLost)


QUIET_RANK_WAIT_S = 5.0
"""How long a rank that does not print waits before it exits: torchrun stops every process as soon as
one exits with an error, so a quiet rank leaving first could stop rank 0 before it has printed."""


def _report(exc: BaseException, message: str) -> None:
    if _prints(exc):
        print(message, file=sys.stderr)
    else:
        time.sleep(QUIET_RANK_WAIT_S)


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Typer command: LLMRLError → 'error: …' on stderr and its exit code; Ctrl-C → 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LLMRLError as exc:
            _report(exc, f"error: {exc}")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:
            _report(exc, "error: interrupted.")
            raise typer.Exit(130) from None

    return wrapper
