"""The `hf` engine's skinny LM head (llmrl/models/decoding.py), side by side with the plain path.

    python bench/probes/decode_kernels.py --model ~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-<hash> \
        [--rows 32,100] [--reps 4] [--threads 2] [--out bench/results/decode-kernels.json]

The model with LoRA r=16 on q,k,v,o as in bench/probes/decode_width.py, a 50-token prompt per row,
prefilled, then `--tokens` greedy (rows, 1) decoding forwards. Two contenders, alternated inside
every repetition (a slow patch of a shared CPU hits both): `plain` (the LM head as x · Wᵀ) and
`llmrl` (`skinny_head`), both on transformers' DynamicCache (until 2026-12-06 `llmrl` also had a KV
cache with reserved room, deleted after bench/decode_tweaks.py: docs/history.md). Reported per width: the
median ms per decoding step of each, their ratio, and whether the two produced bit-identical
logits at every step.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time

import torch
from decode_width import decode_bench_args, lora_model  # bench/ is on sys.path when run as a script
from transformers import DynamicCache

from llmrl.models.decoding import skinny_head


def decode(model: torch.nn.Module, rows: int, tokens: int, fast: bool, seed: int) -> tuple[float, torch.Tensor]:
    """Median ms of one (rows, 1) decoding forward, and the (tokens, rows, V) logits."""
    ids = torch.randint(0, 40000, (rows, 50), generator=torch.Generator().manual_seed(seed))
    attention = torch.ones(rows, 50, dtype=torch.long)
    cache = DynamicCache()
    times, seen = [], []
    with torch.no_grad(), (skinny_head(model) if fast else contextlib.nullcontext()):
        logits = model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True).logits
        for _ in range(tokens):
            seen.append(logits[:, -1])
            attention = torch.cat([attention, torch.ones(rows, 1, dtype=torch.long)], dim=1)
            started = time.perf_counter()
            logits = model(input_ids=logits[:, -1].argmax(-1)[:, None], attention_mask=attention,
                           past_key_values=cache, use_cache=True).logits
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times), torch.stack(seen)


def main() -> None:
    args = decode_bench_args(__doc__, "32,100", 4)
    model = lora_model(args.model)
    decode(model, 8, 3, True, 0)  # warm-up
    result: dict = {"threads": args.threads, "tokens": args.tokens, "reps": args.reps, "rows": {}}
    for w in [int(x) for x in args.rows.split(",")]:
        runs: dict[str, list[float]] = {"plain": [], "llmrl": []}
        identical = True
        for rep in range(args.reps):
            order = (False, True) if rep % 2 == 0 else (True, False)
            out = {fast: decode(model, w, args.tokens, fast, rep) for fast in order}
            runs["plain"].append(out[False][0])
            runs["llmrl"].append(out[True][0])
            identical &= torch.equal(out[False][1], out[True][1])
        plain, fast = statistics.median(runs["plain"]), statistics.median(runs["llmrl"])
        result["rows"][str(w)] = {"plain_ms": round(plain, 1), "llmrl_ms": round(fast, 1),
                                  "speedup": round(plain / fast, 3), "bit_identical_logits": identical,
                                  "all": {k: [round(x, 1) for x in v] for k, v in runs.items()}}
        print(f"rows {w:4d}: plain {plain:6.1f} ms  llmrl {fast:6.1f} ms per decoding step"
              f"  ({plain / fast:.2f}x)  logits bit-identical: {identical}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
