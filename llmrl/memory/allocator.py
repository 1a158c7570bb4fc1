"""glibc's malloc set from the process, so the memory a run frees goes back to the system.

glibc serves a request of at least M_MMAP_THRESHOLD bytes with a mapping of its own, unmapped when it is
freed; a smaller one comes from its heap, which keeps a freed block for reuse. The threshold starts at
128 KiB and rises to the size of every mapped block freed, up to 32 MiB: after the first large tensors of
a run are freed, every tensor below that size comes from the heap and stays in the process's memory once
freed, so a step's activations, freed after the update, still count against the machine in the next phase
(docs/quantized.md: 7.5 GiB against 3.7 GiB on Qwen2.5-0.5B). `mallopt(M_MMAP_THRESHOLD, 1 MiB)` fixes the
threshold (what `MALLOC_MMAP_THRESHOLD_=1048576` in the environment does): every block of ≥ 1 MiB is its
own mapping, given back when freed. mallopt changes where memory comes from, never a number computed.

`memory.allocator: auto` sets it once at the start of `llmrl train` and `llmrl reward train`, on Linux
with glibc, unless the environment sets MALLOC_MMAP_THRESHOLD_ (the user's value is kept); elsewhere
(macOS, musl) nothing is done, silently; `off` leaves the allocator as it is.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD = 1 << 20  # bytes: blocks this large and larger are mapped, and unmapped when freed
SETTINGS = ((M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD),)  # (mallopt's parameter, its variable, value)


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


def set_allocator(mode: str, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Set glibc's malloc for a run (module docstring) where `mode` is 'auto'; the names of the settings
    made (as their environment variables), () where none was: mode 'off', no glibc, or each one set by
    the environment already."""
    libc = glibc() if mode == "auto" else None
    if libc is None:
        return ()
    made = []
    for param, variable, value in SETTINGS:
        if variable not in environ and libc.mallopt(param, value) == 1:
            made.append(f"{variable}={value}")
    return tuple(made)
