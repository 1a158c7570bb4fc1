"""The `hf` engine's episodes with and without the KV cache kept across turns (engines/hf_turns.py),
side by side in one process: the same batch of episodes, alternated, on the built-in multi-turn tasks
with the recipes' rollout settings.

For each task (chat_calc: ≤ 3 turns of ≤ 24 tokens; guess: ≤ 4 turns of ≤ 8 tokens), 8 prompts × 8
episodes at temperature 0.7 with the decoding log-probs, from the actor (the recipes' LoRA adapters,
zero-initialised): `--rounds` times each way, alternating (fresh, cached, fresh, cached, ...). Printed:
the median seconds per batch of each, their ratio, the tokens each prefilled, and whether the two drew
the same episodes (tokens equal, log-probs within --atol).

    python bench/probes/turn_cache.py --model smollm2-135m-instruct [--rounds 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import replace
from typing import Any

import torch

from llmrl.config import load_config
from llmrl.engines import build_engine
from llmrl.models.load import load_base
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import stop_token_ids
from llmrl.run.session import episode_env
from llmrl.step.episodes import episode_stats, generate_episodes
from llmrl.tasks import get_task, with_task_format

TASKS = {"chat_calc": "recipes/smollm2-135m-calc.yaml", "guess": "recipes/smollm2-135m-guess.yaml"}


def cpu_name() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run(stack: PolicyStack, engine: Any, tokenizer: Any, task: Any, env: Any, rollout: Any, reuse: bool) -> tuple[float, Any, int]:
    """One batch of episodes: (seconds, Samples, positions prefilled: Σ rows × positions of the multi-position forwards)."""
    fed: list[int] = []
    hook = stack.lm.get_input_embeddings().register_forward_hook(
        lambda m, args, out: fed.append(args[0].numel() if args[0].shape[1] > 1 else 0))
    rows = task.train[: rollout.prompts_per_step]
    started = time.perf_counter()
    samples = generate_episodes(engine, tokenizer, env, rows, torch.arange(len(rows)), cfg=rollout, seed=0,
                                step=1, device=stack.lm.device, stop_ids=stop_token_ids(tokenizer, stack.lm),
                                logprobs=True, reuse_cache=reuse)
    seconds = time.perf_counter() - started
    hook.remove()
    return seconds, samples, sum(fed)


def compare(name: str, recipe: str, model: str, rounds: int, atol: float) -> dict[str, Any]:
    config = load_config(recipe, overrides={"model.name": model})
    task = get_task(config.task)
    rollout = with_task_format(config.rollout, task)
    env = episode_env(config, task)
    base, tokenizer = load_base(config.model)
    stack = PolicyStack(base, config.lora, with_critic=False)
    engine = build_engine("hf", stack=stack, tokenizer=tokenizer, config=config)
    times: dict[bool, list[float]] = {False: [], True: []}
    out: dict[bool, Any] = {}
    for _ in range(rounds):
        for reuse in (False, True):
            seconds, samples, fed = run(stack, engine, tokenizer, task, env, rollout, reuse)
            times[reuse].append(seconds)
            out[reuse] = (samples, fed)
            print(f"  {name:9s} {'cached' if reuse else 'fresh':6s} {seconds:6.2f} s", flush=True)
    (fresh, fresh_fed), (cached, cached_fed) = out[False], out[True]
    same_tokens = torch.equal(fresh.response_ids, cached.response_ids) and torch.equal(fresh.context_mask, cached.context_mask)
    lp_diff = float((fresh.behaviour_logprobs - cached.behaviour_logprobs).abs().max()) if same_tokens else None
    stats = episode_stats(cached)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"recipe": recipe, "episodes": cached.n, "turns_mean": stats["turns_mean"],
            "episode_tokens": stats["episode_tokens"], "seconds_fresh": times[False], "seconds_cached": times[True],
            "median_fresh_s": med[False], "median_cached_s": med[True], "speedup": med[False] / med[True],
            "prefilled_positions_fresh": fresh_fed, "prefilled_positions_cached": cached_fed,
            "same_tokens": same_tokens, "max_logprob_diff": lp_diff, "within_atol": lp_diff is not None and lp_diff <= atol}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "model": args.model, "rounds": args.rounds,
               "tasks": {}}
    for name in args.tasks.split(","):
        res = compare(name, TASKS[name], args.model, args.rounds, args.atol)
        results["tasks"][name] = res
        print(f"{name}: fresh {res['median_fresh_s']:.2f} s, cached {res['median_cached_s']:.2f} s "
              f"({res['speedup']:.2f}x); prefilled {res['prefilled_positions_fresh']} vs "
              f"{res['prefilled_positions_cached']} positions; same tokens {res['same_tokens']}, "
              f"max |Δ log-prob| {res['max_logprob_diff']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
