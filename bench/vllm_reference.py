"""log π_ref from the trainer (a no-grad forward of the base, adapters off) against the vllm engine's
prompt log-probs (engine.reference=engine), on one GRPO batch of issue 8's configuration: seconds
(median of alternated repetitions after a warm-up) and the largest |difference|.

    .venv-vllm/bin/python bench/vllm_reference.py --model ~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-d2d0e68a642a
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from llmrl import load_config
    from llmrl.run.reporting import NullReporter
    from llmrl.run.session import setup
    from llmrl.step.forward import masked_logprobs
    from llmrl.step.generate import generate

    from vs_trl import llmrl_overrides  # bench/ is sys.path[0]

    config = load_config(overrides={**llmrl_overrides(a.model, "grpo", True), "rollout.engine": "vllm",
                                    "engine.sync": "adapter", "engine.reference": "engine", "threads": a.threads})
    s = setup(config, NullReporter(), overwrite=True)
    rows = [s.task.train[i] for i in range(2)]
    samples = generate(s.engine, s.tokenizer, rows, torch.arange(2), cfg=config.rollout, seed=0, step=0,
                       device=s.stack.lm.device)
    times: dict[str, list[float]] = {"trainer": [], "engine": []}
    results = {}
    for rep in range(a.reps + 1):
        for name in times:
            t0 = time.perf_counter()
            if name == "trainer":
                with torch.no_grad(), s.stack.use("reference"):
                    results[name] = masked_logprobs(s.stack, samples, 1.0)
            else:
                results[name] = s.engine.reference_logprobs(samples)
            if rep:
                times[name].append(time.perf_counter() - t0)
    diff = float((results["trainer"] - results["engine"]).abs().max())
    print(json.dumps({"median_s": {k: statistics.median(v) for k, v in times.items()}, "max_abs_diff": diff,
                      "rows": samples.n, "response_tokens": int(samples.response_mask.sum()), "threads": a.threads}))


if __name__ == "__main__":
    main()
