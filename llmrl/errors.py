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


class PluginError(RunFailed):
    """User code (a reward function or model, an environment or one of its tools, a registered
    estimator or policy loss) handed llmrl a value outside its contract, or a dataset column a reward
    reads holds one: one sentence naming the plug-in (`module:name`), what it returned, for which
    row/episode/turn, and what was expected (docs/errors.md). Exit 1 during a run, after a checkpoint
    of the last completed step (the value is checked where it arrives, before the step's update, so
    the state is consistent unless an update had begun: `run/loop.py` checks); exit 2 before the
    first step (construction, `tools()`, dataset columns, the first evaluation)."""

    consistent = True


def plugin_name(obj: object) -> str:
    """How an error names user code: 'module:qualname', or 'path/to/file.py:qualname' for a function or
    class loaded from a file (`rewards/resolve.py` gives such a module an internal name)."""
    import sys

    module = getattr(obj, "__module__", None) or "?"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
    if module.startswith("llmrl_user_"):
        module = getattr(sys.modules.get(module), "__file__", None) or module
    return f"{module}:{name}"


def is_builtin(fn: object) -> bool:
    """Whether `fn` is llmrl's own (its module is in the llmrl package): a plug-in's outputs are checked
    for finiteness, a built-in's pinned maths is not second-guessed (a non-finite value there from
    finite inputs, e.g. rewards near float32's limit, is a skipped update, `update.max_bad_steps`)."""
    return (getattr(fn, "__module__", "") or "").split(".")[0] == "llmrl"


def shown(value: object, limit: int = 60) -> str:
    """A short description of a returned value for an error sentence: 'None', 'True', 'the int 42',
    'nan', "the str 'abc'", 'a list of 3 items', 'a tensor of shape (2, 3)', 'a set'."""
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value != value or value in (float("inf"), float("-inf")) else f"the float {value!r}"
    if isinstance(value, int):
        text = repr(value)
        return f"the int {text if len(text) <= limit else text[:limit] + '…'}"
    if isinstance(value, (str, bytes)):
        text = repr(value[:limit])
        return f"the {type(value).__name__} {text}{'…' if len(value) > limit else ''}"
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "ndim"):
        kind = "tensor" if type(value).__module__.startswith("torch") else "array"
        return f"a {kind} of shape {tuple(shape)}"
    if isinstance(value, (list, tuple, dict)):
        n = len(value)
        return f"a {type(value).__name__} of {n} item{'' if n == 1 else 's'}"
    return f"a {type(value).__name__}"
