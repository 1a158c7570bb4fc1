"""What each role costs in memory, and the process's peak memory: the whole run's and each phase's."""

from __future__ import annotations

import resource
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ..models.quantized import stored_size
from ..models.stack import PolicyStack, of_adapter

ADAMW_STATES = 2  # exp_avg and exp_avg_sq, one float32 each per trainable parameter


@dataclass(frozen=True)
class RoleCost:
    role: str
    params: int
    bytes: int


def _size(params: list[torch.Tensor]) -> tuple[int, int]:
    """(elements, bytes) held by this process: a parameter sharded with FSDP2 counts its local shard, a
    4-bit weight the numbers of its matrix and the bytes of its codes and scales (models/quantized.py)."""
    sizes = [stored_size(p.to_local() if hasattr(p, "to_local") else p) for p in params]
    return sum(n for n, _ in sizes), sum(b for _, b in sizes)


def role_costs(stack: PolicyStack) -> list[RoleCost]:
    """Base (shared by all roles), each adapter, the value head and the AdamW state they need."""
    adapter_ids = {id(p) for role in ("actor", "critic") if role != "critic" or stack.has_critic
                   for p in stack.parameters_of(role)}
    reward = [p for n, p in stack.peft.named_parameters() if of_adapter(n, "reward")]
    adapter_ids |= {id(p) for p in reward}
    base = [p for p in stack.peft.parameters() if id(p) not in adapter_ids]
    roles = ("actor, critic, reference" if stack.has_critic else "actor, reference") + (", reward" if reward else "")
    rows = [RoleCost(f"base (frozen, shared by {roles})", *_size(base))]
    rows.append(RoleCost("actor LoRA adapter", *_size(stack.parameters_of("actor"))))
    trainable = _size(stack.parameters_of("actor"))[0]
    if stack.has_critic and stack.value_head is not None:
        head = list(stack.value_head.parameters())
        critic_lora = [p for p in stack.parameters_of("critic") if all(p is not h for h in head)]
        rows.append(RoleCost("critic LoRA adapter", *_size(critic_lora)))
        rows.append(RoleCost("value head", *_size(head)))
        trainable += _size(stack.parameters_of("critic"))[0]
    rows.append(RoleCost("reference (base, adapters off)", 0, 0))
    if stack.reward_head is not None:  # the fourth role: frozen, no optimizer state (models/scorer.py)
        rows.append(RoleCost("reward LoRA adapter + score head (frozen)", *_size(reward + [stack.reward_head.weight])))
    rows.append(RoleCost("AdamW state", ADAMW_STATES * trainable, ADAMW_STATES * trainable * 4))
    return rows


def engine_costs(engine: object) -> list[RoleCost]:
    """The generation engine's own memory: vLLM's copy of the weights and KV cache, the `hf` engine's
    merged actor while it generates (models/merged.py)."""
    memory = getattr(engine, "memory", None)
    return [RoleCost(*row) for row in memory()] if memory is not None else []


_earlier = {"rss_kib": 0, "cuda_bytes": 0}
"""The process's peaks before the last phase's restart (`restart_peaks`): the whole run's peak
(`peak_rss_mib`, `peak_device_mib`) is the larger of these and the current VmHWM / CUDA peak, so
restarting the peak at every phase loses nothing. `reset_peak_memory` clears them."""

HWM_SLACK_KIB = 4096
"""How far VmHWM may lie above VmRSS right after a restart for the restart to count as done: a kernel
(or sandbox) that ignores /proc/self/clear_refs leaves the old peak there."""


def _status_kib() -> dict[str, int]:
    """VmHWM (peak RSS since start or since the last restart) and VmRSS from /proc, in KiB; {} where
    /proc cannot be read (not Linux)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    found[line[:5]] = int(line.split()[1])
    except OSError:
        return {}
    return found


def _vm_hwm_kib() -> int | None:
    return _status_kib().get("VmHWM")


def _restart_hwm() -> bool:
    """VmHWM restarted at VmRSS (5 to /proc/self/clear_refs, Linux ≥ 4.0). True when it was: VmHWM
    read back within HWM_SLACK_KIB of VmRSS; False without permission, on another OS, or where the
    write is ignored."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    status = _status_kib()
    return "VmHWM" in status and "VmRSS" in status and status["VmHWM"] - status["VmRSS"] <= HWM_SLACK_KIB


