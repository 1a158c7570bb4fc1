"""The `hf` engine's generation with the actor's LoRA merged in (llmrl/models/merged.py) against
decoding through the adapters, side by side.

    python bench/probes/merged_decode.py --model ~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-<hash> \
        [--rows 64] [--tokens 64] [--reps 4] [--threads 2] [--dtype float32] [--out bench/results/merged-decode.json]

A PolicyStack on the model with LoRA r=16 on q,k,v,o (the SmolLM2 recipes'), the actor's B ~ N(0, 0.01²)
so the adapter is not a no-op. `--rows` sampled rows (8 prompts of ~50 tokens × rows/8 samples, each
row's own random stream as in a run), `--tokens` new tokens each: the stop id is one the model never
draws, so every row decodes the whole budget and both contenders do the same work. Two contenders,
alternated inside every repetition: `adapters` (engine.merge_lora=false) and `merged` (the default;
a bfloat16 actor does not merge, so `--dtype bfloat16` compares the adapters' path with itself).
Reported: the median seconds of one whole `HFEngine.generate` of each (merging W′ included), their
ratio, the share of tokens both drew alike and the largest |Δ log-prob| over the tokens both drew.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `python bench/probes/merged_decode.py` from anywhere
from bench.common import lora_stack, random_request  # noqa: E402
from llmrl.engines.hf import HFEngine  # noqa: E402
from llmrl.models.merged import mergeable  # noqa: E402


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face causal LM folder")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def main() -> None:
    args = _args()
    stack = lora_stack(args.model, getattr(torch, args.dtype), args.targets.split(","))
    vocab = stack.lm.config.vocab_size
    if not mergeable(stack):
        print(f"note: a {args.dtype} actor does not merge (llmrl/models/merged.py): both contenders decode "
              "through the adapters", flush=True)
    engines = {name: HFEngine(stack, [vocab + 7], 0, merge=(name == "merged")) for name in ("adapters", "merged")}
    engines["merged"].generate(random_request(vocab, 8, 4, 99))  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    same, total, worst = 0, 0, 0.0
    for rep in range(args.reps):
        out = {}
        for name in engines if rep % 2 == 0 else list(engines)[::-1]:
            started = time.perf_counter()
            out[name] = engines[name].generate(random_request(vocab, args.rows, args.tokens, rep))
            seconds[name].append(time.perf_counter() - started)
        a, m = out["adapters"], out["merged"]
        alike = a.response_ids == m.response_ids
        same, total = same + int(alike.sum()), total + alike.numel()
        first_diff = (~alike).int().cumsum(-1) == 0  # positions before a row's first different token
        if bool(first_diff.any()):
            worst = max(worst, float((a.logprobs - m.logprobs)[first_diff].abs().max()))
        print(f"rep {rep}: " + "  ".join(f"{k} {v[-1]:.2f} s" for k, v in seconds.items()), flush=True)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    result = {"model": args.model, "dtype": args.dtype, "rows": args.rows, "tokens": args.tokens, "reps": args.reps,
              "threads": args.threads, "targets": args.targets, "median_s": {k: round(v, 3) for k, v in med.items()},
              "speedup": round(med["adapters"] / med["merged"], 3), "tokens_alike": round(same / total, 5),
              "max_abs_dlogprob_before_first_difference": worst,
              "all_s": {k: [round(x, 3) for x in v] for k, v in seconds.items()}}
    print(f"adapters {med['adapters']:.2f} s  merged {med['merged']:.2f} s per generate "
          f"({result['speedup']:.2f}x); tokens alike {same}/{total}; max |dlp| {worst:.2e}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
