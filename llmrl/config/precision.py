"""`model.dtype: auto` and `engine.dtype: auto`: the fastest weights dtype on this hardware.

    device (model.device)                  auto picks   why
    CUDA GPU with bfloat16 (Ampere or later) bfloat16    tensor cores run bf16 matmuls several times float32's rate
    CUDA GPU without bfloat16               float32
    CPU that reports amx_bf16 (Intel AMX)   bfloat16     AMX tiles: bf16 matmuls at several times float32's rate
                                                         (float32 for a model with hidden < 256: the tiny model's
                                                         default run was 1.48× slower in bf16 on a Xeon with AMX)
    CPU with avx512_bf16, no AMX            measured     bfloat16 where a one-off microbenchmark of the model's own
                                                         products ran ≥ 1.5× faster in it (config/dtype_probe.py,
                                                         cached per machine and model size), else float32: on one
                                                         2-core AMD EPYC VM bf16 matmuls ran 0.5–0.8× float32's; on
                                                         another the SmolLM2 step ran 1.30× faster in bf16 but the
                                                         tiny model's not (docs/performance.md). float32 when the
                                                         model's shapes are not known yet (a hub id never downloaded)
                                                         or it is small (hidden < 256: its step is not its products)
    CPU without either                      float32      bf16 is emulated

The decision reads what the hardware reports (`/proc/cpuinfo` flags, torch.cuda.is_bf16_supported)
and, on the one kind of CPU where that cannot say, the cached microbenchmark, so it is the same on
every start of a machine; load_config writes the chosen dtype into the Config, so a run's
config.yaml names it and a resume keeps it on any machine.
The log-probabilities of the ratio are float32 whatever the weights (models/stack.tempered).
`engine.dtype: auto` reads the same answer: torch's products, not the vLLM engine's own CPU kernels,
which no probe here times.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .model_defaults import device_kind

if TYPE_CHECKING:
    from .schema import Config

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


def fastest_dtype(kind: str, flags: set[str] | None = None, cuda_bf16: bool | None = None,
                  model: str | None = None, threads: int | None = None) -> tuple[str, str]:
    """(dtype, reason) for a device of `kind` ('cpu' or 'cuda'): see the module's table.

    `flags` (the CPU's) and `cuda_bf16` (the GPU's bfloat16 support) are read from the machine when None;
    `model` (model.name) and `threads` (the run's; None: torch's) size the microbenchmark."""
    if kind == "cuda":
        if cuda_bf16 is None:
            import torch

            cuda_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        if cuda_bf16:
            return "bfloat16", "the GPU computes bfloat16 on its tensor cores"
        return "float32", "the GPU has no bfloat16"
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        small = _small_hidden(model)
        if small is not None:
            return "float32", (f"a model this small (hidden size {small}) gains nothing from bfloat16, even with AMX: "
                               "its step is not its products (the tiny model's default run: 1.48× slower in bfloat16)")
        return "bfloat16", "the CPU has AMX (amx_bf16)"
    if "avx512_bf16" in flags:  # measured both ways on such CPUs (docs/performance.md): ask the model's shapes
        return _probed(flags, model, threads)
    return "float32", "the CPU has no bfloat16 instructions (no AMX, no avx512_bf16)"


def _small_hidden(model: str | None) -> int | None:
    """The hidden size of `model` where it is known and under dtype_probe.MIN_HIDDEN, else None."""
    from . import dtype_probe

    shapes = dtype_probe.model_shapes(model) if model else None
    return shapes[0] if shapes is not None and shapes[0] < dtype_probe.MIN_HIDDEN else None


def _probed(flags: set[str], model: str | None, threads: int | None) -> tuple[str, str]:
    """The avx512_bf16-without-AMX row of the table: the cached microbenchmark of `model`'s products."""
    from . import dtype_probe

    shapes = dtype_probe.model_shapes(model) if model else None
    if shapes is None:
        return "float32", ("the CPU has avx512_bf16 but no AMX, where bfloat16 is faster for some models, slower "
                           "for others, and this model's shapes are not known before it is loaded")
    if shapes[0] < dtype_probe.MIN_HIDDEN:
        return "float32", (f"a model this small (hidden size {shapes[0]}) gains nothing from bfloat16 on a CPU without "
                           "AMX: its step is not its products (the tiny model: 0.96× per step)")
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    speedup = dtype_probe.bf16_speedup(shapes, threads, flags)
    if speedup is None:
        return "float32", ("the CPU has avx512_bf16 but no AMX, and the microbenchmark that decides there has no "
                           "writable cache through which this run's processes could agree")
    where = f"on this CPU (avx512_bf16, no AMX; a cached microbenchmark, {threads} thread{'s' if threads != 1 else ''})"
    if speedup >= dtype_probe.FASTER:
        return "bfloat16", f"this model's products ran {speedup:.2f}× faster in bfloat16 {where}"
    return "float32", f"this model's products ran {speedup:.2f}× in bfloat16, under {dtype_probe.FASTER}×, {where}"


def dtype_note(dtype: str, kind: str, flags: set[str] | None = None, cuda_bf16: bool | None = None,
               model: str | None = None, threads: int | None = None) -> str:
    """What the start-up table says next to the dtype: the reason when it is this hardware's fastest,
    else that another one is faster here (a dtype set by hand is kept, never changed)."""
    best, why = fastest_dtype(kind, flags, cuda_bf16, model, threads)
    if dtype == best:
        return why
    return f"{best} is faster here: {why}"


def resolve(merged: dict, kind: str, default: str = AUTO, model: str | None = None) -> dict:
    """`merged` (dotted keys; model.dtype absent means `default`, model.name `model`, the schema's)
    with model.dtype and engine.dtype 'auto' replaced by the fastest dtype for a device of `kind`
    and the model (with the run's `threads`)."""
    out = {"model.dtype": default, **merged}
    name, threads = out.get("model.name", model), _threads(out.get("threads"))
    for key in ("model.dtype", "engine.dtype"):
        if out.get(key) == AUTO:
            out[key] = fastest_dtype(kind, model=None if name is None else str(name), threads=threads)[0]
    return out


def resolved(config: "Config") -> "Config":
    """`config` with model.dtype and engine.dtype 'auto' replaced as load_config replaces them (`resolve`):
    a Config built in Python (`train(Config(...))`) then names in its config.yaml the dtype it trained in,
    and an evaluation or a resume loads that one instead of resolving 'auto' again, maybe to another (a
    hub model not yet cached when the run started, another machine)."""
    dtypes = {"model.dtype": config.model.dtype, "engine.dtype": config.engine.dtype}
    if AUTO not in dtypes.values():
        return config
    out = resolve({**dtypes, "model.name": config.model.name, "threads": config.threads},
                  device_kind(config.model.device))
    return replace(config, model=replace(config.model, dtype=out["model.dtype"]),
                   engine=replace(config.engine, dtype=out["engine.dtype"]))


def _threads(value: object) -> int | None:
    """The run's `threads` as given (an int, or text from --set), None where it is not a valid count:
    torch's own then, and the schema's validation says what is wrong with it afterwards."""
    try:
        n = int(str(value))
    except ValueError:
        return None
    return n if 1 <= n <= 1024 else None
