"""The `memory:` section of a run's settings (`llmrl train` and `llmrl reward train`): the budget the run
is sized to and how glibc's allocator is set (llmrl/memory/budget.py, llmrl/memory/allocator.py read it)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}  # K, KiB, Ki: binary
DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "b": 1}  # KB, MB, GB, TB: decimal
SIZE = re.compile(r"\s*(\d+(?:\.\d*)?(?:e\+?\d+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)
MOST = 2**62  # bytes: beyond any machine, and past it a size is a typo


def opt(default: Any, help: str, **bounds: Any) -> Any:
    """A field with help text and bounds, as schema.opt makes them (schema.py imports this module)."""
    return field(default=default, metadata={"help": help, **bounds})


@dataclass(frozen=True)
class MemoryConfig:
    max: str | None = opt(None, "the most memory the run may hold (the device's on a GPU, RAM on the CPU, shared by "
                          "torchrun's processes there): a size with units, 6GiB, 1.5GiB, 6144MiB, 6G (binary), 6GB "
                          "(decimal), or bytes; default: the device's memory (a memory cgroup's limit or physical "
                          "memory on the CPU, the GPU's on CUDA)", kind="size")
    allocator: str = opt("auto", "'on': on Linux with glibc, set its malloc at the start of the run (mallopt: freed "
                         "blocks of ≥ 1 MiB go back to the system, ≈ 1.1× the seconds) unless the environment sets "
                         "MALLOC_MMAP_THRESHOLD_; 'auto': so where the memory plan is tight (its peak × 1.24 over the "
                         "budget; reward runs: never); 'off': leave the allocator as it is",
                         choices=("auto", "on", "off"), bool_words=("off", "on"))

    def __post_init__(self) -> None:
        if self.max is not None:
            parse_size(self.max)  # a size it cannot read: one sentence when the settings load


def parse_size(text: str, name: str = "memory.max") -> int:
    """Bytes of a size as a user writes it: 6GiB, 6 GiB, 6G, 6g, 1.5GiB, 6144MiB, 6144M (binary: G = 2^30),
    6GB (decimal: 6·10⁹), or a plain count of bytes (6000000000); anything else, or a size of no whole
    byte or past 2^62, is a ConfigError naming `name` and the value."""
    match = SIZE.fullmatch(str(text))
    if match:
        number, prefix, tail = match.group(1), match.group(2).lower(), match.group(3).lower()
        scale = UNITS[prefix] if tail in ("", "i", "ib") else DECIMAL.get(prefix + tail)
        if scale is not None and ("i" not in tail or prefix) and 1 <= float(number) * scale <= MOST:  # inf: not ≤
            return round(float(number) * scale)
    raise ConfigError(f"{name} {text!r} is not a memory size a run can have: give a positive size with units, "
                      "e.g. 6GiB, 1.5GiB, 6144MiB or 6GB (decimal), or bytes.")


def size_text(n: float) -> str:
    """Bytes as GiB with one decimal, or MiB below 1 GiB."""
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"
