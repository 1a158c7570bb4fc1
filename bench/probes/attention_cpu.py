"""The `hf` engine's generation with `model.attention` 'sdpa' against 'auto' (llmrl/models/attention.py).

A PolicyStack on the model (LoRA r=16 on q,k,v,o, B ~ N(0, 0.01²)), one instance per dtype, switched
between the two settings before each generate, alternated (the order swapped every repetition).
`--rows` sampled rows (8 prompts of 50 tokens × rows/8 samples, the stop id one the model never draws,
so every row decodes `--tokens` tokens), in two batches: unpadded (every prompt 50 tokens: the
decoding steps carry no mask) and padded (prompt i left-padded by 3·i mod 12 positions: a mask).
Reported: the median seconds of one `HFEngine.generate` per dtype × batch × setting, the speed-up of
'auto', and whether the sampled tokens are the same.

    python bench/probes/attention_cpu.py --model <SmolLM2 folder> --out bench/results/attention-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: `bench.common`
from bench.common import lora_stack, random_request  # noqa: E402

from llmrl.engines.base import GenerationRequest  # noqa: E402
from llmrl.engines.hf import HFEngine  # noqa: E402
from llmrl.models.attention import set_attention  # noqa: E402

SETTINGS = ("sdpa", "auto")


def request(vocab: int, rows: int, tokens: int, rep: int, padded: bool) -> GenerationRequest:
    r = random_request(vocab, rows, tokens, rep)
    if not padded:
        return r
    mask = r.prompt_mask.clone()
    for i in range(mask.shape[0]):
        mask[i, : (3 * i) % 12] = False
    return GenerationRequest(r.prompt_ids, mask, r.num_samples, r.settings, r.keys, logprobs=r.logprobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    for dtype in a.dtypes.split(","):
        stack = lora_stack(a.model, getattr(torch, dtype), ["q_proj", "k_proj", "v_proj", "o_proj"])
        vocab = stack.lm.config.vocab_size
        engine = HFEngine(stack, [vocab + 7], 0, merge=False)
        engine.generate(random_request(vocab, 8, 4, 99))  # warm-up
        for padded in (False, True):
            seconds: dict[str, list[float]] = {s: [] for s in SETTINGS}
            same = True
            for rep in range(a.reps):
                out = {}
                for setting in SETTINGS if rep % 2 == 0 else SETTINGS[::-1]:
                    set_attention(stack.lm, setting)
                    started = time.perf_counter()
                    out[setting] = engine.generate(request(vocab, a.rows, a.tokens, rep, padded))
                    seconds[setting].append(time.perf_counter() - started)
                same = same and torch.equal(out["sdpa"].response_ids, out["auto"].response_ids)
            med = {s: statistics.median(v) for s, v in seconds.items()}
            row = {"dtype": dtype, "batch": "padded" if padded else "unpadded", "median_s": med,
                   "speedup_auto": med["sdpa"] / med["auto"], "same_tokens": same, "all_s": seconds}
            rows.append(row)
            print(f"{dtype:9} {row['batch']:9} sdpa {med['sdpa']:.2f} s  auto {med['auto']:.2f} s  "
                  f"({row['speedup_auto']:.2f}x)  same tokens: {same}", flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "")
    result = {"cpu": cpu, "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
              "torch": torch.__version__, "args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
