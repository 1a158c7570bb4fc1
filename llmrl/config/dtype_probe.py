"""Is bfloat16 faster than float32 for this model on this CPU? A one-off microbenchmark, cached.

A CPU with `avx512_bf16` but no AMX runs bfloat16 matmuls at 0.5× float32's on one VM and 2.3× on
another, and on one machine faster for SmolLM2-135M (H = 576) but slower for the tiny model (H = 64)
(docs/performance.md): its flags cannot say. `bf16_speedup` times the products a step of the model
runs, in both dtypes, with the run's threads:

    rows n ∈ {64 (a decoding step), 512 (a training micro-batch)}
    (n × H)·(H × H), (n × H)·(H × I), (n × I)·(I × H), (n × H)·(H × V)

every size capped at `CAP` (16384), each the best of `REPEATS` timings (a timing repeats the product
for ≥ 5 ms), the two dtypes alternated shape by shape, and returns
Σ t_float32 / Σ t_bfloat16 (the products weighted by their cost, as in a step). `model.dtype: auto`
picks bfloat16 when that is ≥ `FASTER` (1.5: what the products gain, a whole step gains less).

The result is cached in `<cache>/dtype-probe/<key>.json` (`config.cache.cache_root`), the key naming the
CPU model, its flags, torch's version, the threads, the shapes and the method's `VERSION`: the probe
(a few seconds for a 135 M model) runs once per machine and model size, under a file lock so that
the processes of a `--nproc` run wait for one measurement and all read it, and every later start of
the same machine reads the same decision. The shapes come from the model's own config (`model_shapes`): the built-in tiny
models', a folder's config.json, a .gguf file's cached copy or else its metadata, a hub model in the
local cache; a model whose shapes are not known yet (a hub id never downloaded) gets no probe.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

from .cache import cache_root, cached_copy_dir, catalog_dir
from .model_defaults import MODEL_DEFAULTS, TINY_SHAPES

ROWS = (64, 512)
REPEATS = 5
TIMING_S = 0.005  # each timing repeats a product until it lasts about this long
CAP = 16384  # the largest size timed (`_capped`)
MIN_HIDDEN = 256
"""Below this hidden size no probe runs (float32): the tiny model's (64) products measured 0.92-1.52×
in bfloat16 from probe to probe and thread count to thread count, straddling any margin, while its
whole default run was 0.96× per step; a step of so small a model is not its products."""
VERSION = 2  # of the measurement: part of the cache key, so a changed method measures again
_MEMO: dict[str, float] = {}  # this process's decisions: the same answer on every call
FASTER = 1.5
"""bfloat16 is picked when its products run at least this much faster. A step is more than its products:
on the 2-core EPYC VM, SmolLM2's products ran 2.3-2.7× faster in bfloat16 and its step 1.30×; the tiny
model's products 0.92-1.29× (five probes) and its whole default run 0.96× (3 seeds). Below 1.5× the
products' gain does not survive the rest of the step."""


def _text_config(raw: dict[str, Any]) -> dict[str, Any]:
    return raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw


def _from_config(raw: dict[str, Any]) -> tuple[int, int, int] | None:
    cfg = _text_config(raw)
    try:
        h, v = int(cfg["hidden_size"]), int(cfg["vocab_size"])
        return h, int(cfg.get("intermediate_size") or 4 * h), v
    except (KeyError, TypeError, ValueError):
        return None


def model_shapes(name: str) -> tuple[int, int, int] | None:
    """(hidden H, intermediate I, vocabulary V) of the model `name` from its config, or None when
    it cannot be read without building or downloading the model (or `name` is no model at all: the
    run's own checks say so later, in one sentence)."""
    try:
        return _shapes(name)
    except (OSError, ValueError, RuntimeError):  # a name too long for a path, `~nobody/…`
        return None


def _shapes(name: str) -> tuple[int, int, int] | None:
    if name in MODEL_DEFAULTS:  # the built-in tiny models: one architecture, the char tokenizer
        return TINY_SHAPES
    path = Path(name).expanduser()
    if not path.exists() and (catalog_dir(name) / "config.json").is_file():  # `llmrl models get NAME`
        path = catalog_dir(name)
    if path.suffix == ".gguf" and path.is_file():
        copy = cached_copy_dir(path)
        path = copy if (copy / "config.json").is_file() else path
        if path.suffix == ".gguf":
            return _gguf_shapes(path)
    if path.is_dir():
        try:
            return _from_config(json.loads((path / "config.json").read_text()))
        except (OSError, ValueError):
            return None
    try:  # a hub id already in the local cache
        from transformers import AutoConfig

        return _from_config(AutoConfig.from_pretrained(name, local_files_only=True).to_dict())
    except Exception:  # noqa: BLE001 - any failure means: not known here
        return None


