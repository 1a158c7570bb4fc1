"""The `memory:` section of a run's settings (`llmrl train` and `llmrl reward train`): the budget the run
is sized to and how glibc's allocator is set (llmrl/memory/budget.py, llmrl/memory/allocator.py read it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def opt(default: Any, help: str, **bounds: Any) -> Any:
    """A field with help text and bounds, as schema.opt makes them (schema.py imports this module)."""
    return field(default=default, metadata={"help": help, **bounds})


@dataclass(frozen=True)
class MemoryConfig:
    max: str | None = opt(None, "the most memory the run may hold (the device's on a GPU, RAM on the CPU, shared by "
                          "torchrun's processes there): a size with units, 6GiB, 1.5GiB, 6144MiB, 6G (binary), 6GB "
                          "(decimal), or bytes; default: the device's memory (a memory cgroup's limit or physical "
                          "memory on the CPU, the GPU's on CUDA)")
    allocator: str = opt("auto", "'auto': on Linux with glibc, set its malloc at the start of the run (mallopt: freed "
                         "blocks of ≥ 1 MiB go back to the system) unless a MALLOC_*_ variable of the environment "
                         "sets it; 'off': leave the allocator as it is", choices=("auto", "off"), bool_words=("off", "auto"))
