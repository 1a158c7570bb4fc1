"""Every setting's domain: its type, range or choices, checked before anything loads.

A field's metadata (`schema.opt`) gives its explicit bounds (`choices`, `min`, `max`, `gt`, `each`,
`kind`); what no field states is derived from what the code can hold:

    int     ≤ 2^63 − 1 (INT_MAX): every integer setting ends up in an int64 tensor, a tracker's step
            or a torch generator's seed
    float   finite and |x| ≤ 3.4028e38 (FLOAT_MAX): losses, rewards and weights are float32, so a
            larger coefficient is infinity the moment it multiplies one
    text    non-empty, without control characters (a NUL byte, a line break), no part between slashes
            longer than 255 bytes: each text setting is a name, a path or a hub id, a NUL byte cannot be
            in a path and no file system holds a longer name
    module  (`kind="module"`) a dotted Python module name, what `importlib.import_module` takes
    prose   (`kind="prose"`) words a model reads (a system prompt): any text, empty and line breaks
            included, without a NUL byte

`describe` writes the domain for `llmrl config`; `check_domain` raises the ConfigError.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Mapping

from ..errors import ConfigError

INT_MAX = 2**63 - 1
FLOAT_MAX = 3.4028234663852886e38
NAME_MAX = 255
"""Bytes of one file or folder name (between two slashes) that file systems hold; a text setting is a
name, a path or a hub id, and none of them has a longer part."""
LR_MAX = FLOAT_MAX * (1 - 0.9)
"""AdamW's first step moves by lr / (1 − β1) = 10 · lr, a float32 scalar: a learning rate above this
overflows before any weight changes."""
SEED_MAX = 2**32 - 1
"""A run's seeds: numpy's seed range (vLLM seeds numpy with `seed`); `seed · 7919 + epoch` (the prompt
order) and `seed + 1` (the minibatch generator) then fit torch's 64-bit generators for any epoch."""


def base_type(tp: Any) -> Any:
    """The annotation without its `| None`."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner[0]
    return tp


def optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _num(x: Any) -> str:
    if isinstance(x, int) and x >= 2**31:
        return {INT_MAX: "2^63 − 1", SEED_MAX: "2^32 − 1"}.get(x, f"{x:,}")
    if x == LR_MAX:
        return "3.4e+37"
    return f"{x:g}" if isinstance(x, float) else str(x)


def describe(tp: Any, meta: Mapping[str, Any]) -> str:
    """The domain in words: 'int 1 … 2^63 − 1', 'float > 0 … 3.4e+38', 'one of a, b', 'true/false', …"""
    base, none = base_type(tp), " or null" if optional(tp) else ""
    if "choices" in meta:
        return f"one of {', '.join(map(str, meta['choices']))}{none}"
    if "each" in meta:
        return f"list of {', '.join(meta['each'])}"
    if base is bool:
        return f"true/false{none}"
    if base in (int, float):
        low = f"> {_num(meta['gt'])}" if "gt" in meta else _num(meta["min"]) if "min" in meta else None
        high = meta.get("max", INT_MAX if base is int else FLOAT_MAX)
        span = (f"{low} … {_num(high)}" if low is not None
                else f"|x| ≤ {_num(high)}" if base is float else f"≤ {_num(high)}")
        return f"{base.__name__} {span}{none}"
    if base is str:
        kind = meta.get("kind")
        named = {"module": "Python module name", "prose": "any text", "size": "a size with units (6GiB, 6GB) or bytes"}
        return named.get(kind, "text") + none
    origin = typing.get_origin(base)
    if origin is list:
        item = typing.get_args(base)[:1]
        what = {(str,): "texts", (float,): "numbers"}.get(item, "names or mappings")
        return f"list of {what}{none}"
    return f"{getattr(base, '__name__', str(base))}{none}"


def _check_text(key: str, text: str) -> None:
    if not text.strip():
        raise ConfigError(f"'{key}' must be non-empty text, got {text!r}.")
    long = next((part for part in text.split("/") if len(part.encode("utf-8", "surrogatepass")) > NAME_MAX), None)
    if long is not None:
        raise ConfigError(f"'{key}' holds a name of {len(long.encode('utf-8', 'surrogatepass'))} bytes between its "
                          f"slashes; no file system holds one longer than {NAME_MAX}, got '{text[:40]}…'.")
    bad = next((ch for ch in text if ord(ch) < 32 or ord(ch) == 127), None)
    if bad is not None:
        raise ConfigError(f"'{key}' must not hold control characters (such as a NUL byte or a line break), "
                          f"got {text!r}.")


def _check_module(key: str, name: str) -> None:
    if not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(f"'{key}' must be a Python module name such as 'my_pkg.estimators', got {name!r}.")


def check_prose(key: str, value: str) -> None:
    """Free text (a system prompt): any characters but a NUL byte, and valid UTF-8 (a command line's
    undecodable bytes arrive as lone surrogates, which no tokenizer takes)."""
    if "\x00" in value:
        raise ConfigError(f"'{key}' must not hold a NUL byte, got {value!r}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"'{key}' must be valid UTF-8 text, got {value!r}.") from None


def check_domain(key: str, value: Any, tp: Any, meta: Mapping[str, Any]) -> None:
    """Raise a ConfigError when a coerced `value` lies outside the domain no field states explicitly
    (the explicit bounds are `load.check_bounds`')."""
    if value is None:
        return
    base = base_type(tp)
    if base is int and "max" not in meta and value > INT_MAX:
        raise ConfigError(f"'{key}' must be ≤ {_num(INT_MAX)} (an int64), got {value!r}.")
    if base is float and "max" not in meta and abs(value) > FLOAT_MAX:
        raise ConfigError(f"'{key}' must lie within float32's range (|x| ≤ {FLOAT_MAX:.4g}), got {value!r}.")
    if base is str and meta.get("kind") == "prose":
        check_prose(key, value)
    elif base is str:
        _check_text(key, value)
        if meta.get("kind") == "module":
            _check_module(key, value)
    if typing.get_origin(base) is list and typing.get_args(base)[:1] == (str,):
        for item in value:
            _check_text(key, item)
    if typing.get_origin(base) is list and typing.get_args(base)[:1] not in ((str,), (float,)):
        for item in value:  # reward specs: their names and paths
            for k, v in item.items():
                if isinstance(v, str):
                    _check_text(f"{key}[].{k}", v)
                elif isinstance(v, float) and not math.isfinite(v):
                    raise ConfigError(f"'{key}[].{k}' must be a finite number, got {v!r}.")
