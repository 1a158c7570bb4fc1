"""SDPA against llmrl's CPU half-precision attention (`llmrl/models/attention.py`), whole model, side by side.

SmolLM2 (or any causal LM folder) with LoRA r=16 on q,k,v,o, in bfloat16 and float32, one model
instance per dtype switched between transformers' `sdpa`, its `eager`, and `llmrl_cpu_half` (which
falls through to SDPA in float32: an A/A pair, the noise floor) before each call (separate instances
differed by up to 15 % in float32 with the same kernel: where the weights lie matters), alternated in one process (each repetition starts one contender later). Timed: one decoding step of `--decode-rows` rows against a KV cache of
`--tokens` positions (half of the rows left-padded by 6), and one forward + backward over `--rows`
rows of `--tokens` tokens (half left-padded by 10). Medians of `--reps` after a warm-up; the logits
of each against float32 SDPA's (mean and max |Δ|, share of equal argmax over the decode rows).

    python bench/attention_cpu.py --model <SmolLM2 folder> --out bench/results-attention-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, DynamicCache

from llmrl.models.attention import NAME

IMPLS = ["sdpa", "eager", NAME]


def build(model_dir: str, dtype: torch.dtype, attn: str) -> Any:
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn)
    return get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--decode-rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=80)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    dec = torch.randint(0, 49152, (a.decode_rows, a.tokens), generator=g)
    dmask = torch.ones_like(dec)
    dmask[: a.decode_rows // 2, :6] = 0
    tr = torch.randint(0, 49152, (a.rows, a.tokens), generator=g)
    tmask = torch.ones_like(tr)
    tmask[: a.rows // 2, :10] = 0
    one = {dt: build(a.model, dt, "sdpa") for dt in (torch.float32, torch.bfloat16)}
    models = {(str(dt).removeprefix("torch."), im): one[dt] for dt in one for im in IMPLS}  # one instance per dtype

    def use(k: Any) -> Any:
        models[k].base_model.model.set_attn_implementation(k[1])
        return models[k]
    caches: dict[Any, DynamicCache] = {}
    for k, m in models.items():
        with torch.no_grad():
            caches[k] = use(k)(input_ids=dec[:, :-1], attention_mask=dmask[:, :-1], use_cache=True).past_key_values

    def decode_step(k: Any) -> torch.Tensor:
        with torch.no_grad():
            out = use(k)(input_ids=dec[:, -1:], attention_mask=dmask, cache=caches[k], use_cache=True).logits
        caches[k].crop(-1)  # the token just added removed: every timing decodes the same position
        return out[:, 0].float()

    def fwd_bwd(k: Any) -> None:
        logits = use(k)(input_ids=tr, attention_mask=tmask, use_cache=False).logits[:, :-1].float()
        (-torch.log_softmax(logits, -1).gather(-1, tr[:, 1:, None]).mean()).backward()
        models[k].zero_grad(set_to_none=True)

    logits = {k: decode_step(k) for k in models}
    for k in models:
        fwd_bwd(k)  # warm-up
    times: dict[Any, dict[str, list[float]]] = {k: {"decode_step_s": [], "fwd_bwd_s": []} for k in models}
    keys = list(models)
    for rep in range(a.reps):
        for k in keys[rep % len(keys):] + keys[: rep % len(keys)]:  # each rep starts one later: no seat favoured
            t0 = time.perf_counter()
            decode_step(k)
            t1 = time.perf_counter()
            fwd_bwd(k)
            times[k]["decode_step_s"].append(t1 - t0)
            times[k]["fwd_bwd_s"].append(time.perf_counter() - t1)
    ref = logits[("float32", "sdpa")]
    rows = []
    for k in models:
        med = {n: statistics.median(v) for n, v in times[k].items()}
        base = {n: statistics.median(v) for n, v in times[(k[0], "sdpa")].items()}
        diff = (logits[k] - ref).abs()
        row = {"dtype": k[0], "attention": k[1], **med,
               "decode_speedup_vs_sdpa": base["decode_step_s"] / med["decode_step_s"],
               "fwd_bwd_speedup_vs_sdpa": base["fwd_bwd_s"] / med["fwd_bwd_s"],
               "mean_abs_dlogit_vs_fp32_sdpa": diff.mean().item(), "max_abs_dlogit_vs_fp32_sdpa": diff.max().item(),
               "same_argmax_vs_fp32_sdpa": (logits[k].argmax(-1) == ref.argmax(-1)).float().mean().item()}
        rows.append(row)
        print(f"{k[0]:9} {k[1]:15} decode step {med['decode_step_s'] * 1e3:7.1f} ms ({row['decode_speedup_vs_sdpa']:.2f}x)"
              f"  fwd+bwd {med['fwd_bwd_s']:.3f} s ({row['fwd_bwd_speedup_vs_sdpa']:.2f}x)"
              f"  |dlogit| vs fp32 sdpa: mean {row['mean_abs_dlogit_vs_fp32_sdpa']:.3f} max {row['max_abs_dlogit_vs_fp32_sdpa']:.3f}"
              f"  argmax {row['same_argmax_vs_fp32_sdpa']:.3f}")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "")
    result = {"cpu": cpu, "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
              "torch": torch.__version__, "args": vars(a), "rows": rows,
              "times": {f"{k[0]}/{k[1]}": v for k, v in times.items()}}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