def _gguf_shapes(path: Path) -> tuple[int, int, int] | None:
    """(H, I, V) from a .gguf file's metadata (`<arch>.embedding_length`, `.feed_forward_length`, the
    tokenizer's token list), or None when the file does not say."""
    try:
        from gguf import GGUFReader

        fields = GGUFReader(path).fields

        def value(key: str) -> Any:
            field = fields[key]
            return field.parts[field.data[0]]

        arch = bytes(value("general.architecture")).decode()
        hidden, inner = int(value(f"{arch}.embedding_length")[0]), int(value(f"{arch}.feed_forward_length")[0])
        return hidden, inner, len(fields["tokenizer.ggml.tokens"].data)
    except Exception:  # noqa: BLE001 - an unreadable or unusual file: the shapes are not known
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _key(shapes: tuple[int, int, int], threads: int, flags: set[str]) -> str:
    import torch

    text = "|".join([str(VERSION), _cpu_model(), " ".join(sorted(flags)), torch.__version__, str(threads), repr(shapes),
                     repr(ROWS), str(CAP)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _products(shapes: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    h, i, v = shapes
    return [(n, k, m) for n in ROWS for k, m in ((h, h), (h, i), (i, h), (h, v))]


def _calls(x: Any, y: Any) -> int:
    """How many products of x·y make one timing last ≥ `TIMING_S` (a tiny model's take microseconds,
    too short for the clock and the scheduler's noise: measured 0.92× and 1.18× a minute apart)."""
    import torch

    torch.mm(x, y)  # warm: the first call of a shape and dtype picks and builds its kernel
    started = time.perf_counter()
    torch.mm(x, y)
    return max(1, min(10_000, math.ceil(TIMING_S / max(time.perf_counter() - started, 1e-7))))


def measure(shapes: tuple[int, int, int], threads: int) -> dict[str, float]:
    """{'float32_s': Σ best times, 'bfloat16_s': …, 'speedup': their ratio} of `_products(shapes)`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    total = {torch.float32: 0.0, torch.bfloat16: 0.0}
    try:
        gen = torch.Generator().manual_seed(0)
        for n, k, m in _products(shapes):
            a, b = torch.randn(n, k, generator=gen), torch.randn(k, m, generator=gen)
            pairs = {dt: (a.to(dt), b.to(dt)) for dt in total}
            calls = _calls(*pairs[torch.float32])
            best = {dt: float("inf") for dt in total}
            for _ in range(REPEATS):
                for dt, (x, y) in pairs.items():  # alternated: a slow moment hits both dtypes
                    started = time.perf_counter()
                    for _ in range(calls):
                        torch.mm(x, y)
                    best[dt] = min(best[dt], (time.perf_counter() - started) / calls)
            for dt in total:
                total[dt] += best[dt]
    finally:
        torch.set_num_threads(before)
    f32, bf16 = total[torch.float32], total[torch.bfloat16]
    return {"float32_s": f32, "bfloat16_s": bf16, "speedup": f32 / bf16}


def _read(path: Path) -> float | None:
    try:
        return float(json.loads(path.read_text())["speedup"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def bf16_speedup(shapes: tuple[int, int, int], threads: int, flags: set[str], root: Path | None = None) -> float | None:
    """float32's time over bfloat16's on this model's products here: cached, else measured and cached.

    The processes of one machine agree: the first measures while holding `<key>.lock`, the others wait
    for it and read its file (a `--nproc` run's ranks all resolve `auto` at once). Where the cache
    cannot be written: measured for this process alone under one process, None (no decision) when
    the run has several, which could then measure differently."""
    key = _key(shapes, threads, flags)
    if key in _MEMO:
        return _MEMO[key]
    try:
        folder = (root or cache_root()) / "dtype-probe"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{key}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            speedup = _read(folder / f"{key}.json")
            if speedup is None:
                speedup = _measure_into(folder / f"{key}.json", shapes, threads)
    except (OSError, RuntimeError):  # no home, a read-only cache: no file to agree through
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return None
        speedup = measure(_capped(shapes), threads)["speedup"]
    _MEMO[key] = speedup
    return speedup


def _measure_into(path: Path, shapes: tuple[int, int, int], threads: int) -> float:
    result = {**measure(_capped(shapes), threads), "cpu": _cpu_model(), "threads": threads, "shapes": list(shapes),
              "version": VERSION}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)  # atomic: a reader without the lock sees the old file or this one, never half of it
    return float(result["speedup"])


def _capped(shapes: tuple[int, int, int]) -> tuple[int, int, int]:
    """The shapes with every size ≤ `CAP`: a 7 B model's 152 k-token head would take a minute and 4 GB
    to time; 16 k columns run at the rate of more."""
    return min(shapes[0], CAP), min(shapes[1], CAP), min(shapes[2], CAP)
