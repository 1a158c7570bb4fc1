"""Where a bfloat16 LoRA step's time goes: peft's float32 adapter path against adapters computed in bfloat16.

peft keeps LoRA weights in float32 on a bfloat16 base and, in every adapted layer, casts the input to
float32, runs A and B in float32 and adds the bfloat16 base output to the float32 LoRA output (a
float32 (N, out) sum) before casting back. On a CPU whose bfloat16 products run 2-3x faster than its
float32 ones that adapter path is a growing share of a step. Contenders, alternated in one process:

  float32       the whole model in float32 (the reference)
  bf16-peft     bfloat16 base, float32 LoRA: peft's default path
  bf16-autocast bfloat16 base, float32 LoRA master weights, the adapter's products in bfloat16
                (torch.autocast on the CPU + peft's input cast disabled): mixed precision

Timed: one forward + backward of the LoRA'd model over `--rows` rows of `--tokens` tokens (the update's
shape; loss = mean log-prob of the next token, like the policy term), and one decoding step of `--decode-rows`
rows against a `--tokens` KV cache (generation's shape). Medians of `--reps` after a warm-up. The
models are transformers' own with SDPA and an unpadded batch, so every bfloat16 decoding step here
takes SDPA's slow `enable_gqa` kernel (llmrl/models/attention.py): the contenders compare alike.

    python bench/probes/bf16_lora.py --model <SmolLM2 folder> --rows 16 --tokens 64 --decode-rows 64 --reps 5 \
        --out bench/results/bf16-lora.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
from peft import LoraConfig, get_peft_model
from peft.helpers import disable_input_dtype_casting
from transformers import AutoModelForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def build(model_dir: str, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    peft = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS))
    for n, p in peft.named_parameters():  # B ≠ 0, so the adapter's output is not zero
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.02)
    return peft


def mode(peft: torch.nn.Module, name: str) -> contextlib.AbstractContextManager:
    if name != "bf16-autocast":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(disable_input_dtype_casting(peft))
    stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
    return stack


def fwd_bwd(peft: torch.nn.Module, ids: torch.Tensor, name: str) -> float:
    """One forward + backward; returns the loss (so the work is not optimised away)."""
    with mode(peft, name):
        logits = peft(input_ids=ids, use_cache=False).logits[:, :-1].float()
        loss = -torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).mean()
    loss.backward()
    peft.zero_grad(set_to_none=True)
    return float(loss.detach())


@torch.no_grad()
def decode_step(peft: torch.nn.Module, ids: torch.Tensor, cache: Any, name: str) -> None:
    with mode(peft, name):
        peft(input_ids=ids[:, -1:], cache=cache, use_cache=True)
    cache.crop(-1)  # the token just added removed: every timing decodes the same position


def prefill(peft: torch.nn.Module, ids: torch.Tensor, name: str) -> Any:
    with torch.no_grad(), mode(peft, name):
        return peft(input_ids=ids[:, :-1], use_cache=True).past_key_values


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--decode-rows", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    models = {"float32": build(a.model, torch.float32), "bf16-peft": build(a.model, torch.bfloat16)}
    models["bf16-autocast"] = models["bf16-peft"]
    vocab = models["float32"].config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (a.rows, a.tokens), generator=g)
    dec_ids = torch.randint(0, vocab, (a.decode_rows, a.tokens), generator=g)
    caches = {n: prefill(m, dec_ids, n) for n, m in models.items()}
    update: dict[str, list[float]] = {n: [] for n in models}
    decode: dict[str, list[float]] = {n: [] for n in models}
    losses = {n: fwd_bwd(m, ids, n) for n, m in models.items()}  # warm-up
    for _ in range(a.reps):
        for n, m in models.items():
            update[n].append(timed(lambda: fwd_bwd(m, ids, n)))
            decode[n].append(timed(lambda: decode_step(m, dec_ids, caches[n], n)))
    med = {n: {"update_s": statistics.median(update[n]), "decode_step_s": statistics.median(decode[n])} for n in models}
    ref = med["bf16-peft"]
    for n, r in med.items():
        r["update_speedup_vs_bf16_peft"] = ref["update_s"] / r["update_s"]
        r["decode_speedup_vs_bf16_peft"] = ref["decode_step_s"] / r["decode_step_s"]
        print(f"{n:<14} update {r['update_s']:.3f} s ({r['update_speedup_vs_bf16_peft']:.2f}x)   "
              f"decode step {r['decode_step_s'] * 1000:.1f} ms ({r['decode_speedup_vs_bf16_peft']:.2f}x)   loss {losses[n]:.4f}")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    result = {"cpu": cpu, "torch": torch.__version__, "args": vars(a), "median": med, "losses": losses,
              "update_s": update, "decode_step_s": decode}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
