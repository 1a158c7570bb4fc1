"""The console of the long commands (`train`, `compare`): output is a side channel, the run folder
is the record, so losing the reader must not lose the run.

rich's Console answers a `BrokenPipeError` (stdout was a pipe whose reader went away: `llmrl train |
head`, a harness that captured stdout and was killed) by raising SystemExit(1) from whichever print
hit it. Mid-run that skipped the checkpoint and left no error.log: a SmolLM2 run whose parent
process was stopped died at step 10 of 20 with nothing to resume from. `RunConsole` instead goes
quiet (stdout now writes to /dev/null, so the interpreter's last flush cannot fail either) and the run
carries on to its end, writing its folder as usual.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console


class RunConsole(Console):
    """A rich Console that keeps the program running when its reader goes away."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
