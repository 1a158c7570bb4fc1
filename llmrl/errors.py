"""Errors a user can cause. The CLI prints their message as one sentence and exits non-zero."""

from __future__ import annotations


class LLMRLError(Exception):
    """A problem with the user's input or environment, not a bug in llmrl.

    `exit_code` is 2 for invalid input (bad config, bad arguments) and 1 for a run that failed.
    """

    exit_code: int = 2
    trace: BaseException | None = None
    """An exception llmrl did not expect behind this error (`run/crash.py`): its traceback is written to
    error.log, and shown on stderr with --debug."""

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(LLMRLError):
    """An unknown key, a wrong type or an out-of-range value in a recipe or an override."""


class RunFailed(LLMRLError):
    """A run stopped because of something outside llmrl's control (reward function, disk, ...).

    `consistent` means the training state is still that of the last completed step (nothing was
    updated yet), so the trainer checkpoints it before stopping: nothing is lost.
    """

    exit_code = 1
    consistent = False
