"""Decoding through prepacked weights (llmrl/models/packed.py, `engine.pack_weights`) against the plain
linear layers, on the CPU.

Two measurements, each alternating its two contenders (the order swapped every repetition):
1. `products`: one decoding step's products alone — every linear layer of a SmolLM2-shaped model (30 ×
   q, k, v, o, gate, up, down and the LM head: H 576, I 1536, V 49152; random weights, 270 MB in
   bfloat16, so they are read cold from memory as in decoding) at `--rows` rows, `F.linear` on the
   stored weight against `torch.ops.mkldnn._linear_pointwise` on a packed copy; per dtype × rows × threads.
2. `generate` (with --model): one `HFEngine.generate` of `--gen-rows` rows × `--tokens` tokens on the real
   model (LoRA r=16 on q,k,v,o, B ~ N(0, 0.01²)) with `pack=False` and `pack=True`, per dtype, with the
   actor merged where it merges (float32); whether the sampled tokens are the same.

    python bench/probes/packed_decode.py --model <SmolLM2 folder> --out bench/results/packed-decode.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: `bench.common`
from bench.common import lora_stack, random_request  # noqa: E402

from llmrl.engines.hf import HFEngine  # noqa: E402

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # (out, in)
SHAPES = LAYER * 30 + [(49152, 576)]


def products(dtype: torch.dtype, rows: int, reps: int) -> dict[str, float]:
    """Median seconds of one pass over SHAPES at `rows` rows, plain and packed, alternated."""
    weights = [torch.randn(*s).to(dtype) for s in SHAPES]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
    x = {k: torch.randn(rows, k).to(dtype) for k in (576, 1536)}
    runs = {"plain": lambda: [F.linear(x[w.shape[1]], w) for w in weights],
            "packed": lambda: [torch.ops.mkldnn._linear_pointwise(x[w.shape[1]], p, None, "none", [], "")
                               for w, p in zip(weights, packed)]}
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(reps + 1):
        for name in list(runs) if rep % 2 == 0 else list(runs)[::-1]:
            started = time.perf_counter()
            runs[name]()
            if rep:  # the first pass of each is a warm-up
                seconds[name].append(time.perf_counter() - started)
    return {k: statistics.median(v) for k, v in seconds.items()}


def generations(model: str, dtype: torch.dtype, rows: int, tokens: int, reps: int) -> dict:
    stack = lora_stack(model, dtype, ["q_proj", "k_proj", "v_proj", "o_proj"])
    vocab = stack.lm.config.vocab_size
    engines = {"plain": HFEngine(stack, [vocab + 7], 0, pack=False), "packed": HFEngine(stack, [vocab + 7], 0, pack=True)}
    engines["plain"].generate(random_request(vocab, 8, 4, 99))  # warm-up
    seconds: dict[str, list[float]] = {k: [] for k in engines}
    same = True
    for rep in range(reps):
        out = {}
        for name in list(engines) if rep % 2 == 0 else list(engines)[::-1]:
            started = time.perf_counter()
            out[name] = engines[name].generate(random_request(vocab, rows, tokens, rep))
            seconds[name].append(time.perf_counter() - started)
        same = same and torch.equal(out["plain"].response_ids, out["packed"].response_ids)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    return {"median_s": med, "speedup": med["plain"] / med["packed"], "same_tokens": same, "all_s": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a SmolLM2 folder: also time whole generations on it")
    ap.add_argument("--rows", default="8,64", help="rows of the products timing")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gen-rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--gen-threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    result: dict = {"products": [], "generate": []}
    for threads in map(int, a.threads.split(",")):
        torch.set_num_threads(threads)
        for rows in map(int, a.rows.split(",")):
            for dtype in a.dtypes.split(","):
                med = products(getattr(torch, dtype), rows, a.reps)
                row = {"threads": threads, "rows": rows, "dtype": dtype, "median_s": med, "speedup": med["plain"] / med["packed"]}
                result["products"].append(row)
                print(f"products  {threads} thread(s) {rows:3} rows {dtype:9} plain {med['plain'] * 1e3:6.1f} ms  "
                      f"packed {med['packed'] * 1e3:6.1f} ms  ({row['speedup']:.2f}x)", flush=True)
    if a.model:
        torch.set_num_threads(a.gen_threads)
        for dtype in a.dtypes.split(","):
            row = {"dtype": dtype, "rows": a.gen_rows, "tokens": a.tokens, "threads": a.gen_threads,
                   **generations(a.model, getattr(torch, dtype), a.gen_rows, a.tokens, a.reps)}
            result["generate"].append(row)
            med = row["median_s"]
            print(f"generate  {dtype:9} plain {med['plain']:.2f} s  packed {med['packed']:.2f} s  ({row['speedup']:.2f}x)  "
                  f"same tokens: {row['same_tokens']}", flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "")
    result.update({"cpu": cpu, "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
                   "torch": torch.__version__, "args": {k: str(v) for k, v in vars(a).items()}})
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
