"""glibc's malloc set from the process (llmrl/memory/allocator.py): with `memory.allocator: auto` a freed
block of ≥ 1 MiB goes back to the system, where glibc's own rising threshold keeps it in the heap; the
environment's MALLOC_MMAP_THRESHOLD_ is kept; `off` and a C library other than glibc change nothing.
Each case runs in a fresh interpreter (a process's allocator is set once), allocating through libc's own
malloc: 48 blocks of 8 MiB after one freed 16 MiB block (which raises glibc's threshold to 16 MiB), all
freed but the last, and the resident memory that stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrl.memory.allocator import glibc, set_allocator, tight

ROOT = Path(__file__).resolve().parents[1]
BLOCKS, BLOCK = 48, 8 << 20
PROBE = f"""
import ctypes, json, sys
from llmrl.memory.allocator import set_allocator
made = set_allocator(sys.argv[1])
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
big = libc.malloc(16 << 20); ctypes.memset(big, 1, 16 << 20); libc.free(big)
before = rss()
blocks = [libc.malloc({BLOCK}) for _ in range({BLOCKS})]
for b in blocks:
    ctypes.memset(b, 1, {BLOCK})
for b in blocks[:-1]:
    libc.free(b)
print(json.dumps({{"made": made, "kept": rss() - before}}))
"""

needs_glibc = pytest.mark.skipif(glibc() is None, reason="glibc's mallopt: Linux with glibc only")


def _probe(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", PROBE, mode], env={**clean, **env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_glibc
def test_auto_gives_freed_blocks_back_where_glibc_keeps_them() -> None:
    off, auto = _probe("off"), _probe("auto")
    assert off["made"] == [] and auto["made"] == ["MALLOC_MMAP_THRESHOLD_=1048576"]
    assert off["kept"] > (BLOCKS - 4) * BLOCK, off  # glibc's heap keeps the 47 freed blocks: ≈ 384 MiB resident
    assert auto["kept"] < 4 * BLOCK, auto  # each block its own mapping, unmapped when freed: the last one stays


@needs_glibc
def test_the_environments_setting_is_kept() -> None:
    mine = _probe("auto", MALLOC_MMAP_THRESHOLD_=str(64 << 20))  # the user's: blocks below 64 MiB from the heap
    assert mine["made"] == [] and mine["kept"] > (BLOCKS - 4) * BLOCK, mine
    assert set_allocator("auto", {"MALLOC_MMAP_THRESHOLD_": "1"}) == ()


def test_off_and_other_systems_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set_allocator("off", {}) == ()
    monkeypatch.setattr(sys, "platform", "darwin")
    assert glibc() is None and set_allocator("auto", {}) == ()


@needs_glibc
def test_auto_sets_it_only_where_the_plan_is_tight_and_on_always() -> None:
    # it costs seconds (1.13× the default run, memory/allocator.py), so 'auto' leaves glibc alone with room
    assert set_allocator("auto", {}, tight=False) == ()
    assert _probe("on")["made"] == ["MALLOC_MMAP_THRESHOLD_=1048576"]
    # tight: peak × 1.24 > budget; 100 × 1.24 = 124 is not over 124, 101 × 1.24 = 125.24 is
    assert not tight(100, 124) and tight(101, 124)
