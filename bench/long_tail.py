"""Seconds of the `hf` engine's generation with finished rows leaving the batch against feeding them pads
(`engine.drop_finished`, issue 58), on batches with a long tail, alternated in one process.

    python bench/long_tail.py --model qwen2.5-coder-0.5b-instruct --tokens 64,256 --reps 1 \\
        --out bench/results/long-tail-qwen0.5b.json

Batches, 64 rows each (8 prompts × 8 samples at temperature 1.0, keyed per row as a run keys them):

    tail      7 prompts asking for a number (the rows stop after ~10 tokens) and 1 asking for a long story
              (its 8 rows run to the limit): a controlled long tail
    rg        8 questions of the Qwen reasoning-gym recipe's task (default rg:aiw, its prompts and chat
              template, recipes/qwen2.5-0.5b-rg.yaml): a natural batch
    full      the tail batch with no stop token: every row runs to the limit (what dropping must not slow)

With --vllm (run by `.venv-vllm/bin/python`) a third contender, "vllm": the same requests through the
`vllm` engine (its own scheduler: each request leaves when it stops), on the tail and rg batches (vLLM
stops at the model's EOS whatever the engine's stop ids say, so it has no "full" batch here).

Per batch, length and contender ("drop", "keep"[, "vllm"]): the median seconds of `engine.generate` over --reps
(after one short warm-up of each), the rows × steps the batch decoded, the in-mask (useful) tokens,
generate_useful_frac = useful / (rows × steps), useful tokens per second, and whether both contenders
drew the same tokens (they draw from the same per-row keys; a matrix product's rounding may differ
with the number of rows, so a near-tie can part: the count of rows that differ is reported). The
useful tokens' FLOP/s (2 × parameters per token, bench/roofline.py's count) against the machine's
measured float32 peak (--peak-gflops, from `python bench/roofline.py`) where given.
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

from llmrl.config.load import load_config  # noqa: E402
from llmrl.engines.base import GenerationRequest, SamplingSettings, row_keys  # noqa: E402
from llmrl.engines.hf import hf_engine  # noqa: E402
from llmrl.models.load import load_base  # noqa: E402
from llmrl.models.prompts import apply_chat_setting  # noqa: E402
from llmrl.models.stack import PolicyStack  # noqa: E402
from llmrl.step.generate import encode_prompts  # noqa: E402
from llmrl.tasks import task_from_config  # noqa: E402

RECIPE = "recipes/qwen2.5-0.5b-rg.yaml"
SHORT = "What is {a} + {b}? Reply with the number only."
LONG = "Write a long, detailed story about a lighthouse keeper and a storm. Use at least 500 words."


def batches(model: str, task: str, tokenizer) -> dict[str, list]:
    """The prompts of each batch (8 each): chat messages."""
    tail = [[{"role": "user", "content": SHORT.format(a=3 * i + 11, b=7 * i + 5)}] for i in range(7)]
    tail.append([{"role": "user", "content": LONG}])
    config = load_config(RECIPE, sets=[f"model.name={model}", f"task={task}", "rg.train_size=64", "rg.eval_size=8"])
    apply_chat_setting(tokenizer, config.data.chat_template, config.model.name, config.data.system_prompt)
    rg = [row["prompt"] for row in task_from_config(config).train[:8]]
    return {"tail": tail, "rg": rg, "full": tail}


def vllm_contender(model: str, stack, tokenizer, prompts: dict[str, list], tokens: int):
    """The `vllm` engine of a run of the rg recipe with room for `tokens` new tokens (engines/vllm_engine.py)."""
    from llmrl.engines.vllm_engine import vllm_engine

    config = load_config(RECIPE, sets=[f"model.name={model}", "rollout.engine=vllm", f"rollout.max_new_tokens={tokens}"])
    longest = max(int(encode_prompts(tokenizer, p, torch.device("cpu"))[1].sum(-1).max()) for p in prompts.values())
    return vllm_engine(stack=stack, tokenizer=tokenizer, config=config, longest_prompt=longest)


def run(engine, tokenizer, prompts: list, tokens: int, drop: bool, no_stop: bool) -> dict:
    """One generation of 8 prompts × 8 samples: seconds, rows × steps, useful tokens, the tokens."""
    ids, mask = encode_prompts(tokenizer, prompts, torch.device("cpu"))
    keys = row_keys(0, 1, torch.arange(8).repeat_interleave(8), torch.arange(8).repeat(8))
    engine.drop_finished = drop
    stops, engine.stop_ids = engine.stop_ids, ([-1] if no_stop else engine.stop_ids)
    t = time.perf_counter()
    gen = engine.generate(GenerationRequest(ids, mask, 8, SamplingSettings(tokens, 1.0, 1.0), keys=keys, logprobs=True))
    seconds = time.perf_counter() - t
    engine.stop_ids = stops
    slots, useful = gen.response_mask.numel(), int(gen.response_mask.sum())
    return {"s": seconds, "slots": slots, "useful": useful, "ids": gen.response_ids, "lengths": gen.response_mask.sum(-1).tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--task", default="rg:aiw")
    ap.add_argument("--tokens", default="64,256", help="comma-separated max_new_tokens")
    ap.add_argument("--batches", default="tail,rg,full")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peak-gflops", type=float, default=None, help="the machine's float32 peak (bench/roofline.py)")
    ap.add_argument("--vllm", action="store_true", help="also the vllm engine (run by .venv-vllm/bin/python)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    config = load_config(RECIPE, sets=[f"model.name={a.model}"])  # the recipe's model settings and LoRA
    base, tokenizer = load_base(config.model, show_progress=False)
    stack = PolicyStack(base, config.lora, with_critic=False)
    engine = hf_engine(stack=stack, tokenizer=tokenizer)
    params = sum(p.numel() for p in base.parameters())
    prompts = batches(a.model, a.task, tokenizer)
    engines = {"drop": (engine, True), "keep": (engine, False)}
    if a.vllm:
        engines["vllm"] = (vllm_contender(a.model, stack, tokenizer, prompts, max(int(x) for x in a.tokens.split(","))), True)
    for e, drop in engines.values():  # warm-up: the kernels and allocator, not counted
        run(e, tokenizer, prompts["tail"], 8, drop, False)
    table, runs = {}, []
    for tokens in (int(x) for x in a.tokens.split(",")):
        for name in a.batches.split(","):
            names = [c for c in engines if not (c == "vllm" and name == "full")]
            got: dict[str, list[dict]] = {c: [] for c in names}
            for rep in range(a.reps):
                for c in (names if rep % 2 == 0 else names[::-1]):
                    e, drop = engines[c]
                    r = run(e, tokenizer, prompts[name], tokens, drop, name == "full")
                    got[c].append(r)
                    print(f"{name} {tokens} {c} rep {rep}: {r['s']:.2f} s, useful {r['useful']}/{r['slots']}", flush=True)
            d, k = got["drop"][0], got["keep"][0]
            row = {c: {"s": statistics.median(r["s"] for r in rs), "slots": rs[0]["slots"], "useful": rs[0]["useful"]}
                   for c, rs in got.items()}
            for c in row:
                row[c]["useful_frac"] = row[c]["useful"] / row[c]["slots"]
                row[c]["useful_tok_s"] = row[c]["useful"] / row[c]["s"]
                if a.peak_gflops:
                    row[c]["useful_peak_share"] = 2 * params * row[c]["useful_tok_s"] / 1e9 / a.peak_gflops
            row["speedup"] = row["keep"]["s"] / row["drop"]["s"]
            row["rows_differ"] = int((d["ids"] != k["ids"]).any(-1).sum()) if d["ids"].shape == k["ids"].shape else -1
            row["lengths"] = d["lengths"]
            table[f"{name}@{tokens}"] = row
            runs.append({"batch": name, "tokens": tokens, **{c: [r["s"] for r in rs] for c, rs in got.items()}})
            print(f"{name}@{tokens}: drop {row['drop']['s']:.2f} s, keep {row['keep']['s']:.2f} s "
                  f"({row['speedup']:.2f}x), useful {row['drop']['useful_frac']:.2f}, rows differing {row['rows_differ']}"
                  + (f"; vllm {row['vllm']['s']:.2f} s" if "vllm" in row else ""), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "cpu": cpu_name(), "threads": a.threads,
                                           "platform": platform.platform(), "params": params, "table": table,
                                           "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
