"""glibc's malloc set from the process, so the memory a run frees goes back to the system.

glibc serves a request of at least M_MMAP_THRESHOLD bytes with a mapping of its own, unmapped when it is
freed; a smaller one comes from its heap, which keeps a freed block for reuse. The threshold starts at
128 KiB and rises to the size of every mapped block freed, up to 32 MiB: after the first large tensors of
a run are freed, every tensor below that size comes from the heap and stays in the process's memory once
freed, so a step's activations, freed after the update, still count against the machine in the next phase
(docs/quantized.md: 7.5 GiB against 3.7 GiB on Qwen2.5-0.5B). `mallopt(M_MMAP_THRESHOLD, 1 MiB)` fixes the
threshold (what `MALLOC_MMAP_THRESHOLD_=1048576` in the environment does): every block of ≥ 1 MiB is its
own mapping, given back when freed. mallopt changes where memory comes from, never a number computed.

It costs seconds: a mapping's pages are faulted in and zeroed afresh at every allocation, where the heap
hands back warm memory. The default run (`llmrl train --algo ppo`, 2-core AMD EPYC family 25, 2026-12-07,
alternated off/on/off/on) took 155.9 / 164.3 s with glibc's own threshold and 174.4 / 186.8 s with it fixed
(1.13×) for 1.7 % less peak (583 → 574 MiB); on the 4-bit Qwen2.5-Coder-0.5B GRPO step it is 4,509 → 3,646
MiB (HEAP_RETENTION: what the heap kept, 1.24× the peak without it). So it is set where memory is tight:

    memory.allocator  on     set once at the start of `llmrl train` and `llmrl reward train`
                      auto   set by `llmrl train` when the plan's peak × HEAP_RETENTION exceeds the budget
                             (memory/plan.py: the run may need the memory the heap would keep); a reward run
                             has no plan and leaves it
                      off    the allocator as it is

on Linux with glibc, unless the environment sets MALLOC_MMAP_THRESHOLD_ (the user's value is kept);
elsewhere (macOS, musl) nothing is done, silently.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD = 1 << 20  # bytes: blocks this large and larger are mapped, and unmapped when freed
SETTINGS = ((M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD),)  # (mallopt's parameter, its variable, value)
HEAP_RETENTION = 1.24  # peak with glibc's heap / without it, 4-bit Qwen2.5-Coder-0.5B GRPO (module docstring)


def tight(peak: int, budget: int) -> bool:
    """Whether a plan's `peak` (bytes) could exceed `budget` once glibc's heap keeps what it frees."""
    return peak * HEAP_RETENTION > budget


def glibc() -> ctypes.CDLL | None:
    """The process's C library where it is glibc (it has `gnu_get_libc_version`; musl does not), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version, libc.mallopt  # noqa: B018  (glibc's own symbols)
    except (OSError, AttributeError):
        return None
    return libc


def set_allocator(mode: str, environ: Mapping[str, str] = os.environ, tight: bool = True) -> tuple[str, ...]:
    """Set glibc's malloc for a run (module docstring) where `mode` is 'on', or 'auto' and memory is `tight`;
    the names of the settings made (as their environment variables), () where none was: mode 'off', 'auto'
    with room, no glibc, or each one set by the environment already."""
    libc = glibc() if mode == "on" or (mode == "auto" and tight) else None
    if libc is None:
        return ()
    made = []
    for param, variable, value in SETTINGS:
        if variable not in environ and libc.mallopt(param, value) == 1:
            made.append(f"{variable}={value}")
    return tuple(made)
