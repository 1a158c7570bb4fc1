"""Does `torch.compile` of the `hf` engine's decoding step pay on this CPU (issue 58)?

    python bench/probes/compiled_decode.py --model qwen2.5-coder-0.5b-instruct --rows 64 --tokens 32 \\
        --out bench/results/compiled-decode.json

The engine's generation (its defaults: merged actor, packed weights, finished rows leaving the
batch; here no row stops, so every step has all rows) run eagerly and with the model's forward
compiled (`torch.compile(dynamic=True)`, inductor's CPU backend: the prefill and every one-token step
go through it; the KV cache grows by a position a step, so its shapes are dynamic), alternated. The
compiled contender runs without the engine's packed copies (`engine.pack_weights=false`): inductor's
lowering of oneDNN's packed product asserts that the packed weight is a graph constant, which it is only
under `torch._inductor.config.freezing`, and freezing bakes the weights in (every update of the actor
would compile again).
Reported: the first compiled call's seconds (the compile), then per contender the median seconds of
--reps generations after it, and whether the compiled one drew the same tokens (float rounding of
fused kernels may part near-ties: the count of rows that differ) and its largest |Δ log μ|.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rg_screen import cpu_name  # noqa: E402

from llmrl.config.schema import LoraConfig, ModelConfig  # noqa: E402
from llmrl.engines.base import GenerationRequest, SamplingSettings, row_keys  # noqa: E402
from llmrl.engines.hf import hf_engine  # noqa: E402
from llmrl.models.load import load_base  # noqa: E402
from llmrl.models.stack import PolicyStack  # noqa: E402
from llmrl.step.generate import encode_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    base, tok = load_base(ModelConfig(name=a.model, dtype="float32"), show_progress=False)
    stack = PolicyStack(base, LoraConfig(r=16, alpha=32.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
                        with_critic=False)
    engine = hf_engine(stack=stack, tokenizer=tok)
    engine.stop_ids = [-1]  # every row to the limit: the same work for both
    g = 8
    prompts = [[{"role": "user", "content": f"Write a poem about the number {i}."}] for i in range(a.rows // g)]
    ids, mask = encode_prompts(tok, prompts, torch.device("cpu"))
    keys = row_keys(0, 1, torch.arange(len(prompts)).repeat_interleave(g), torch.arange(g).repeat(len(prompts)))
    request = GenerationRequest(ids, mask, g, SamplingSettings(a.tokens, 1.0, 1.0), keys=keys, logprobs=True)
    eager_forward = stack.lm.forward
    compiled_forward = torch.compile(eager_forward, dynamic=True)

    def timed(compiled: bool):
        stack.lm.forward = compiled_forward if compiled else eager_forward
        engine.pack = not compiled
        t = time.perf_counter()
        gen = engine.generate(request)
        return time.perf_counter() - t, gen

    eager_warm, ref = timed(False)
    compile_s, first = timed(True)
    print(f"eager warm-up {eager_warm:.1f} s; compiled first call (compiling) {compile_s:.1f} s", flush=True)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for rep in range(a.reps):
        for compiled in ((False, True) if rep % 2 == 0 else (True, False)):
            s, gen = timed(compiled)
            times["compiled" if compiled else "eager"].append(s)
            print(f"rep {rep} {'compiled' if compiled else 'eager'}: {s:.2f} s", flush=True)
    stack.lm.forward = eager_forward
    differ = int((first.response_ids != ref.response_ids).any(-1).sum())
    same = first.response_mask & ref.response_mask & (first.response_ids == ref.response_ids)
    lp_diff = float((first.logprobs - ref.logprobs).abs()[same].max())
    table = {k: statistics.median(v) for k, v in times.items()}
    print(f"eager {table['eager']:.2f} s, compiled {table['compiled']:.2f} s ({table['eager'] / table['compiled']:.2f}x); "
          f"rows differing {differ} of {a.rows}, max |Δ log μ| {lp_diff:.2e}")
    if a.out:
        Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "cpu": cpu_name(), "threads": a.threads,
                                           "torch": torch.__version__, "compile_s": compile_s, "eager_warmup_s": eager_warm,
                                           "median_s": table, "runs": times, "rows_differ": differ,
                                           "max_abs_logprob_diff": lp_diff}, indent=1) + "\n")


if __name__ == "__main__":
    main()
