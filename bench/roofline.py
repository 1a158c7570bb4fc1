"""How close a step is to the machine: each phase's FLOP/s against the measured peak matmul rate, and
generation against the memory-bandwidth bound (issue 29).

    python bench/roofline.py [--recipe recipes/smollm2-135m-fast.yaml] [--steps 3] [--dtypes float32,bfloat16] \
        [--set KEY=VALUE ...] [--out bench/results-roofline.json]

Without --recipe it measures the built-in default (`llmrl train` with no arguments: tiny, PPO).

**The machine's limits**, measured here, in this process, with the run's threads:
- peak matmul rate per dtype: torch.mm on the step's own shapes ((rows·T) × H @ H × H, @ H × I, a
  decoding step's rows × H @ H × V) and on a 2048³ square; the best GFLOP/s of them is the peak
  (bfloat16 only where the CPU reports avx512_bf16 or amx_bf16, or on CUDA);
- memory bandwidth: copying a 512 MiB float32 tensor (2 × 512 MiB moved), best of 5.

**A real step's FLOPs**, counted from the model's shape: a forward hook on every nn.Linear (the
base's layers, the LoRA A and B, the LM head, the value head) adds, for an input of n rows of
`in` features,

    forward   2 · n · in · out
    backward  2 · n · in · out for dX (when the input needs a gradient) + 2 · n · in · out for dW
              (when the weight is trained: LoRA, value head), counted when the forward ran with grad

to the phase running at the time (run/one_step.PhaseClock, whose label the bench reads; nothing in
the step changes). Attention's QKᵀ and AV (4 · layers · H · context per token, ≈ 3 % of a SmolLM2
token's linear FLOPs at 130 positions) and elementwise work are not counted, so FLOP/s is a slight
underestimate; `--check` compares the hook count with torch.utils.flop_counter on one forward.

**Per phase**, medians over the steps after the first (a warm-up): seconds (the metrics row's
`time_<phase>_s`), GFLOP, GFLOP/s, % of the dtype's peak, and for generation the bandwidth bound:
decoding steps × bytes of every weight the step reads (base + LoRA + head) / bandwidth, against the
phase's seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.rg_screen import cpu_name  # noqa: E402
from llmrl import load_config  # noqa: E402
from llmrl.config import precision  # noqa: E402
from llmrl.run import one_step  # noqa: E402
from llmrl.run.reporting import NullReporter  # noqa: E402
from llmrl.run.session import setup  # noqa: E402

PHASES = ("generate", "forward", "update")


class FlopMeter:
    """Linear-layer FLOPs per phase, from forward hooks (see the module docstring)."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.flops: dict[str, float] = {}
        self.decode_steps = 0  # forwards of the LM head on one position per row during generation

    def hook(self, module: torch.nn.Linear, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        if self.phase is None:
            return
        x = inputs[0]
        n = x.numel() // x.shape[-1]
        one = 2.0 * n * module.in_features * module.out_features
        total = one
        if torch.is_grad_enabled():
            total += one * (x.requires_grad + module.weight.requires_grad)
        self.flops[self.phase] = self.flops.get(self.phase, 0.0) + total

    def head_hook(self, _module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        if self.phase == "generate" and inputs[0].dim() == 3 and inputs[0].shape[1] == 1:
            self.decode_steps += 1

    @contextmanager
    def clock(self, original, clock_self, phase: str) -> Iterator[None]:
        self.phase = phase
        try:
            with original(clock_self, phase):
                yield
        finally:
            self.phase = None


def attach(meter: FlopMeter, model: torch.nn.Module, head: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(meter.hook)
    head.register_forward_hook(meter.head_hook)


def timed_mm(m: int, k: int, n: int, dtype: torch.dtype, device: str, reps: int = 5) -> float:
    """Best GFLOP/s of (m × k) @ (k × n) over `reps` after a warm-up."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        torch.mm(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2.0 * m * k * n / best / 1e9


def bandwidth_gbs(device: str, mib: int = 512, reps: int = 5) -> float:
    """Best GB/s of copying a `mib` MiB float32 tensor (read + write counted)."""
    src = torch.ones(mib * 2**18, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best / 1e9


def peak_gflops(shapes: list[tuple[int, int, int]], dtype: torch.dtype, device: str) -> dict[str, float]:
    rates = {f"{m}x{k}x{n}": timed_mm(m, k, n, dtype, device) for m, k, n in shapes}
    rates["peak"] = max(rates.values())
    return rates


def bf16_available(device: str) -> bool:
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool({"avx512_bf16", "amx_bf16"} & precision.cpu_flags())


def measure(recipe: str | None, dtype: str, steps: int, sets: list[str], check: bool) -> dict:
    """One configuration: its steps' phase seconds and FLOPs, and the machine's peak on its shapes."""
    overrides = {"out": tempfile.mkdtemp(prefix="roofline-"), "model.dtype": dtype, "eval.size": 0,
                 "checkpoint.every": 0, "log.completions_every": 0}
    config = load_config(recipe, overrides=overrides, sets=sets)
    s = setup(config, NullReporter(), overwrite=True)
    lm = s.stack.lm
    meter = FlopMeter()
    attach(meter, s.stack.peft, lm.get_output_embeddings())
    if s.stack.value_head is not None:
        s.stack.value_head.register_forward_hook(meter.hook)
    plain = one_step.PhaseClock.__call__  # a context manager per phase; the bench only reads its label
    one_step.PhaseClock.__call__ = lambda clock_self, phase: meter.clock(plain, clock_self, phase)
    rows = []
    try:
        for step in range(steps):
            meter.flops, meter.decode_steps = {}, 0
            row = one_step.train_step(s, step)
            rows.append({"seconds": {p: row[f"time_{p}_s"] for p in PHASES}, "gflop": {p: meter.flops.get(p, 0.0) / 1e9 for p in PHASES},
                         "decode_steps": meter.decode_steps, "step_s": row["step_time_s"]})
    finally:
        one_step.PhaseClock.__call__ = plain
    text = lm.config.get_text_config()
    hidden, inter, vocab = text.hidden_size, getattr(text, "intermediate_size", 4 * text.hidden_size), text.vocab_size
    r = config.rollout
    n_rows = (r.prompts_per_step + r.oversample) * r.num_generations
    tokens = n_rows * (r.max_new_tokens + 32)
    device = "cuda" if lm.device.type == "cuda" else "cpu"
    tdtype = lm.dtype
    shapes = [(tokens, hidden, hidden), (tokens, hidden, inter), (n_rows, hidden, vocab), (2048, 2048, 2048)]
    weight_bytes = sum(p.numel() * p.element_size() for p in s.stack.peft.parameters())
    out = {"recipe": recipe or "(the built-in default)", "dtype": dtype, "model": config.model.name, "rows": n_rows,
           "max_new_tokens": r.max_new_tokens, "threads": torch.get_num_threads(), "steps": rows,
           "peak_gflops": peak_gflops(shapes, tdtype, device), "bandwidth_gbs": bandwidth_gbs(device),
           "weight_bytes": weight_bytes}
    if check:
        out["check"] = flop_check(s, meter)
    return out


def flop_check(s, meter: FlopMeter) -> dict:
    """torch.utils.flop_counter against the hook count on one no-grad forward of a (8, 64) batch."""
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(0, s.stack.lm.config.get_text_config().vocab_size, (8, 64), device=s.stack.lm.device)
    meter.phase, meter.flops = "check", {}
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        s.stack.lm(input_ids=ids)
    meter.phase = None
    return {"hooks_gflop": meter.flops.get("check", 0.0) / 1e9, "flop_counter_gflop": counter.get_total_flops() / 1e9}


def summarise(m: dict) -> list[dict]:
    """Per phase: median s, GFLOP, GFLOP/s, % of peak; generation's bandwidth bound."""
    counted = m["steps"][1:] or m["steps"]
    peak, bw = m["peak_gflops"]["peak"], m["bandwidth_gbs"]
    table = []
    for p in PHASES:
        sec = statistics.median(r["seconds"][p] for r in counted)
        gf = statistics.median(r["gflop"][p] for r in counted)
        row = {"phase": p, "seconds": round(sec, 3), "gflop": round(gf, 2), "gflops": round(gf / sec, 1) if sec else None,
               "pct_peak": round(100 * gf / sec / peak, 1) if sec else None}
        if p == "generate":
            steps = statistics.median(r["decode_steps"] for r in counted)
            bound = steps * m["weight_bytes"] / (bw * 1e9)
            row.update(decode_steps=steps, bandwidth_bound_s=round(bound, 3), pct_bandwidth=round(100 * bound / sec, 1) if sec else None)
        table.append(row)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,bfloat16", help="bfloat16 is skipped where the hardware has none")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--check", action="store_true", help="compare the FLOP count with torch.utils.flop_counter once")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    results = {"cpu": cpu_name(), "torch": torch.__version__, "runs": []}
    for dtype in a.dtypes.split(","):
        device = "cuda" if any(x.startswith("model.device=cuda") for x in a.set) else "cpu"
        if dtype == "bfloat16" and not bf16_available(device):
            print("bfloat16: this hardware has none; skipped")
            continue
        m = measure(a.recipe, dtype, a.steps, a.set, a.check)
        m["table"] = summarise(m)
        results["runs"].append(m)
        print(f"\n{m['recipe']} · {m['model']} · {dtype} · {m['rows']} rows · peak {m['peak_gflops']['peak']:.0f} GFLOP/s · "
              f"bandwidth {m['bandwidth_gbs']:.1f} GB/s" + (f" · check {m['check']}" if "check" in m else ""))
        for row in m["table"]:
            extra = (f"  bandwidth bound {row['bandwidth_bound_s']} s = {row['pct_bandwidth']} % of the phase"
                     if "bandwidth_bound_s" in row else "")
            print(f"  {row['phase']:<9} {row['seconds']:>8} s {row['gflop']:>9} GFLOP {row['gflops']} GFLOP/s "
                  f"{row['pct_peak']} % of peak{extra}")
        if a.out:
            Path(a.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
