"""The budget: the bytes one process of a run may hold, and where that figure comes from.

    B = memory.max (`--max-memory`)          where set, else the device's memory:
        the GPU's total memory               on CUDA (`torch.cuda.get_device_properties`)
        min(physical memory, cgroup limit)   on the CPU (models/load.device_memory)
    B_process = B / P                        on the CPU, P = torchrun's processes on this machine
                                             (LOCAL_WORLD_SIZE), which share its memory; each GPU is
                                             its own process's

`parse_size` (sizes as users write them) and `size_text` live with the setting it validates, config/memory.py.

Every check that sizes a run against the machine (run/preflight.py, run/update_fit.py, the weights
before loading in models/load.check_fits) reads this one figure, so `--max-memory` bounds them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config.memory import parse_size, size_text
from ..models import load

__all__ = ["Budget", "device_budget", "parse_size", "run_budget", "size_text"]


@dataclass(frozen=True)
class Budget:
    """What one process may hold: `bytes`, and `source`, where the figure comes from ("--max-memory",
    "the memory cgroup's limit", "physical memory", "the GPU's memory"); `shared_by` processes of one
    CPU machine divide it (1 elsewhere)."""

    bytes: int
    source: str
    shared_by: int = 1

    def describe(self) -> str:
        """'3.0 GiB of the memory cgroup's limit', '… per process (2 on this machine)' where shared."""
        share = f" per process ({self.shared_by} on this machine)" if self.shared_by > 1 else ""
        return f"{size_text(self.bytes)} of {self.source}{share}"


def device_budget(device: torch.device) -> Budget:
    """The device's memory and what bounds it: the GPU's total, or on the CPU the smaller of physical memory
    and the memory cgroup's limit (models/load.device_memory)."""
    have = load.device_memory(device)
    if device.type == "cuda":
        return Budget(have, "the GPU's memory")
    limit = load.cgroup_memory_limit()
    return Budget(have, "the memory cgroup's limit" if limit is not None and limit <= have else "physical memory")


def run_budget(config: Any, device: torch.device, processes: int = 1) -> Budget:
    """The budget of one process of a run (module docstring): `config.memory.max` where set, else the
    device's memory; on the CPU divided among the `processes` of this machine."""
    whole = (Budget(parse_size(config.memory.max), "--max-memory") if config.memory.max is not None
             else device_budget(device))
    share = max(1, processes) if device.type == "cpu" else 1
    return Budget(whole.bytes // share, whole.source, share)
