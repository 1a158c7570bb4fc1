"""How close a step is to the machine: each phase's FLOP/s against the measured peak matmul rate, and
generation against the memory-bandwidth bound (issue 29).

    python bench/roofline.py [--recipe recipes/smollm2-135m-fast.yaml] [--steps 3] [--dtypes float32,bfloat16] \
        [--set KEY=VALUE ...] [--check] [--profile] [--out OUT.json]

Without --recipe it measures the built-in default (`llmrl train` with no arguments: tiny, PPO).
With `--set rollout.engine=vllm` (run by `.venv-vllm/bin/python`) generation happens in vLLM, which no
hook of ours sees: its FLOPs are counted from the shapes (`count_engine`).

**The machine's limits**, measured here, in this process, with the run's threads:
- peak matmul rate per dtype: torch.mm on the step's own shapes ((rows·T) × H @ H × H, @ H × I, and a
  decoding step's rows × H @ H × H, @ H × I, @ H × V) and on a 2048³ square, best of 3 interleaved passes of 5 each;
  the best GFLOP/s of them is the peak (bfloat16 only where the CPU reports avx512_bf16 or amx_bf16,
  or on CUDA). On the 2-core VM the float32 peak (then best of 5) came out 121-161 GFLOP/s in three
  processes a minute apart, so a % of peak carries that spread;
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

**The batch**: the recipe's, with `rollout.filter_groups` off unless `--set` turns it on, so every step
updates on all B·G rows (the fast recipe's filter keeps 1-5 of its 8 groups a step: an update of 8-40
rows, whose rate is not the one of the issue's "batch ≥ 32 rows"; with it on the table gives the
update's mean rows).

**Per phase**, over the steps after the first (a warm-up): seconds and GFLOP per step (the metrics
row's `time_<phase>_s`; GFLOP/s = their totals' ratio), % of the dtype's peak, and for generation the bandwidth bound:
decoding steps × bytes of every weight the step reads (base + LoRA + head) / bandwidth, against the
phase's seconds; and against the best rate its own decoding-step shapes reach alone (rows × H by
H × H, H × I, H × V): a skinny product of 64 rows does not reach a square one's rate on a CPU.
**Useful work** (issue 58): the hooks count what the engine computed, finished rows included where they
stay in the batch; beside it generation's answer tokens alone (inside the response masks) per second,
their FLOP/s (2 · P_lin each, no prefill) as a % of the peak, and useful_frac = those tokens / (rows ×
decoding steps).
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
        self.useful = 0  # generated tokens inside the response masks (count_engine)
        self.slots = 0  # rows × decoding steps of the engine's batches
        self.p_lin = 0  # Σ in·out of the base's linear layers and the LM head: 2 · p_lin FLOPs a token

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
            with original(clock_self, phase), torch.profiler.record_function(f"phase:{phase}"):
                yield
        finally:
            self.phase = None


def op_shares(prof: torch.profiler.profile, top: int = 8) -> dict[str, list[dict]]:
    """Per phase of a profiled step: the ops that took most of its CPU time (self time of every op under
    the phase's `phase:<name>` range, so nothing is counted twice), as ms and share of the phase."""
    shares: dict[str, list[dict]] = {}
    for event in prof.events():
        if not event.name.startswith("phase:"):
            continue
        acc: dict[str, float] = {}
        stack = list(event.cpu_children)
        while stack:
            child = stack.pop()
            stack.extend(child.cpu_children)
            acc[child.name] = acc.get(child.name, 0.0) + child.self_cpu_time_total
        total = event.cpu_time_total or 1.0
        ranked = sorted(acc.items(), key=lambda kv: -kv[1])[:top]
        shares[event.name[6:]] = [{"op": k, "ms": round(v / 1e3, 1), "share": round(v / total, 3)} for k, v in ranked]
    return shares


def count_engine(meter: FlopMeter, engine, lm: torch.nn.Module, prefix_caching: bool) -> None:
    """Every engine: the generated tokens inside the response masks (`useful`) and the rows × decoding
    steps of its batches (`slots`), which give the useful-work figures (`summarise`). An engine with its
    own weights (vLLM) runs no module of ours, so no hook sees its generation: count its FLOPs from the
    shapes instead, 2 · P_lin FLOPs per processed token, where P_lin = Σ in·out over the base's linear
    layers and the LM head (the merged weights the engine holds), and the processed tokens are every
    generated token plus the prompts' prefill (each distinct prompt once when the G samples share it
    through the prefix cache, else G times); the decoding steps are the longest response's length."""
    own = getattr(engine, "own_weights", False)
    meter.p_lin = sum(m.in_features * m.out_features for name, m in lm.named_modules()
                      if isinstance(m, torch.nn.Linear) and "lora_" not in name)
    plain = engine.generate

    def generate(request):
        gen = plain(request)
        if meter.phase == "generate":
            meter.useful += int(gen.response_mask.sum())
            meter.slots += gen.response_mask.numel()
            if own:
                prefill = int(request.prompt_mask.sum()) * (1 if prefix_caching else request.num_samples)
                tokens = prefill + int(gen.response_mask.sum())
                meter.flops["generate"] = meter.flops.get("generate", 0.0) + 2.0 * meter.p_lin * tokens
                meter.decode_steps += gen.response_ids.shape[1]
        return gen

    engine.generate = generate


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


def peak_gflops(shapes: list[tuple[int, int, int]], dtype: torch.dtype, device: str, rounds: int = 3) -> dict[str, float]:
    """Best GFLOP/s per shape over `rounds` passes over all the shapes (each pass `timed_mm`'s best of 5),
    interleaved so that a slow patch of a shared VM costs one pass, not one shape; the peak is the best."""
    rates: dict[str, float] = {}
    for _ in range(rounds):
        for m, k, n in shapes:
            key = f"{m}x{k}x{n}"
            rates[key] = max(rates.get(key, 0.0), timed_mm(m, k, n, dtype, device))
    rates["peak"] = max(rates.values())
    return rates


def bf16_available(device: str) -> bool:
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool({"avx512_bf16", "amx_bf16"} & precision.cpu_flags())


def measure(recipe: str | None, dtype: str, steps: int, sets: list[str], check: bool, profile: bool = False) -> dict:
    """One configuration: its steps' phase seconds and FLOPs, and the machine's peak on its shapes."""
    # every group trained on (no dynamic-sampling drops) unless --set says otherwise: the update then
    # runs on the whole batch each step, the "batch ≥ 32 rows", not on the 1-5 groups a
    # filtered step of the fast recipe keeps
    overrides = {"out": tempfile.mkdtemp(prefix="roofline-"), "model.dtype": dtype, "eval.size": 0,
                 "checkpoint.every": 0, "log.completions_every": 0, "rollout.filter_groups": False}
    config = load_config(recipe, overrides=overrides, sets=sets)
    s = setup(config, NullReporter(), overwrite=True)
    lm = s.stack.lm
    meter = FlopMeter()
    attach(meter, s.stack.peft, lm.get_output_embeddings())
    if s.stack.value_head is not None:
        s.stack.value_head.register_forward_hook(meter.hook)
    count_engine(meter, s.engine, lm, config.engine.prefix_caching)
    plain = one_step.PhaseClock.__call__  # a context manager per phase; the bench only reads its label
    one_step.PhaseClock.__call__ = lambda clock_self, phase: meter.clock(plain, clock_self, phase)
    rows, profiled = [], None
    try:
        for step in range(steps):
            meter.flops, meter.decode_steps, meter.useful, meter.slots = {}, 0, 0, 0
            if profile and step == steps - 1:  # the last step under the profiler: its ops, not its seconds
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    one_step.train_step(s, step)
                profiled = op_shares(prof)
                break
            row = one_step.train_step(s, step)
            kept = row.get("groups_kept")  # logged under rollout.filter_groups
            rows.append({"seconds": {p: row[f"time_{p}_s"] for p in PHASES}, "gflop": {p: meter.flops.get(p, 0.0) / 1e9 for p in PHASES},
                         "decode_steps": meter.decode_steps, "step_s": row["step_time_s"],
                         "useful_tokens": meter.useful, "slots": meter.slots, "p_lin": meter.p_lin,
                         "update_rows": int(kept * config.rollout.num_generations) if kept is not None else None})
    finally:
        one_step.PhaseClock.__call__ = plain
    text = lm.config.get_text_config()
    hidden, inter, vocab = text.hidden_size, getattr(text, "intermediate_size", 4 * text.hidden_size), text.vocab_size
    r = config.rollout
    n_rows = (r.prompts_per_step + r.oversample) * r.num_generations
    tokens = n_rows * (r.max_new_tokens + 32)
    device = "cuda" if lm.device.type == "cuda" else "cpu"
    tdtype = lm.dtype
    decode = [(n_rows, hidden, hidden), (n_rows, hidden, inter), (n_rows, hidden, vocab)]  # one decoding step's
    shapes = [(tokens, hidden, hidden), (tokens, hidden, inter), *decode, (2048, 2048, 2048)]
    weight_bytes = sum(p.numel() * p.element_size() for p in s.stack.peft.parameters())
    out = {"recipe": recipe or "(the built-in default)", "dtype": dtype, "model": config.model.name, "rows": n_rows,
           "engine": config.rollout.engine,
           "max_new_tokens": r.max_new_tokens, "threads": torch.get_num_threads(), "steps": rows,
           "peak_gflops": peak_gflops(shapes, tdtype, device), "bandwidth_gbs": bandwidth_gbs(device),
           "weight_bytes": weight_bytes, "decode_shapes": [f"{m}x{k}x{n}" for m, k, n in decode]}
    if profiled is not None:
        out["profile"] = profiled
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
    """Per phase, over the steps after the first: total GFLOP / total seconds (a step's rows vary with
    the groups `rollout.filter_groups` drops, so per-step medians of each would not pair up), the mean
    seconds and GFLOP per step, % of peak; for generation also the bandwidth bound and the rate of its
    own decoding-step shapes."""
    counted = m["steps"][1:] or m["steps"]
    peak, bw, n = m["peak_gflops"]["peak"], m["bandwidth_gbs"], len(counted)
    table = []
    for p in PHASES:
        sec = sum(r["seconds"][p] for r in counted)
        gf = sum(r["gflop"][p] for r in counted)
        rate = gf / sec if sec > 1e-3 else None
        row = {"phase": p, "seconds": round(sec / n, 3), "gflop": round(gf / n, 2),
               "gflops": round(rate, 1) if rate else None, "pct_peak": round(100 * rate / peak, 1) if rate else None}
        if p == "generate" and rate:
            steps = sum(r["decode_steps"] for r in counted)
            bound = steps * m["weight_bytes"] / (bw * 1e9)
            alone = max(m["peak_gflops"][k] for k in m["decode_shapes"])  # its matmuls alone, at its width
            row.update(decode_steps=steps / n, bandwidth_bound_s=round(bound / n, 3), pct_bandwidth=round(100 * bound / sec, 1),
                       decode_shape_gflops=round(alone, 1), pct_decode_shapes=round(100 * rate / alone, 1))
            useful, slots = sum(r["useful_tokens"] for r in counted), sum(r["slots"] for r in counted)
            useful_rate = 2.0 * counted[0]["p_lin"] * useful / sec / 1e9  # the FLOP/s of the answers' tokens alone
            row.update(useful_frac=round(useful / slots, 3) if slots else None, useful_tok_s=round(useful / sec, 1),
                       useful_gflops=round(useful_rate, 1), pct_peak_useful=round(100 * useful_rate / peak, 1))
        if p == "update" and all(r.get("update_rows") is not None for r in counted):
            row["update_rows"] = sum(r["update_rows"] for r in counted) / n  # fewer than the batch: groups dropped
        table.append(row)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,bfloat16", help="bfloat16 is skipped where the hardware has none")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--check", action="store_true", help="compare the FLOP count with torch.utils.flop_counter once")
    ap.add_argument("--profile", action="store_true",
                    help="one more step under torch.profiler: the ops that take each phase's time (not timed)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    results = {"cpu": cpu_name(), "torch": torch.__version__, "runs": []}
    for dtype in a.dtypes.split(","):
        device = "cuda" if any(x.startswith("model.device=cuda") for x in a.set) else "cpu"
        if dtype == "bfloat16" and not bf16_available(device):
            print("bfloat16: this hardware has none; skipped")
            continue
        m = measure(a.recipe, dtype, a.steps + a.profile, a.set, a.check, a.profile)
        m["table"] = summarise(m)
        results["runs"].append(m)
        print(f"\n{m['recipe']} · {m['model']} · {m['engine']} engine · {dtype} · {m['rows']} rows · peak {m['peak_gflops']['peak']:.0f} GFLOP/s · "
              f"bandwidth {m['bandwidth_gbs']:.1f} GB/s" + (f" · check {m['check']}" if "check" in m else ""))
        for row in m["table"]:
            extra = (f"  bandwidth bound {row['bandwidth_bound_s']} s = {row['pct_bandwidth']} % of the phase; "
                     f"{row['pct_decode_shapes']} % of its own matmul shapes alone ({row['decode_shape_gflops']} GFLOP/s)"
                     + f"; useful work: {row['useful_tok_s']} answer tokens/s, {row['useful_gflops']} GFLOP/s = "
                     f"{row['pct_peak_useful']} % of peak (useful_frac {row['useful_frac']})"
                     if "bandwidth_bound_s" in row else "")
            if "update_rows" in row:
                extra = f"  on {row['update_rows']:.0f} rows a step (rollout.filter_groups dropped the rest)"
            print(f"  {row['phase']:<9} {row['seconds']:>8} s {row['gflop']:>9} GFLOP {row['gflops']} GFLOP/s "
                  f"{row['pct_peak']} % of peak{extra}")
        for phase, ops in m.get("profile", {}).items():
            print(f"  profile {phase}: " + ", ".join(f"{o['op']} {100 * o['share']:.0f} %" for o in ops[:5]))
        if a.out:
            Path(a.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
