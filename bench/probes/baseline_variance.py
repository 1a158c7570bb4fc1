"""How good is each critic-free baseline on the built-in task? A measurement, not a training run.

For P train prompts, K samples each from the warm-started tiny model (temperature T) estimate the
per-prompt success probability p, and score the greedy answer g ∈ {0, 1}. With a 0/1 reward R the
policy-gradient coefficient (R − b) has, per prompt, second moment

    E[(R − b)²] = p(1 − b)² + (1 − p) b²

for a baseline b that does not depend on the sample. The gradient variance scales with it, so:

    REINFORCE (b = 0):        E[R²]          = p
    ReMax     (b = g):        p(1 − g) + (1 − p) g
    ideal     (b = p):        p(1 − p)          (what RLOO/GRPO estimate from the group)

Usage: python bench/probes/baseline_variance.py [--prompts 512] [--samples 32] [--temperature 1.0]
"""

from __future__ import annotations

import argparse

import torch

from llmrl.config import load_config
from llmrl.step.generate import decode, encode_prompts
from llmrl.engines.hf import generate
from llmrl.models.load import load_base
from llmrl.models.stack import PolicyStack
from llmrl.tasks import get_task


def success_rates(stack, tok, rows, reward, k: int, temperature: float, max_new: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, g): per-prompt sample success rate over k samples, and greedy success, both (P,)."""
    ids, mask = encode_prompts(tok, [r["prompt"] for r in rows], stack.lm.device)
    with stack.use("actor"), torch.no_grad():
        greedy = generate(stack, ids, mask, max_new_tokens=max_new, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
        g = torch.tensor(reward([r["prompt"] for r in rows], decode(tok, greedy.response_ids, greedy.response_mask),
                                answer=[r["answer"] for r in rows]))
        hits = torch.zeros(len(rows))
        for _ in range(k):
            out = generate(stack, ids, mask, max_new_tokens=max_new, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id, temperature=temperature,
                           uniforms=torch.rand(len(rows), max_new, dtype=torch.float64))
            texts = decode(tok, out.response_ids, out.response_mask)
            hits += torch.tensor(reward([r["prompt"] for r in rows], texts, answer=[r["answer"] for r in rows]))
    return hits / k, g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--temperature", type=float, nargs="+", default=[1.0])
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = load_config(overrides={"algo": "remax"})
    base, tok = load_base(cfg.model)
    stack = PolicyStack(base, cfg.lora, with_critic=False)
    task = get_task(cfg.task)
    rows = task.train[: args.prompts]
    print(f"{'T':>4} {'sample acc':>10} {'greedy acc':>10} {'E[R²] b=0':>10} {'b=greedy':>9} {'b=p':>7}")
    for temp in args.temperature:
        p, g = success_rates(stack, tok, rows, task.reward, args.samples, temp, cfg.rollout.max_new_tokens)
        reinforce = p.mean()
        remax = (p * (1 - g) + (1 - p) * g).mean()
        ideal = (p * (1 - p)).mean()
        print(f"{temp:4.2f} {p.mean():10.3f} {g.mean():10.3f} {reinforce:10.3f} {remax:9.3f} {ideal:7.3f}")


if __name__ == "__main__":
    main()
