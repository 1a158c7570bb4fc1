"""Held-out evaluation of a mixture, its rows batched as listed (one task at a time) against batched by
prompt text (`run/evaluate.batch_order`, what llmrl does), alternated on the same model and rows.

    python bench/eval_order.py --model qwen2.5-coder-0.5b-instruct \
        --task "rg:number_format,rg:color_cube_rotation,rg:letter_counting" --size 120 --batch-size 40 \
        --out bench/results/eval-order-qwen0.5b.json

A mixture's held-out rows come one task at a time (1, 2, 3, 1, 2, 3, …), so batched as listed every
batch pads to the longest task's prompt and shares only the chat template's opening, while batched by
text each batch holds one task and the engine prefills its shared instructions once (models/prefix.py).
Per contender and repeat: the seconds of `evaluate` (greedy, the run's settings), its accuracy, and
how many completions differ from the other order's (float rounding of other batch shapes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).parent))
from rg_screen import cpu_name  # noqa: E402

from llmrl.engines import build_engine  # noqa: E402
from llmrl.errors import ConfigError  # noqa: E402
from llmrl.model_eval import load_target, resolve_task  # noqa: E402
from llmrl.models.tokenizer import stop_token_ids  # noqa: E402
from llmrl.run import evaluate as ev  # noqa: E402

ORDERS = {"as listed": lambda prompts, batch_size: list(range(len(prompts))), "by prompt text": ev.batch_order}


def timed(order: str, engine, target, task, rows, args) -> tuple[float, ev.EvalResult]:
    """Seconds and result of one greedy `evaluate` with the rows batched in `order`."""
    with mock.patch.object(ev, "batch_order", ORDERS[order]):
        start = time.perf_counter()
        res = ev.evaluate(engine, target.tokenizer, rows, task.reward, max_new_tokens=args.max_new_tokens,
                          success=task.success, batch_size=args.batch_size, role=target.role,
                          stop_ids=stop_token_ids(target.tokenizer, target.stack.lm))
        return time.perf_counter() - start, res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", required=True, help="a mixture, e.g. 'rg:number_format,rg:letter_counting'")
    parser.add_argument("--size", type=int, default=120, help="held-out rows (the first SIZE, tasks in turn)")
    parser.add_argument("--batch-size", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the two orders")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if min(args.size, args.batch_size, args.max_new_tokens, args.repeats, args.threads) < 1:
        parser.error("--size, --batch-size, --max-new-tokens, --repeats and --threads must be ≥ 1")
    if not Path(args.model).is_dir() and "/" in args.model:
        parser.error(f"no model folder {args.model}")
    torch.set_num_threads(args.threads)
    try:
        target = load_target(args.model)
        task = resolve_task(args.task, target)
    except ConfigError as err:
        parser.error(str(err))
    rows = task.eval[: args.size]
    engine = build_engine("hf", stack=target.stack, tokenizer=target.tokenizer, config=target.config)
    runs: list[dict] = []
    last: dict[str, list[str]] = {}
    for rep in range(args.repeats):
        for order in ORDERS:
            seconds, res = timed(order, engine, target, task, rows, args)
            last[order] = res.completions
            runs.append({"order": order, "repeat": rep, "seconds": round(seconds, 2), "accuracy": res.accuracy})
            print(f"{order:15s} repeat {rep}: {seconds:7.1f} s, accuracy {res.accuracy:.3f}", flush=True)
    best = {o: min(r["seconds"] for r in runs if r["order"] == o) for o in ORDERS}
    differ = sum(a != b for a, b in zip(*last.values()))
    result = {"command": " ".join(sys.argv), "cpu": cpu_name(), "model": args.model, "task": task.name,
              "rows": len(rows), "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
              "runs": runs, "best_seconds": best, "speedup": round(best["as listed"] / best["by prompt text"], 2),
              "completions_differing": differ}
    print(f"by prompt text: {result['speedup']}x faster (best of {args.repeats}); {differ} of {len(rows)} completions differ")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
