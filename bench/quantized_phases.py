"""Seconds of each phase of a step on a 4-bit base against the float base, on identical work (issue 56).

    python bench/quantized_phases.py --model qwen2.5-coder-0.5b-instruct --reps 2 \\
        --out bench/results/quantized-phases-qwen0.5b.json

Whole `llmrl train` commands (bench/memory_settings.py) sample different tokens under each base, so
their steps differ in length as well as in kernels. Here both stacks (actor and critic LoRA r = 16 on
q/k/v/o, the run defaults' LoRA) get the same work, alternated, in one process:

    generate   64 rows (8 prompts × 8) × 64 new tokens, every row to the limit (no stop id), the
               actor's decoding as the hf engine runs it by default (merged + packed copies; on the
               4-bit base made from deq(W_q)); contender "nf4-lean": both copies off, every product on
               the 4-bit layers
    forward    no-grad log-probs of those 64 sequences as actor and as reference (the forward phase)
    update     gradient forward + backward of the actor's log-probs over all 64 rows in 2 minibatches of 32
               (the GRPO step's update pass); contender "nf4-micro8": each minibatch in micro-batches of 8
               rows (`update.micro_batch_size=8`), "nf4-ckpt": the layers checkpointed
               (`update.activation_checkpointing=true`) — the two settings that bring the step's peak under
               4 GiB (docs/quantized.md)
    generate_no_lora  (with --no-lora) the generate phase as the reference (adapters off): on the 4-bit base,
               what decoding from a merged actor re-quantized after each update would cost (the same 4-bit
               products, no LoRA products), not counted in the step

Per contender and phase: the median seconds over --reps (the first call of each is a warm-up, not
counted), and the ratio to the float base's.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rg_screen import cpu_name  # noqa: E402

from llmrl.config.schema import LoraConfig, ModelConfig  # noqa: E402
from llmrl.engines.base import GenerationRequest, SamplingSettings  # noqa: E402
from llmrl.engines.hf import hf_engine  # noqa: E402
from llmrl.models.load import load_base  # noqa: E402
from llmrl.models.sequences import layout  # noqa: E402
from llmrl.models.stack import PolicyStack  # noqa: E402

LORA = LoraConfig(r=16, alpha=32.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def prompts(tokenizer, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n chat prompts 'What is a+b?' through the model's template, left-padded: (n, P) ids and mask."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {3 * i + 1}+{7 * i + 2}?"}],
                                           tokenize=False, add_generation_prompt=True) for i in range(n)]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"].bool()


CONTENDERS = {  # name: (4-bit base, engine copies, micro-batch rows, checkpointing)
    "float": (False, True, None, False),
    "nf4": (True, True, None, False),
    "nf4-lean": (True, False, None, False),
    "nf4-micro8": (True, True, 8, False),
    "nf4-ckpt": (True, True, None, True),
}


def contender(model: str, dtype: str, quantize: str, ckpt: bool) -> tuple[PolicyStack, object, object]:
    base, tokenizer = load_base(ModelConfig(name=model, dtype=dtype, quantize=quantize), show_progress=False)
    stack = PolicyStack(base, LORA, with_critic=True, activation_checkpointing=ckpt)
    with torch.no_grad():  # a trained-looking actor: B ≠ 0, the same draw for both bases
        gen = torch.Generator().manual_seed(0)
        for name, p in stack.peft.named_parameters():
            if "lora_B.actor" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 1e-3)
    engine = hf_engine(stack=stack, tokenizer=tokenizer)
    engine.stop_ids = [-1]  # no row stops: every row decodes to the limit, the same work for both
    return stack, engine, tokenizer


def update(stack: PolicyStack, seq, response: torch.Tensor, mask: torch.Tensor, minibatch: int,
           micro: int | None) -> None:
    """The update pass: per minibatch of rows, the mean log-prob's gradient, in micro-batches of `micro`
    rows (each micro-batch's loss weighted by its share of the minibatch's tokens, as update.py does)."""
    for lo in range(0, seq.ids.shape[0], minibatch):
        hi = min(lo + minibatch, seq.ids.shape[0])
        total = mask[lo:hi].sum()
        for a in range(lo, hi, micro or hi - lo):
            b = min(a + (micro or hi - lo), hi)
            part = type(seq)(seq.ids[a:b], seq.attention[a:b], seq.positions[a:b], seq.prompt_len)
            lp, _ = stack.response_stats(part, response[a:b], mask[a:b], 1.0)
            (-(lp * mask[a:b]).sum() / total).backward()
        stack.zero_grad(set_to_none=True)


def phases(stack: PolicyStack, engine, ids: torch.Tensor, mask: torch.Tensor, tokens: int, micro: int | None,
           no_lora: bool) -> tuple[dict, torch.Tensor]:
    """Seconds of generate, forward and update on this stack; the generated tokens."""
    out = {}
    keys = torch.arange(ids.shape[0] * 8)
    request = GenerationRequest(ids, mask, 8, SamplingSettings(max_new_tokens=tokens), keys=keys, logprobs=True)
    t = time.perf_counter()
    gen = engine.generate(request)
    out["generate"] = time.perf_counter() - t
    if no_lora:
        t = time.perf_counter()  # the same decoding without the adapters: what a merged, re-quantized actor would cost
        engine.generate(GenerationRequest(ids, mask, 8, SamplingSettings(max_new_tokens=tokens), keys=keys,
                                          role="reference"))
        out["generate_no_lora"] = time.perf_counter() - t
    seq = layout(ids.repeat_interleave(8, 0), mask.repeat_interleave(8, 0).long(), gen.response_ids, gen.response_mask.long())
    t = time.perf_counter()
    with torch.no_grad():
        for role in ("actor", "reference"):
            with stack.use(role):
                stack.response_stats(seq, gen.response_ids, gen.response_mask, 1.0)
    out["forward"] = time.perf_counter() - t
    t = time.perf_counter()
    with stack.use("actor"):
        update(stack, seq, gen.response_ids, gen.response_mask, seq.ids.shape[0] // 2, micro)
    out["update"] = time.perf_counter() - t
    return out, gen.response_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quantize", default="nf4", help="the 4-bit type of the contenders named nf4*")
    ap.add_argument("--only", default="float,nf4,nf4-lean", help=f"comma-separated, of {', '.join(CONTENDERS)}")
    ap.add_argument("--no-lora", action="store_true", help="also time the generate phase as the reference")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    names = a.only.split(",")
    if unknown := [n for n in names if n not in CONTENDERS]:
        ap.error(f"unknown contender {', '.join(unknown)}; choose from {', '.join(CONTENDERS)}")
    stacks = {}
    for n in names:
        four_bit, copies, _, ckpt = CONTENDERS[n]
        stacks[n] = contender(a.model, a.dtype, a.quantize if four_bit else "none", ckpt)
        if not copies:  # engine.merge_lora=false, engine.pack_weights=false: decode on the 4-bit layers
            stacks[n][1].merge = stacks[n][1].pack = False
    ids, mask = prompts(stacks[names[0]][2], 8)
    times: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(a.reps + 1):  # rep 0: the warm-up
        for n in (list(names) if rep % 2 == 0 else list(names)[::-1]):
            stack, engine, _ = stacks[n]
            got, _ = phases(stack, engine, ids, mask, a.tokens, CONTENDERS[n][2], a.no_lora)
            if rep:
                times[n].append(got)
            print(f"rep {rep} {n:6s} " + "  ".join(f"{k} {v:6.2f} s" for k, v in got.items()), flush=True)
    table = {n: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for n, rows in times.items()}
    for n, row in table.items():
        row["step"] = row["generate"] + row["forward"] + row["update"]
        print(f"{n:6s} " + "  ".join(f"{k} {v:6.2f} s ({v / table[names[0]][k]:.2f}x)" for k, v in row.items()))
    if a.out:
        Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "cpu": cpu_name(), "threads": a.threads,
                                           "platform": platform.platform(), "table": table, "runs": times},
                                          indent=1) + "\n")


if __name__ == "__main__":
    main()
