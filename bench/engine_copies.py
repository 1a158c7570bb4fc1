"""What the `hf` engine's weight copies cost and buy at a model's size: one `HFEngine.generate` with
each of `engine.merge_lora` × `engine.pack_weights`, alternated, on the CPU.

    adapters        merge off, pack off: every adapted layer runs W·x + s·B·(A·x), no copy
    merged          merge on,  pack off: W′ = W + s·B·A as a copy of each adapted weight
    packed          merge off, pack on:  oneDNN-packed copies of every linear weight (the adapters still run)
    merged+packed   merge on,  pack on:  W′ made straight into its packed copy (one copy in all)

Per contender: the median seconds of a generation of `--rows` rows × `--tokens` new tokens (every row
runs to the end: no stop id), and the memory the copies add while it runs: the most RSS seen by a
sampling thread during the generation, minus the RSS just before it. LoRA r=16 on `--targets`
(default: every linear layer but the head, as the run's default), B ~ N(0, 0.01²).

    python bench/engine_copies.py --model qwen2.5-coder-0.5b-instruct --rows 64 --tokens 64 --reps 2 \
        --threads 2 --out bench/results/engine-copies-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `bench.common`
from bench.common import random_request  # noqa: E402

from llmrl.config.schema import LoraConfig, ModelConfig  # noqa: E402
from llmrl.engines.hf import HFEngine  # noqa: E402
from llmrl.models.load import load_base  # noqa: E402
from llmrl.models.stack import PolicyStack  # noqa: E402

CONTENDERS = {"adapters": (False, False), "merged": (True, False), "packed": (False, True), "merged+packed": (True, True)}


def rss() -> int:
    """This process's resident set now, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def measured(fn) -> tuple[float, int]:
    """(seconds, most RSS above the start seen while `fn` ran)."""
    start, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.005)

    watcher = threading.Thread(target=sample)
    watcher.start()
    began = time.perf_counter()
    fn()
    seconds = time.perf_counter() - began
    done.set()
    watcher.join()
    return seconds, max(peak[0], rss()) - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="anything --model takes (a folder, a catalogued name)")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--targets", default=None, help="comma-separated LoRA targets; default: all linear layers")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base, _ = load_base(ModelConfig(name=args.model, dtype="float32"), show_progress=False)
    torch.manual_seed(0)
    targets = args.targets.split(",") if args.targets else None
    stack = PolicyStack(base, LoraConfig(r=16, alpha=32.0, target_modules=targets), with_critic=False)
    for name, p in stack.peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.01)
    vocab = stack.lm.config.vocab_size
    engines = {k: HFEngine(stack, [vocab + 7], 0, merge=m, pack=p) for k, (m, p) in CONTENDERS.items()}
    engines["adapters"].generate(random_request(vocab, 8, 4, 99))  # warm-up
    seconds: dict[str, list[float]] = {k: [] for k in engines}
    extra: dict[str, list[int]] = {k: [] for k in engines}
    for rep in range(args.reps):
        order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
        for name in order:
            s, b = measured(lambda: engines[name].generate(random_request(vocab, args.rows, args.tokens, rep)))
            seconds[name].append(s)
            extra[name].append(b)
            print(f"rep {rep} {name:>14}: {s:7.2f} s, +{b / 2**20:7.0f} MiB", flush=True)
    table = {k: {"seconds": statistics.median(v), "all_seconds": v, "extra_mib": max(extra[k]) / 2**20,
                 "speedup_vs_adapters": statistics.median(seconds["adapters"]) / statistics.median(v),
                 "table_rows": [(what, n, size / 2**20) for what, n, size in engines[k].memory()]}
             for k, v in seconds.items()}
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    result = {"model": args.model, "rows": args.rows, "tokens": args.tokens, "threads": args.threads,
              "targets": targets or "all-linear", "cpu": cpu, "date": time.strftime("%Y-%m-%d"), "contenders": table}
    for k, r in table.items():
        print(f"{k:>14}: {r['seconds']:7.2f} s  ({r['speedup_vs_adapters']:.2f}x the adapters' path), "
              f"+{r['extra_mib']:.0f} MiB while generating")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
