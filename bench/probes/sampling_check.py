"""Do llmrl's sampler and HF `generate` (what TRL uses) draw completions of the same length?

Same model, same LoRA actor (untrained: B = 0), same prompts (the first 8 of llmrl's GRPO prompt
stream for seed 0, 16 samples each), temperature 1, no top-k / top-p, 32 new tokens, stop at EOS.
Prints, per round, the mean completion length (EOS included) and the share cut at 32 tokens for each
sampler. The two draw differently (llmrl: inverse CDF from counter-based uniforms; HF:
torch.multinomial on the global generator), so only the distributions can agree.

    PYTHONPATH=$PWD python bench/probes/sampling_check.py [--rounds 2] [--per-prompt 16] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root
import bench.contenders.shared as vs  # noqa: E402  (the configuration of bench/vs_trl.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=vs.MODEL)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--per-prompt", type=int, default=16)
    ap.add_argument("--dtype", choices=vs.DTYPES, default="float32")
    a = ap.parse_args()
    from llmrl import load_config
    from llmrl.run.reporting import NullReporter
    from llmrl.step.generate import encode_prompts
    from llmrl.engines.hf import generate, row_uniforms
    from llmrl.run.session import setup

    torch.set_num_threads(1)
    vs.THREADS = 1
    model = os.path.expanduser(a.model)
    s = setup(load_config(overrides=vs.llmrl_overrides(model, "grpo", False, dtype=a.dtype)), NullReporter(),
              overwrite=True)
    tok, stack, g = s.tokenizer, s.stack, a.per_prompt
    rows = vs.prompt_stream(a.prompts, 0)[: a.prompts]
    ids, mask = encode_prompts(tok, [r["prompt"] for r in rows], stack.lm.device)
    ids, mask = ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0)
    n, eos = ids.shape[0], tok.eos_token_id

    def hf(seed: int) -> list[int]:
        torch.manual_seed(seed)
        out = stack.lm.generate(input_ids=ids, attention_mask=mask.long(), do_sample=True, temperature=1.0, top_k=0,
                                top_p=1.0, max_new_tokens=vs.NEW_TOKENS, pad_token_id=tok.pad_token_id,
                                eos_token_id=[eos])
        return [r.index(eos) + 1 if eos in r else len(r) for r in out[:, ids.shape[1]:].tolist()]

    def ours(step: int) -> list[int]:
        u = row_uniforms(0, step, torch.arange(len(rows)).repeat_interleave(g), torch.arange(g).repeat(len(rows)),
                         vs.NEW_TOKENS)
        out = generate(stack, ids, mask, max_new_tokens=vs.NEW_TOKENS, eos_id=eos, pad_id=tok.pad_token_id,
                       temperature=1.0, uniforms=u)
        return out.response_mask.sum(-1).tolist()

    with torch.no_grad(), stack.use("actor"):
        for k in range(a.rounds):
            t0 = time.perf_counter()
            x, y = hf(k), ours(100 + k)
            cut = lambda v: sum(t == vs.NEW_TOKENS for t in v) / n  # noqa: E731
            print(f"round {k}: {n} completions each; HF generate mean length {statistics.mean(x):.2f}, cut {cut(x):.3f}"
                  f" | llmrl mean length {statistics.mean(y):.2f}, cut {cut(y):.3f} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)


if __name__ == "__main__":
    main()
