"""What each role costs in memory, and the process's peak memory."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

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


def _vm_hwm_kib() -> int | None:
    """VmHWM (peak RSS since start or since the last `reset_peak_memory`) from /proc, in KiB."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_memory() -> None:
    """Start a new peak: Linux's VmHWM (via /proc/self/clear_refs) and torch's CUDA peak.

    `llmrl compare` calls this before each run so that one process reports each run's own peak
    (memory the allocator kept from an earlier run still counts). Elsewhere a no-op.
    """
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # never start CUDA for a CPU run
        torch.cuda.reset_peak_memory_stats()


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB: VmHWM on Linux (resettable), else ru_maxrss
    (KiB on Linux, bytes on macOS)."""
    hwm = _vm_hwm_kib()
    if hwm is not None:
        return hwm / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def peak_device_mib(device: str = "auto") -> float | None:
    """Peak CUDA memory allocated by torch, in MiB, for a run whose `model.device` is `device`; None
    for a CPU run (also on a machine with a GPU, where torch would report 0) or without CUDA."""
    if device == "cpu" or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.max_memory_allocated() / 2**20
