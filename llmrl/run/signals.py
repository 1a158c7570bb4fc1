"""Stopping a run cleanly: the first Ctrl-C, SIGTERM or SIGHUP (the terminal or SSH session that
started it closed) asks the loop to stop at the next step boundary (so the checkpoint it writes is
consistent); a second one stops at once."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class StopFlag:
    """Set by the first Ctrl-C, SIGTERM or SIGHUP; the loop stops at the next step boundary."""

    requested = False


@contextmanager
def graceful_stop() -> Iterator[StopFlag]:
    """First SIGINT/SIGTERM/SIGHUP: finish the current step, checkpoint, stop. Second: stop at once.
    (SIGHUP's default would end the process mid-step with nothing saved since the last checkpoint.)"""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame: Any) -> None:
        if flag.requested:
            raise KeyboardInterrupt
        flag.requested = True

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield flag
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
