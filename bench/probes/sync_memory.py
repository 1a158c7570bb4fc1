"""The vllm engine's merged sync: extra memory of building W′ = W + s·B·A all at once against one
decoder layer at a time (engines/actor_weights.buckets), measured, not derived.

    python bench/probes/sync_memory.py [--shape smollm2|tiny] [--targets all-linear] [--reps 3] \
        [--out bench/results/sync-memory.json]

Each (mode, repetition) runs in a fresh subprocess (the modes alternate), so a process's peak RSS
(VmHWM) is that run's alone: the child builds the model from the shape's config with random weights
(no download: SmolLM2-135M's config written out here), wraps it in llmrl's PolicyStack with LoRA on
`--targets`, sets every B to random values (a trained actor), records VmHWM, then builds the sync's
tensors as the engine does — `all`: one dict of every changed tensor (the code before 2026-12-03),
`layers`: one bucket's dict at a time, freed before the next — in float32, and records VmHWM again.
The difference is the sync's peak extra memory on the trainer's side (vLLM copies the tensors into
parameters it already holds). Also reported: the bytes of the largest bucket and of all tensors,
which the measured peaks should match to within the allocator's slack. On CUDA (`--device cuda`)
the peak is torch.cuda.max_memory_allocated's instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SHAPES = {  # SmolLM2-135M-Instruct's config.json, and the built-in tiny model's
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True),
    "tiny": dict(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True),
}


def _hwm() -> int:
    """Peak resident set of this process so far, bytes (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(shape: str, mode: str, targets: str, device: str) -> dict:
    """One measurement in this process (see the module docstring)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmrl.config.schema import LoraConfig
    from llmrl.engines.actor_weights import actor_tensors, buckets, changed_names
    from llmrl.models.stack import PolicyStack, of_adapter

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPES[shape])).to(device).eval()
    lora = LoraConfig(r=16, alpha=32.0, target_modules=None if targets == "all-linear" else targets.split(","))
    stack = PolicyStack(model, lora, with_critic=False)
    with torch.no_grad():
        for name, p in stack.peft.named_parameters():
            if of_adapter(name, "actor"):
                p.normal_(std=0.02)
    names = changed_names(stack)
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated() if cuda else _hwm()
    sizes = []
    if mode == "all":
        tensors = actor_tensors(stack, names, torch.float32)
        sizes.append(sum(t.numel() * t.element_size() for t in tensors.values()))
        del tensors
    else:
        for bucket in buckets(names):
            tensors = actor_tensors(stack, bucket, torch.float32)
            sizes.append(sum(t.numel() * t.element_size() for t in tensors.values()))
            del tensors
    after = torch.cuda.max_memory_allocated() if cuda else _hwm()
    return {"mode": mode, "extra_bytes": after - before, "largest_bytes": max(sizes), "total_bytes": sum(sizes),
            "tensors": len(names), "buckets": len(sizes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--targets", default="all-linear", help="lora.target_modules, comma-separated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.shape, args.child, args.targets, args.device)))
        return
    runs: dict[str, list[dict]] = {"all": [], "layers": []}
    for _ in range(args.reps):
        for mode in runs:  # alternated
            done = subprocess.run([sys.executable, __file__, "--shape", args.shape, "--targets", args.targets,
                                   "--device", args.device, "--child", mode], capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    mib = 2**20
    report = {"shape": args.shape, "targets": args.targets, "device": args.device, "reps": args.reps, "modes": {}}
    for mode, rows in runs.items():
        extra = statistics.median(r["extra_bytes"] for r in rows)
        report["modes"][mode] = {"extra_mib_median": extra / mib, "extra_mib_all": [r["extra_bytes"] / mib for r in rows],
                                 "largest_mib": rows[0]["largest_bytes"] / mib, "total_mib": rows[0]["total_bytes"] / mib,
                                 "tensors": rows[0]["tensors"], "buckets": rows[0]["buckets"]}
        print(f"{mode:7s} peak extra {extra / mib:8.1f} MiB (median of {len(rows)}); largest bucket "
              f"{rows[0]['largest_bytes'] / mib:.1f} MiB of {rows[0]['total_bytes'] / mib:.1f} MiB in "
              f"{rows[0]['buckets']} bucket(s), {rows[0]['tensors']} tensors")
    a, b = report["modes"]["all"]["extra_mib_median"], report["modes"]["layers"]["extra_mib_median"]
    print(f"layers / all: {b / a:.3f}" if a else "all: no measurable extra memory")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
