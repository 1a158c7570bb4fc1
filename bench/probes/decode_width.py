"""What one more row costs a decoding step: ms per generated token position against batch width.

    python bench/probes/decode_width.py --model ~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-<hash> \
        [--rows 16,32,48,64] [--reps 3] [--threads 2] [--out bench/results/decode-width.json]

The model with LoRA r=16 on q,k,v,o (B initialised to small random values so the adapter is not a
no-op), a 50-token prompt per row, prefilled once with the KV cache, then `--tokens` greedy decoding
steps of one token per row, each one forward of (rows, 1) against the cache: the inner loop of the
`hf` engine (llmrl/engines/hf.py). The widths alternate inside every repetition, so a slow patch of
a shared CPU hits them all; reported: the median ms per decoding step for each width and its ratio
to the width 32 (4 prompts × 8 samples, the fast SmolLM2 recipe's batch). This is what
`rollout.oversample` relies on: where the skinny (rows × hidden) matmuls of a step run far below peak,
a wider first round costs much less than a second round (docs/algorithms.md, dynamic sampling).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, DynamicCache


def decode_ms(model: torch.nn.Module, rows: int, tokens: int, prompt_len: int, seed: int) -> float:
    """Median ms of one (rows, 1) decoding forward over `tokens` steps after a prefill."""
    ids = torch.randint(0, 40000, (rows, prompt_len), generator=torch.Generator().manual_seed(seed))
    attention = torch.ones(rows, prompt_len, dtype=torch.long)
    cache = DynamicCache()
    times = []
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True).logits
        for _ in range(tokens):
            token = logits[:, -1].argmax(-1)
            attention = torch.cat([attention, torch.ones(rows, 1, dtype=torch.long)], dim=1)
            started = time.perf_counter()
            logits = model(input_ids=token[:, None], attention_mask=attention, past_key_values=cache,
                           use_cache=True).logits
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def decode_bench_args(doc: str, rows: str, reps: int) -> argparse.Namespace:
    """The options both decoding benches take (this one and decode_kernels.py), parsed; threads set."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face causal LM folder")
    parser.add_argument("--rows", default=rows, help="batch widths, comma-separated")
    parser.add_argument("--tokens", type=int, default=20, help="decoding steps per measurement")
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    return args


def lora_model(path: str) -> torch.nn.Module:
    """The model in float32 with LoRA r=16 on q,k,v,o, B ~ N(0, 0.01²) so the adapter is not a no-op; eval mode."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                           LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.01)
    return model.eval()


def main() -> None:
    args = decode_bench_args(__doc__, "16,32,48,64", 3)
    model = lora_model(args.model)
    widths = [int(w) for w in args.rows.split(",")]
    decode_ms(model, widths[0], 3, 50, 0)  # warm-up
    runs: dict[int, list[float]] = {w: [] for w in widths}
    for rep in range(args.reps):
        for w in widths if rep % 2 == 0 else widths[::-1]:
            runs[w].append(decode_ms(model, w, args.tokens, 50, rep))
    base = statistics.median(runs[32]) if 32 in runs else None
    result = {"threads": args.threads, "tokens": args.tokens, "reps": args.reps, "ms_per_step": {}}
    for w in widths:
        ms = statistics.median(runs[w])
        ratio = ms / base if base else float("nan")
        result["ms_per_step"][str(w)] = {"median": round(ms, 1), "all": [round(x, 1) for x in runs[w]],
                                         "vs_32": round(ratio, 3)}
        print(f"rows {w:4d}: {ms:7.1f} ms per decoding step   ({ratio:.2f}x the 32-row step)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
