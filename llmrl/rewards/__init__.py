"""Rewards from the config: built-ins, user functions, reward models, summed with weights.

    reward:
      functions:
        - {name: numeric, weight: 1.0}                        # built-in (options: column, tolerance)
        - {name: math, column: solution}                      # math-verify's answer check (option: column)
        - {name: format, pattern: '^\\d+$', match: full, weight: 0.2}
        - {name: my_pkg.rewards:politeness, weight: 0.5}        # module:function (importable)
        - {name: rewards/mine.py:score}                         # file.py:function
        - {model: path/to/reward-model, weight: 0.2}            # AutoModelForSequenceClassification
        - {name: trl_rewards.py:accuracy, completions: messages}  # a reward written for TRL's chat data

The total reward of completion i is Σ_k weight_k · r_k(i). Every component is checked on its own
(step/score.py: raises / wrong count / non-finite → the run stops naming it) and logged as
`reward/<label>` in metrics.jsonl. A bare string entry `numeric` means `{name: numeric}`; a name
that is not a built-in and has no ':' is a reward model (folder or hub id `org/name`). Other keys
of an entry are options passed to the function as keyword arguments.

A function is called as `fn(prompts, completions, **columns)`; one whose `completions` parameter is not
its second is called by keyword, as TRL calls a reward (`fn(prompts=…, completions=…, **columns)`,
prompts only where it takes them). `completions: messages` (a function's own entry) hands it each
completion as TRL does for a conversational dataset, `[{"role": "assistant", "content": text}]`; the
default `text` hands the strings (llmrl's own rewards read text). The prompts are the rows' own, a string
or a list of messages, in both.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from ..errors import ConfigError
from .builtin import BUILTINS, COLUMN_READERS, require_math_verify
from .resolve import by_keyword, check_options, resolve_function

RESERVED = ("name", "model", "weight", "label", "completions")
SHAPES = ("text", "messages")  # how completions reach a function: its entry's `completions` (module docstring)


@dataclass(frozen=True)
class Component:
    """One named reward term: `weight · fn(prompts, completions, **columns)`."""

    label: str
    fn: Callable[..., Sequence[float]]
    weight: float
    kind: str = "Reward function"  # how errors name it: 'Reward function' or 'Reward model' (step/score.py)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> Sequence[float]:
        return self.fn(prompts, completions, **columns)


@dataclass(frozen=True)
class WeightedReward:
    """The task reward built from `reward.functions`; `step/score.py` scores each component."""

    components: tuple[Component, ...]

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        total = [0.0] * len(completions)
        for c in self.components:
            total = [t + c.weight * float(v) for t, v in zip(total, c(prompts, completions, **columns), strict=True)]
        return total


def build_reward(specs: Iterable[Mapping[str, Any] | str], *, columns: set[str], source: str,
                 device: torch.device, dtype: torch.dtype = torch.float32, batch_size: int = 16,
                 trust_remote_code: bool = False) -> WeightedReward:
    """Resolve every entry of `reward.functions` (a mapping, or a bare name); `columns` are the
    dataset's non-prompt columns, `source` names the dataset in errors."""
    comps: list[Component] = []
    for spec in specs:
        entry = {"name": spec} if isinstance(spec, str) else dict(spec)
        label, fn, weight = _resolve_entry(entry, columns, source, device, dtype, batch_size, trust_remote_code)
        taken = {c.label for c in comps}
        unique = label if label not in taken else next(f"{label}_{i}" for i in range(2, 999) if f"{label}_{i}" not in taken)
        kind = "Reward model" if hasattr(fn, "check_logits") else "Reward function"
        comps.append(Component(unique, fn, weight, kind))
    if not comps:
        raise ConfigError("'reward.functions' is empty; name at least one reward.")
    return WeightedReward(tuple(comps))


def _resolve_entry(spec: dict[str, Any], columns: set[str], source: str, device: torch.device, dtype: torch.dtype,
                   batch_size: int, trust_remote_code: bool) -> tuple[str, Callable[..., Sequence[float]], float]:
    weight = spec.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ConfigError(f"Reward entry {spec!r}: 'weight' must be a finite number.")
    options = {k: v for k, v in spec.items() if k not in RESERVED}
    name, model = spec.get("name"), spec.get("model")
    if (name is None) == (model is None) or not isinstance(name or model, str):
        raise ConfigError(f"Each entry of reward.functions needs exactly one of 'name' or 'model' (a string), got {spec!r}.")
    if name is not None and _is_model_name(name):
        model, name = name, None
    shape = _shape(spec, name)
    if model is not None:
        if options:
            raise ConfigError(f"Reward model '{model}' takes no options; got {', '.join(options)}.")
        from .adapter import AdapterReward, adapter_folder
        from .model import RewardModel

        rm: Any = (AdapterReward(model, batch_size) if adapter_folder(model) is not None
                   else RewardModel(model, device, dtype, batch_size, trust_remote_code))
        return str(spec.get("label") or f"model:{Path(model).name}"), rm, float(weight)
    fn = resolve_function(name)
    check_options(name, fn, options)
    _check_builtin(name, options, columns, source)
    return str(spec.get("label") or name), _bind(fn, options, shape, user=name not in BUILTINS), float(weight)


