"""A reward name → the callable: a built-in, `module:function` or `path/to/file.py:function`.

User code runs only here, and only when the user names it. Every way a name can fail to resolve
(no such built-in, module, file or function; an import that raises) is a ConfigError raised before
any training.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from ..errors import ConfigError
from .builtin import BUILTINS


def resolve_function(name: str) -> Callable[..., Any]:
    """The reward function `name` names (see the module docstring)."""
    if name in BUILTINS:
        return BUILTINS[name]
    target, sep, fn_name = name.rpartition(":")
    if not sep or not target or not fn_name:
        raise ConfigError(f"Reward '{name}' is not a built-in ({', '.join(BUILTINS)}), a 'module:function', "
                          f"a 'file.py:function' or a reward-model folder.")
    module = load_target(target)
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise ConfigError(f"Reward '{name}': '{target}' has no function '{fn_name}'.")
    if not callable(fn):
        raise ConfigError(f"Reward '{name}': '{fn_name}' in '{target}' is not callable.")
    return fn


def by_keyword(fn: Callable[..., Any]) -> bool:
    """Whether `fn` is called as TRL calls a reward, every argument by keyword: it names a parameter
    `completions` that is not its second (TRL's `def reward(completions, **kwargs)`). Any other function is
    called as llmrl calls one, `fn(prompts, completions, **columns)`, whatever its first two are named."""
    names = [n for n, p in inspect.signature(fn).parameters.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return "completions" in names and names.index("completions") != 1


def check_options(name: str, fn: Callable[..., Any], options: dict[str, Any]) -> None:
    """Options must be keyword parameters of `fn` (anything goes when it takes **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params) and name not in BUILTINS:
        return
    known = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    known = [k for k in known if k not in ("prompts", "completions")] if by_keyword(fn) else known[2:]
    for key in options:
        if key not in known:
            valid = ", ".join(known) or "none"
            raise ConfigError(f"Reward '{name}' has no option '{key}'; its options: {valid}.")


def load_target(target: str, kind: str = "reward") -> ModuleType:
    """The module `target` names: a `file.py` path or an importable module; `kind` names what it
    holds in the error messages (a reward, an environment: envs/base.py)."""
    return _load_file(target, kind) if target.endswith(".py") else _import(target, kind)


def _import(module: str, kind: str = "reward") -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"Cannot import {kind} module '{module}': {exc}.") from None
    except Exception as exc:  # the user's module failed while importing
        raise ConfigError(f"Importing {kind} module '{module}' raised {type(exc).__name__}: {exc}.") from None


def _load_file(path: str, kind: str = "reward") -> ModuleType:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"{kind.capitalize()} file '{path}' does not exist.")
    key = hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:10]
    mod_name = f"llmrl_user_{kind}_{p.stem}_{key}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, p)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[mod_name]
        raise ConfigError(f"Importing {kind} file '{path}' raised {type(exc).__name__}: {exc}.") from None
    return module
