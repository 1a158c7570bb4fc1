"""`model.dtype: auto` and `engine.dtype: auto`: the fastest weights dtype on this hardware.

    device (model.device)                  auto picks   why
    CUDA GPU with bfloat16 (Ampere or later) bfloat16    tensor cores run bf16 matmuls several times float32's rate
    CUDA GPU without bfloat16               float32
    CPU that reports amx_bf16 (Intel AMX)   bfloat16     AMX tiles: bf16 matmuls at several times float32's rate
    CPU with avx512_bf16, no AMX            float32      not reliably faster: on one 2-core AMD EPYC VM bf16 matmuls ran
                                                         0.5–0.8× float32's (the update 15× slower); on another the
                                                         SmolLM2 step ran 1.30× faster in bf16 but the tiny model's not
                                                         (docs/real-models.md, performance.md). Deciding needs a
                                                         microbenchmark on the model's own shapes: not built yet
    CPU without either                      float32      bf16 is emulated

The decision reads what the hardware reports (`/proc/cpuinfo` flags, torch.cuda.is_bf16_supported),
never a benchmark, so it is the same on every start of a machine; load_config writes the chosen
dtype into the Config, so a run's config.yaml names it and a resume keeps it on any machine.
The log-probabilities of the ratio are float32 whatever the weights (models/stack.tempered).
"""

from __future__ import annotations

from pathlib import Path

AUTO = "auto"


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (the first `flags` line of /proc/cpuinfo); empty where there is none."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.exists() else ""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def fastest_dtype(kind: str, flags: set[str] | None = None, cuda_bf16: bool | None = None) -> tuple[str, str]:
    """(dtype, reason) for a device of `kind` ('cpu' or 'cuda'): see the module's table.

    `flags` (the CPU's) and `cuda_bf16` (the GPU's bfloat16 support) are read from the machine when None."""
    if kind == "cuda":
        if cuda_bf16 is None:
            import torch

            cuda_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        if cuda_bf16:
            return "bfloat16", "the GPU computes bfloat16 on its tensor cores"
        return "float32", "the GPU has no bfloat16"
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "bfloat16", "the CPU has AMX (amx_bf16)"
    if "avx512_bf16" in flags:  # measured both ways on such CPUs (docs/performance.md): float32 is the safe side
        return "float32", "the CPU has avx512_bf16 but no AMX, where bfloat16 is faster for some models, slower for others"
    return "float32", "the CPU has no bfloat16 instructions (no AMX, no avx512_bf16)"


def dtype_note(dtype: str, kind: str, flags: set[str] | None = None, cuda_bf16: bool | None = None) -> str:
    """What the start-up table says next to the dtype: the reason when it is this hardware's fastest,
    else that another one is faster here (a dtype set by hand is kept, never changed)."""
    best, why = fastest_dtype(kind, flags, cuda_bf16)
    if dtype == best:
        return why
    return f"{best} is faster here: {why}"


def resolve(merged: dict, kind: str, default: str = AUTO) -> dict:
    """`merged` (dotted keys; model.dtype absent means `default`, the schema's) with model.dtype and
    engine.dtype 'auto' replaced by the fastest dtype for a device of `kind`."""
    out = {"model.dtype": default, **merged}
    for key in ("model.dtype", "engine.dtype"):
        if out.get(key) == AUTO:
            out[key] = fastest_dtype(kind)[0]
    return out