def _cuda_on(device: str) -> bool:
    """Whether a run on `device` uses CUDA that is already started (never start CUDA for a CPU run)."""
    return device != "cpu" and torch.cuda.is_available() and torch.cuda.is_initialized()


def reset_peak_memory() -> None:
    """Start a new peak for the whole process: Linux's VmHWM (via /proc/self/clear_refs), torch's
    CUDA peak and the peaks kept across phases (`_earlier`).

    `llmrl compare` calls this before each run so that one process reports each run's own peak
    (memory the allocator kept from an earlier run still counts). Elsewhere a no-op.
    """
    _earlier.update(rss_kib=0, cuda_bytes=0)
    _restart_hwm()
    if _cuda_on("auto"):
        torch.cuda.reset_peak_memory_stats()


def restart_peaks(device: str = "auto") -> bool:
    """Start a phase's peak: fold the peaks so far into `_earlier` (the whole run's peak keeps them),
    then restart VmHWM and, for a run on CUDA, torch's peak. Returns whether VmHWM restarted."""
    hwm = _vm_hwm_kib()
    if hwm is not None:
        _earlier["rss_kib"] = max(_earlier["rss_kib"], hwm)
    if _cuda_on(device):
        _earlier["cuda_bytes"] = max(_earlier["cuda_bytes"], torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
    return _restart_hwm()


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB: max(VmHWM, the peaks before the phases'
    restarts) on Linux, else ru_maxrss (KiB on Linux, bytes on macOS)."""
    hwm = _vm_hwm_kib()
    if hwm is not None:
        return max(hwm, _earlier["rss_kib"]) / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def peak_device_mib(device: str = "auto") -> float | None:
    """Peak CUDA memory allocated by torch, in MiB, for a run whose `model.device` is `device` (across
    the phases' restarts); None for a CPU run (also on a machine with a GPU, where torch would report 0)
    or without CUDA."""
    if not _cuda_on(device):
        return None
    return max(torch.cuda.max_memory_allocated(), _earlier["cuda_bytes"]) / 2**20


class PhasePeaks:
    """The process's peak memory within each named phase of a run: `peak_rss_<phase>_mib` (VmHWM
    restarted at the phase's start, read at its end) and, on CUDA, `peak_cuda_<phase>_mib`
    (`torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`), in MiB.

    A phase run several times in a step (generation rounds) keeps its largest peak. `step` holds the
    current step's, `run` the whole run's maximum of each key. Where VmHWM cannot be restarted the RSS
    keys are absent, not wrong. Phases may nest: an inner restart folds the peak so far into the outer
    phase's. Every value is ≤ `peak_rss_mib()` (resp. `peak_device_mib`), which keeps every restarted peak.
    """

    def __init__(self, device: str = "auto") -> None:
        self.device = device
        self.step: dict[str, float] = {}
        self.run: dict[str, float] = {}
        self._open: list[dict[str, Any]] = []  # the phases running now, innermost last

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        for frame in self._open:  # the restart below forgets the peak so far: the open phases keep it
            frame["rss"] = max(frame["rss"], _vm_hwm_kib() or 0)
            frame["cuda"] = max(frame["cuda"], torch.cuda.max_memory_allocated() if _cuda_on(self.device) else 0)
        frame = {"rss": 0, "cuda": 0, "restarted": restart_peaks(self.device)}
        self._open.append(frame)
        try:
            yield
        finally:
            self._open.remove(frame)
            if frame["restarted"]:
                self._keep(f"peak_rss_{phase}_mib", max(frame["rss"], _vm_hwm_kib() or 0) / 1024)
            if _cuda_on(self.device):
                self._keep(f"peak_cuda_{phase}_mib", max(frame["cuda"], torch.cuda.max_memory_allocated()) / 2**20)

    def _keep(self, key: str, mib: float) -> None:
        self.step[key] = max(self.step.get(key, 0.0), mib)
        self.run[key] = max(self.run.get(key, 0.0), mib)

    def start_step(self) -> None:
        """A new step's row begins (what was measured since the last row, a checkpoint, stays in `run`)."""
        self.step = {}
