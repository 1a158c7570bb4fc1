"""User errors become one sentence on stderr and a non-zero exit code, never a traceback.

`friendly` is every command's boundary: an `LLMRLError` prints its own sentence; any other exception
that escapes a command is the last resort (`run/crash.py`): one sentence naming the command, the
exception and where its traceback went, exit 1. With `--debug` / `LLMRL_DEBUG=1` the traceback is
printed on stderr above the sentence.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import traceback
from typing import Any, Callable

import click
import typer

from ..errors import LLMRLError
from ..parallel.distributed import PeerLost
from ..run.crash import cache_log, debugging, unexpected, write_log


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
        trace = getattr(exc, "trace", None)
        if trace is not None and debugging():
            print("".join(traceback.format_exception(trace)).rstrip(), file=sys.stderr)
        print(message, file=sys.stderr)
    else:
        time.sleep(QUIET_RANK_WAIT_S)


def _command_line() -> str:
    return "llmrl " + " ".join(sys.argv[1:])


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Typer command: LLMRLError → 'error: …' on stderr and its exit code; Ctrl-C → 130; any
    other exception → one sentence, its traceback in error.log (`run/crash.py`), exit 1."""

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
        except (typer.Exit, typer.Abort, click.exceptions.ClickException):
            raise  # Typer's and click's own ways out (usage errors print their own line)
        except Exception as exc:  # the last resort: nothing foresaw it
            log = write_log(exc, cache_log(), _command_line()) if _prints(exc) else None
            err = unexpected(exc, f"llmrl {fn.__name__}", log)
            _report(err, f"error: {err}")
            raise typer.Exit(err.exit_code) from None

    return wrapper
