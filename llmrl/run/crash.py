"""An exception nothing foresaw: one sentence for the user, its traceback in a file.

Every error a user can cause is an `LLMRLError` with its own sentence (docs/errors.md). Anything
else that escapes a command is the last resort: it becomes an `LLMRLError` (exit 1) that says what
failed, with which exception, and where its traceback is, while the traceback itself goes to

    RUN/error.log                        when a run folder exists (a run failed in it)
    $LLMRL_CACHE_DIR/error.log           otherwise (default ~/.cache/llmrl/error.log)

and is shown on stderr only with `llmrl --debug …` or `LLMRL_DEBUG=1` (`cli/errors.py`). The
exception stays on the error as `trace`, so the CLI can show it in debug mode.
"""

from __future__ import annotations

import os
import traceback
from datetime import datetime, timezone
from pathlib import Path

from ..errors import LLMRLError

LOG = "error.log"
DEBUG_HINT = "run again with --debug (or LLMRL_DEBUG=1) to see it here"


def debugging() -> bool:
    """Whether tracebacks are shown on stderr: LLMRL_DEBUG set to anything but '', 0, false, no, off."""
    return os.environ.get("LLMRL_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def describe(exc: BaseException) -> str:
    """'RuntimeError: boom' — the exception's type and the first line of its message (no trailing dot)."""
    text = str(exc).strip()
    first = text.splitlines()[0].strip().rstrip(".") if text else ""
    if len(first) > 300:
        first = first[:297] + "…"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def cache_log() -> Path:
    """Where the traceback of an error outside any run folder goes."""
    root = os.environ.get("LLMRL_CACHE_DIR")
    if root:
        return Path(root).expanduser() / LOG
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "llmrl" / LOG


def write_log(exc: BaseException, path: Path, command: str = "") -> Path | None:
    """Write `exc`'s full traceback (with the time and the command line) to `path`; the path, or None
    when it cannot be written (a read-only folder, a full disk): the sentence then says so."""
    text = "".join(traceback.format_exception(exc))
    head = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC  {command}\n".lstrip()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8", errors="backslashreplace") as fh:  # a command line may hold undecodable bytes
            fh.write(head + text)
    except OSError:
        return None
    return path


def where(log: Path | None) -> str:
    """'its traceback is in X; run again with --debug …' (or why there is no file)."""
    if log is None:
        return f"its traceback could not be written to a file; {DEBUG_HINT}"
    return f"its traceback is in {log}; {DEBUG_HINT}"


def unexpected(exc: BaseException, what: str, log: Path | None, after: str = "") -> LLMRLError:
    """The last-resort error for `exc`: '<what> failed with <Type: message> (an error llmrl did not
    expect; <where the traceback is>).<after>', exit 1, carrying `exc` as its trace."""
    err = LLMRLError(f"{what} failed with {describe(exc)} (an error llmrl did not expect; {where(log)}).{after}",
                     exit_code=1)
    err.trace = exc
    return err
