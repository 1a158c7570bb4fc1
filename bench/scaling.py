"""Where a step's time goes: generation, scoring forwards, update — measured on random Llama models.

    PYTHONPATH=. python bench/scaling.py [--steps 3] [--device cpu|cuda] [--out bench/results/scaling.json]

For each (model size, batch) it builds a random Llama with the char tokenizer (no hub), runs PPO
steps of the loop with one CPU thread and reads three phases per step from the metrics row's own
phase timings (`time_<phase>_s`, run/one_step.py):

    generate   time_generate_s: T decode forwards of N rows × 1 token (KV cache), decoding text
    score      time_score_s + time_forward_s: the reward; old log-probs, reference log-probs, critic
               values (3 forwards of N rows × (P+T) tokens)
    update     time_update_s: PPO epochs × minibatches, actor and critic forward + backward

T is the step's mean response length (`response_len`), P the left-padded prompt width.

and fits the cost model of docs/scaling.md by least squares:

    t_generate ≈ T · (c_dec + a · N · n_params)          (per decode step: fixed overhead + per row)
    t_score    ≈ 3 · b · N · (P+T) · n_params            (3 full-sequence forwards)
    t_update   ≈ epochs · 2 · u · N · (P+T) · n_params   (actor + critic, forward + backward)

The first step of each configuration is a warm-up and is not counted. The machine is shared: read
the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl import load_config
from llmrl.run.one_step import train_step
from llmrl.run.reporting import NullReporter
from llmrl.run.session import setup
from llmrl.step.generate import encode_prompts
from llmrl.models.tokenizer import build_char_tokenizer

SIZES = {  # name: (hidden, layers, intermediate)
    "S": (64, 2, 256),  # the built-in tiny model's shape
    "M": (256, 4, 1024),
    "L": (512, 8, 2048),
}
RUNS = [("S", 16), ("S", 64), ("M", 16), ("M", 64), ("L", 16)]  # (size, prompts per step)


def build(folder: Path, size: str) -> int:
    """A random Llama of `size` saved in `folder`; returns its parameter count without embeddings."""
    hidden, layers, inter = SIZES[size]
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=inter, max_position_embeddings=64,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n)


def measure(size: str, prompts: int, steps: int, root: Path, device: str = "cpu") -> dict:
    folder = root / size
    if not folder.exists():
        build(folder, size)
    n_params = build(root / "count", size)
    config = load_config(overrides={
        "model.name": str(folder), "algo": "ppo", "steps": steps + 1, "out": str(root / f"run-{size}-{prompts}"),
        "rollout.prompts_per_step": prompts, "rollout.max_new_tokens": 16, "update.minibatch_size": prompts,
        "eval.size": 0, "threads": 1, "model.device": device})
    s = setup(config, NullReporter(), overwrite=True)
    rows = []
    for step in range(steps + 1):
        row = train_step(s, step)  # the loop's own phase timings (GPU synchronised around each)
        prompts_of_step = [s.task.train[i]["prompt"] for i in s.sampler.indices(step).tolist()]
        p_len = encode_prompts(s.tokenizer, prompts_of_step, torch.device("cpu"))[0].shape[1]
        if step:
            rows.append({"N": prompts, "P": p_len, "T": row["response_len"], "generate": row["time_generate_s"],
                         "score": row["time_score_s"] + row["time_forward_s"], "update": row["time_update_s"],
                         "step": row["step_time_s"]})
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    return {"size": size, "n_params": n_params, "prompts": prompts, "N": mean["N"], "P": mean["P"], "T": mean["T"],
            "generate_s": mean["generate"], "score_s": mean["score"],
            "update_s": mean["update"], "step_s": mean["step"]}


def fit(rows: list[dict]) -> dict:
    """Least-squares constants of the cost model (seconds per unit)."""
    x = torch.tensor([[r["T"], r["T"] * r["N"] * r["n_params"]] for r in rows], dtype=torch.float64)
    y = torch.tensor([r["generate_s"] for r in rows], dtype=torch.float64)
    c_dec, a = torch.linalg.lstsq(x, y.unsqueeze(-1)).solution.squeeze(-1).tolist()
    work = [r["N"] * (r["P"] + r["T"]) * r["n_params"] for r in rows]
    b = sum(r["score_s"] for r in rows) / (3 * sum(work))
    u = sum(r["update_s"] for r in rows) / (2 * sum(work))
    return {"c_dec_s": c_dec, "a_s_per_row_param": a, "b_s_per_token_param": b, "u_s_per_token_param": u,
            "decode_vs_forward_per_token": a / b, "update_vs_forward_per_token": u / b}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="bench/results/scaling.json")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for size, prompts in RUNS:
            rows.append(measure(size, prompts, args.steps, Path(tmp), args.device))
            r = rows[-1]
            print(f"{size} ({r['n_params'] / 1e6:.2f} M) N={r['N']:.0f} P={r['P']:.0f} T={r['T']:.1f}: "
                  f"generate {r['generate_s']:.3f} s, score {r['score_s']:.3f} s, update {r['update_s']:.3f} s, "
                  f"step {r['step_s']:.3f} s", flush=True)
    result = {"runs": rows, "fit": fit(rows)}
    print(json.dumps(result["fit"], indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
