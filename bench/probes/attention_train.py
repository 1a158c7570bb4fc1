"""One layer's attention in a training forward and backward on the CPU: bfloat16 SDPA against SDPA on
float32 copies of the bfloat16 q, k, v (the output cast back; tried for `model.attention: auto` on
2026-12-04 and not kept: docs/performance.md, "The update on the whole batch") and a float32 model's
SDPA, alternated.

SmolLM2's grouping (9 query heads on 3 key/value heads, head size 64), `--rows` rows: the update's
shape (20 response queries on 70 keys, a boolean mask, as with a shared prompt prefix) and a whole
sequence's (70 queries on 70 keys, with and without a mask). Per contender the median ms of one
forward + backward (`--reps` rounds of 10 calls, the contenders' order fixed within a round), and the
same without a graph (a no-grad forward: a prefill, the π_old forward).

    python bench/probes/attention_train.py [--rows 16] [--threads 2] [--out bench/results/attention-train.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.rg_screen import cpu_name  # noqa: E402


class Layer(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def float32_copies(module, query, key, value, mask, **kwargs):
    """SDPA on float32 copies of q, k, v; the output cast back to the query's dtype."""
    out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), mask, **kwargs)
    return out.to(query.dtype), weights


CONTENDERS = {"bfloat16 SDPA": (torch.bfloat16, sdpa_attention_forward),
              "bfloat16 on float32 copies": (torch.bfloat16, float32_copies),
              "float32 SDPA": (torch.float32, sdpa_attention_forward)}


def one_call_ms(fn, q0, k0, v0, mask, dtype: torch.dtype, grad: bool, calls: int = 10) -> float:
    layer = Layer()
    q, k, v = (x.to(dtype, copy=True).requires_grad_(grad) for x in (q0, k0, v0))
    t0 = time.perf_counter()
    with torch.set_grad_enabled(grad):
        for _ in range(calls):
            out, _ = fn(layer, q, k, v, mask, scaling=0.125, is_causal=True)
            if grad:
                out.float().sum().backward()
    return (time.perf_counter() - t0) / calls * 1e3


def positive(text: str) -> int:
    """argparse type: a whole number ≥ 1 (argparse turns the ValueError into one usage line)."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=positive, default=16)
    ap.add_argument("--threads", type=positive, default=2)
    ap.add_argument("--reps", type=positive, default=5)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    results = []
    for n_q, n_k, masked in ((20, 70, True), (70, 70, False), (70, 70, True)):
        q0 = torch.randn(a.rows, 9, n_q, 64, generator=g)
        k0, v0 = (torch.randn(a.rows, 3, n_k, 64, generator=g) for _ in range(2))
        mask = torch.ones(a.rows, 1, n_q, n_k, dtype=torch.bool).tril(n_k - n_q) if masked else None
        for grad in (True, False):
            times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
            for _ in range(a.reps + 1):  # the first round warms up
                for name, (dtype, fn) in CONTENDERS.items():
                    times[name].append(one_call_ms(fn, q0, k0, v0, mask, dtype, grad))
            med = {name: round(statistics.median(t[1:]), 3) for name, t in times.items()}
            row = {"queries": n_q, "keys": n_k, "mask": masked, "backward": grad, "ms": med,
                   "speedup_copies_over_bf16_sdpa": round(med["bfloat16 SDPA"] / med["bfloat16 on float32 copies"], 2)}
            results.append(row)
            print(f"{n_q:>3} queries on {n_k} keys, mask {masked!s:<5} {'forward + backward' if grad else 'no-grad forward':<18} "
                  + "  ".join(f"{k} {v} ms" for k, v in med.items()) + f"  → {row['speedup_copies_over_bf16_sdpa']}x")
    out = {"cpu": cpu_name(), "torch": torch.__version__, "rows": a.rows, "threads": a.threads, "results": results}
    if a.out:
        try:
            a.out.write_text(json.dumps(out, indent=1) + "\n")
        except OSError as exc:
            raise SystemExit(f"attention_train.py: cannot write {a.out}: {exc.strerror}.") from None


if __name__ == "__main__":
    main()
