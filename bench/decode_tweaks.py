"""The `hf` engine's decode-time saving (llmrl/models/decoding.py: the skinny LM head) at today's defaults,
against the plain path it replaces, in whole `engine.generate` calls alternated in one process (issue 59,
item 9).

    python bench/decode_tweaks.py --model qwen2.5-coder-0.5b-instruct --reps 3 \\
        --out bench/results/decode-tweaks-qwen0.5b.json

Contenders (module attributes of llmrl.engines.hf and hf_turns swapped for the call):

    today         skinny_head (a float32 LM head of ≤ 256 rows as W · xᵀ)
    plain-head    the LM head as the model runs it (x · Wᵀ) in place of skinny_head

The checked-in result (bench/results/decode-tweaks-qwen0.5b.json) was written at commit 6157177, when this
script had a third contender, `dynamic`: transformers' DynamicCache in place of llmrl's ReservedCache (a
KV cache with room reserved for every new token). ReservedCache paid under 5 % everywhere and was
deleted (docs/history.md); `today` is on DynamicCache since.

Workloads, each a request a run makes with the engine at its defaults (`hf_engine(config=...)`):

    default       the built-in default run (`llmrl train`): the tiny model, its task's first 512 prompts × 1
                  sample, 5 new tokens; and `default-eval`, its held-out evaluation's greedy batch of 256 rows
    rg            the Qwen reasoning-gym recipe (recipes/qwen2.5-0.5b-rg.yaml, rg:aiw): 8 prompts × 8 samples,
                  32 new tokens, through the prepacked weights (which take the LM head: skinny_head is idle)
    rg-unpacked   the same with `engine.pack_weights=false`: the path of an episode's later turns and of a
                  model the packing does not take
    turn-unpacked a later turn's shape: the same questions after a system prompt of ~700 tokens (the calculator
                  recipe's rendered tool schema and earlier turns are 650-900), 64 new tokens, unpacked

Reported per workload and contender: the median seconds of `engine.generate` over --reps (after a warm-up
of each), the answer tokens it drew, the ratio of its seconds per answer token to `today`'s (a contender
whose products round differently may draw other tokens, so other lengths), and whether each drew the same
tokens and log-probabilities as `today`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rg_screen import cpu_name  # noqa: E402

import llmrl.engines.hf as hf  # noqa: E402
import llmrl.engines.hf_turns as hf_turns  # noqa: E402
from llmrl.config.load import load_config  # noqa: E402
from llmrl.engines.base import GenerationRequest, SamplingSettings, row_keys  # noqa: E402
from llmrl.models.load import load_base  # noqa: E402
from llmrl.models.prompts import apply_chat_setting  # noqa: E402
from llmrl.models.stack import PolicyStack  # noqa: E402
from llmrl.step.generate import encode_prompts  # noqa: E402
from llmrl.tasks import task_from_config  # noqa: E402

RECIPE = "recipes/qwen2.5-0.5b-rg.yaml"
LONG_CONTEXT = " ".join(["You can call the calculator tool with a JSON object holding its name and arguments; the tool "
                         "answers with the value of the expression, and you then answer the question with the number "
                         "alone. Earlier turns of this conversation are kept above."] * 16)  # ≈ 700 tokens


@contextlib.contextmanager
def _plain_head(model: Any) -> Iterator[None]:
    yield


@contextlib.contextmanager
def contender(name: str) -> Iterator[None]:
    """Within the block, the engine decodes as `name` says (the module docstring)."""
    saved = {m: m.skinny_head for m in (hf, hf_turns)}
    for m in (hf, hf_turns):
        if name == "plain-head":
            m.skinny_head = _plain_head
    try:
        yield
    finally:
        for m, head in saved.items():
            m.skinny_head = head


def workload(config: Any, tokenizer: Any, n_prompts: int, g: int, tokens: int, greedy: bool) -> GenerationRequest:
    """The first `n_prompts` prompts of the config's task, `g` samples each, keyed as step 1 of a run keys them."""
    apply_chat_setting(tokenizer, config.data.chat_template, config.model.name, config.data.system_prompt)
    rows = task_from_config(config).train[:n_prompts]
    ids, mask = encode_prompts(tokenizer, [r["prompt"] for r in rows], torch.device("cpu"))
    keys = None if greedy else row_keys(config.seed, 1, torch.arange(len(rows)).repeat_interleave(g),
                                        torch.arange(g).repeat(len(rows)))
    return GenerationRequest(ids, mask, g, SamplingSettings(tokens, config.rollout.temperature, config.rollout.top_p),
                             keys=keys, logprobs=not greedy)