def _shape(spec: dict[str, Any], name: str | None) -> str:
    """The entry's `completions`: text (default) or messages, which only a function of the user's reads."""
    shape = spec.get("completions", "text")
    if shape not in SHAPES:
        raise ConfigError(f"Reward entry {spec!r}: 'completions' must be text or messages, got {shape!r}.")
    if shape == "messages" and (name is None or name in BUILTINS):
        what = f"Reward '{name}' reads" if name else "A reward model reads"
        raise ConfigError(f"{what} the completions as text; 'completions: messages' is for a function of your own "
                          "written for TRL's conversational data.")
    return shape


def _is_model_name(name: str) -> bool:
    """A folder, or a hub id `org/name`: neither a built-in nor `x:fn`."""
    if name in BUILTINS or ":" in name:
        return False
    return Path(name).expanduser().is_dir() or (name.count("/") == 1 and not name.endswith(".py"))


def _bind(fn: Callable[..., Sequence[float]], options: dict[str, Any], shape: str = "text",
          user: bool = False) -> Callable[..., Sequence[float]]:
    """fn with its options bound, called by position or by keyword (`by_keyword`), its completions in `shape`;
    a function without **kwargs receives only the columns it names. A function of the user's (`user`) gets
    its completions as text with a hint when it raises TypeError on chat prompts (`_hinted`)."""
    params = inspect.signature(fn).parameters
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
    keyword = by_keyword(fn)
    if open_ended and not keyword and not user:
        return partial(fn, **options) if options else fn
    with_prompts = open_ended or "prompts" in params

    def call(prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> Sequence[float]:
        given = [[{"role": "assistant", "content": c}] for c in completions] if shape == "messages" else completions
        named = columns if open_ended else {k: v for k, v in columns.items() if k in params}
        if keyword:
            return fn(**({"prompts": prompts} if with_prompts else {}), completions=given, **named, **options)
        return fn(prompts, given, **named, **options)

    call.__qualname__ = getattr(fn, "__qualname__", repr(fn))
    return _hinted(call) if user and shape == "text" else call


def _hinted(call: Callable[..., Sequence[float]]) -> Callable[..., Sequence[float]]:
    """`call`, whose TypeError on chat prompts (a message list among them) says what a reward written for
    TRL's conversational data needs: `completions: messages` (it indexed a string as a message list)."""

    def hinted(prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> Sequence[float]:
        try:
            return call(prompts, completions, **columns)
        except TypeError as exc:
            if all(isinstance(p, str) for p in prompts):
                raise
            raise TypeError(f"{exc} (the prompts are chat messages: a reward written for TRL's conversational data "
                            "reads each completion as [{'role': 'assistant', 'content': ...}]; give its "
                            "reward.functions entry completions: messages)") from exc

    hinted.__qualname__ = call.__qualname__
    return hinted


def check_columns(specs: Iterable[Mapping[str, Any] | str], columns: set[str], source: str) -> None:
    """Refuse a built-in of `specs` that reads a column `source` (a second file, e.g. the eval
    dataset) lacks, naming that file; `build_reward` checks the first."""
    for spec in specs:
        entry = {"name": spec} if isinstance(spec, str) else dict(spec)
        name = entry.get("name")
        if name in COLUMN_READERS:
            _check_builtin(name, {k: v for k, v in entry.items() if k not in RESERVED}, columns, source)


def _check_builtin(name: str, options: dict[str, Any], columns: set[str], source: str) -> None:
    """Options (and packages) of the built-ins that would otherwise fail at the first call."""
    if name == "math":
        require_math_verify()
    if name in COLUMN_READERS:
        col = options.get("column", "answer")
        if col not in columns:
            have = ", ".join(sorted(columns)) or "none besides the prompt"
            raise ConfigError(f"Reward '{name}' reads column '{col}', which '{source}' does not have "
                              f"(columns: {have}); set its 'column' option.")
    if name == "format":
        pattern = options.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError("Reward 'format' needs a 'pattern' option (a regular expression).")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"Reward 'format': pattern {pattern!r} is not a valid regular expression ({exc}).") from None
        if options.get("match", "search") not in ("search", "full"):
            raise ConfigError(f"Reward 'format': 'match' must be search or full, got {options['match']!r}.")
    if name == "length_penalty":
        target = options.get("target", 100)
        if isinstance(target, bool) or not isinstance(target, int) or target < 1:
            raise ConfigError(f"Reward 'length_penalty': 'target' must be a positive whole number of characters, got {target!r}.")


__all__ = ["BUILTINS", "Component", "WeightedReward", "build_reward", "check_columns"]
