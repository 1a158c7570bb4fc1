"""The largest update minibatch whose whole GRPO step stays under a memory limit, with the LM head's
log-probs over the whole vocabulary at once (`model.logits_chunk_mib=0`, what llmrl did before issue
42) and in chunks (the default), everything else at its default (no micro-batches, the engine's
copies kept).

    python bench/minibatch_fit.py --model qwen2.5-coder-0.5b-instruct --limit-gib 8 \\
        --sizes 32,16,8,4 --out FILE.json

Each probe is one whole `llmrl train` command of issue 42's GRPO step (`memory_settings.BASE`: 8
prompts × 8 samples, up to 64 new tokens, `--steps 1`) with `update.minibatch_size=N`, in its own
process, its peak RSS read by GNU time (`memory_settings.run`). Sizes are tried from the largest down;
per setting the first size under the limit ends its search (a smaller minibatch holds less).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from memory_settings import run  # noqa: E402
from rg_screen import cpu_name  # noqa: E402

SETTINGS = {"whole vocabulary": "model.logits_chunk_mib=0", "chunked": "model.logits_chunk_mib=64"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--limit-gib", type=float, default=8.0)
    ap.add_argument("--sizes", default="64,32,16,8", help="minibatch sizes, tried from the largest down")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra config override for every command (repeatable), e.g. rollout.max_new_tokens=8")
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")}, reverse=True)
    start, result = time.perf_counter(), {"command": " ".join(sys.argv), "cpu": cpu_name(), "limit_gib": args.limit_gib,
                                         "probes": [], "largest": {}}
    for name, setting in SETTINGS.items():
        result["largest"][name] = None
        for size in sizes:
            probe = run(args.model, "defaults", 1, args.threads, [*args.set, setting, f"update.minibatch_size={size}"])
            gib = probe["peak_rss_mib"] / 1024
            result["probes"].append({"setting": name, "minibatch": size, "peak_rss_gib": round(gib, 2),
                                     "step_s": probe["step_s"], "first": probe["first"]})
            print(f"{name:16s} minibatch {size:3d}: peak {gib:.2f} GiB, step {probe['step_s']}", flush=True)
            if gib <= args.limit_gib:
                result["largest"][name] = size
                break
    result["total_wall_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result["largest"]))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