def engine_for(config: Any) -> tuple[Any, Any]:
    """The `hf` engine of a run of `config` (its defaults) and the tokenizer."""
    base, tokenizer = load_base(config.model, show_progress=False)
    stack = PolicyStack(base, config.lora, with_critic=False)
    return hf.hf_engine(stack=stack, tokenizer=tokenizer, config=config), tokenizer


def timed(engine: Any, request: GenerationRequest, name: str) -> tuple[float, Any]:
    with contender(name):
        t = time.perf_counter()
        gen = engine.generate(request)
        return time.perf_counter() - t, gen


def same(a: Any, b: Any) -> bool:
    """Whether two generations drew the same tokens and masks and (where present) the same log-probabilities."""
    if a.response_ids.shape != b.response_ids.shape or not torch.equal(a.response_ids, b.response_ids):
        return False
    if a.logprobs is None or b.logprobs is None:
        return True
    return torch.equal(a.logprobs, b.logprobs)


def measure(engine: Any, request: GenerationRequest, names: list[str], reps: int) -> dict:
    for name in names:  # warm-up: kernels, allocator, the packed copies' first layout
        timed(engine, request, name)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    gens: dict[str, Any] = {}
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            s, gens[name] = timed(engine, request, name)
            seconds[name].append(s)
    tokens = {n: int(g.response_mask.sum()) for n, g in gens.items()}  # what each decoded (finished rows leave)
    base = statistics.median(seconds["today"]) / tokens["today"]
    return {n: {"s": statistics.median(v), "all": [round(x, 3) for x in v], "tokens": tokens[n],
                "ratio_to_today": statistics.median(v) / tokens[n] / base,
                "same_draws_as_today": same(gens[n], gens["today"])} for n, v in seconds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="the model of the rg workloads")
    ap.add_argument("--workloads", default="default,default-eval,rg,rg-unpacked,turn-unpacked")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    names = ["today", "plain-head"]
    wanted = a.workloads.split(",")
    table: dict[str, dict] = {}
    started = time.perf_counter()
    if {"default", "default-eval"} & set(wanted):
        config = load_config(None)
        engine, tok = engine_for(config)
        r = config.rollout
        requests = {"default": workload(config, tok, r.prompts_per_step, r.num_generations, r.max_new_tokens, False),
                    "default-eval": workload(config, tok, 256, 1, r.max_new_tokens, True)}
        for w in ("default", "default-eval"):
            if w in wanted:
                table[w] = measure(engine, requests[w], names, a.reps)
                print(w, json.dumps({n: (round(v["s"], 4), round(v["ratio_to_today"], 3), v["same_draws_as_today"])
                                     for n, v in table[w].items()}), flush=True)
    for w, pack, extra in (("rg", True, []), ("rg-unpacked", False, []),
                           ("turn-unpacked", False, [f"data.system_prompt={LONG_CONTEXT}", "rollout.max_new_tokens=64"])):
        if w not in wanted:
            continue
        config = load_config(RECIPE, sets=[f"model.name={a.model}", "task=rg:aiw", "rg.train_size=64", "rg.eval_size=8",
                                           f"engine.pack_weights={str(pack).lower()}", *extra])
        engine, tok = engine_for(config)
        r = config.rollout
        table[w] = measure(engine, workload(config, tok, r.prompts_per_step, r.num_generations, r.max_new_tokens, False),
                           names, a.reps)
        print(w, json.dumps({n: (round(v["s"], 3), round(v["ratio_to_today"], 3), v["same_draws_as_today"])
                             for n, v in table[w].items()}), flush=True)
        del engine
    if a.out:
        Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "cpu": cpu_name(), "threads": a.threads,
                                           "platform": platform.platform(), "torch": torch.__version__,
                                           "total_wall_s": round(time.perf_counter() - started, 1), "table": table},
                                          indent=1) + "\n")


if __name__ == "__main__":
    main()
