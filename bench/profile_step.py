"""Where an llmrl GRPO step spends its time: wall-clock timers around the pieces of `train_step`.

The engine is not changed: the timers wrap the module-level names `train_step` calls (rollout's
`generate`, `masked_logprobs` per role, `decode`, the reward; the trainer's `update`), so the
numbers are those of a normal step. Configuration: bench/vs_trl.py's (issue 8).

    python bench/profile_step.py [--model PATH] [--steps 3] [--fast] [--set KEY=VALUE ...] [--out profile.json]

The first step is a warm-up and is not counted; medians over the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/profile_step.py` from anywhere
import bench.vs_trl as vs  # noqa: E402
from llmrl import load_config
from llmrl.engine import rollout as rollout_mod
from llmrl.engine import trainer as trainer_mod
from llmrl.run.reporting import NullReporter


def wrap(module: Any, name: str, label: Callable[..., str], sink: dict[str, float]) -> None:
    fn = getattr(module, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink[label(*args, **kwargs)] += time.perf_counter() - t0

    setattr(module, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=vs.MODEL)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fast", action="store_true", help="update.on_policy_logprobs=on (else the default, auto)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config override (repeatable), e.g. --set model.share_prompts=false")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    vs.THREADS = a.threads
    model = os.path.expanduser(a.model)
    current: dict[str, float] = defaultdict(float)

    def role(stack: Any, *_: Any, **__: Any) -> str:  # the role the rollout runs it in
        return f"no-grad forward ({stack.role})"

    wrap(rollout_mod, "generate", lambda *a, **k: "generate", current)
    wrap(rollout_mod, "masked_logprobs", role, current)
    wrap(rollout_mod, "masked_values", lambda *a, **k: "no-grad forward (critic values)", current)
    wrap(trainer_mod, "critic_forward", lambda *a, **k: "critic forward for the update (values, graph kept)", current)
    wrap(rollout_mod, "decode", lambda *a, **k: "decode", current)
    wrap(rollout_mod, "score_parts", lambda *a, **k: "reward", current)
    wrap(trainer_mod, "update", lambda *a, **k: "update (forward + backward + AdamW)", current)
    wrap(trainer_mod, "estimate", lambda *a, **k: "advantages", current)

    from llmrl.run.loop import setup, train_step

    import tempfile

    config = load_config(overrides={
        "algo": "grpo", "task": "chat_sum", "seed": 0, "threads": a.threads, "out": tempfile.mkdtemp(prefix="prof-"),
        "model.name": model, "model.dtype": "float32", "lora.r": 16, "lora.alpha": 32.0,
        "lora.target_modules": vs.TARGETS, "rollout.prompts_per_step": vs.PROMPTS,
        "rollout.num_generations": vs.GENERATIONS, "rollout.max_new_tokens": vs.NEW_TOKENS,
        "kl.beta": vs.BETA, "kl.estimator": "k3", "kl.placement": "loss", "update.lr_actor": vs.LR,
        "update.minibatch_size": vs.PROMPTS * vs.GENERATIONS, "update.on_policy_logprobs": "on" if a.fast else "auto",
        "eval.size": 0, "checkpoint.every": 0}, sets=a.set)
    s = setup(config, NullReporter(), overwrite=True)
    hwm = {"after setup": vs.vm_hwm_mib()}
    steps: list[dict[str, float]] = []
    for step in range(a.steps):
        current.clear()
        t0 = time.perf_counter()
        row = train_step(s, step)
        total = time.perf_counter() - t0
        steps.append({**current, "other": total - sum(current.values()), "step": total, "tokens": row["tokens"]})
        hwm[f"after step {step + 1}"] = vs.vm_hwm_mib()
    counted = steps[1:] or steps
    med = {k: statistics.median(r.get(k, 0.0) for r in counted) for k in counted[0]}
    for k, v in med.items():
        print(f"{k:<40}{v:>8.2f}" + (f"  {100 * v / med['step']:5.1f} %" if k not in ("step", "tokens") else ""))
    print("peak RSS (VmHWM, MiB):", {k: round(v) for k, v in hwm.items()})
    if a.out:
        Path(a.out).write_text(json.dumps({"fast": a.fast, "threads": a.threads, "set": a.set, "median": med, "steps": steps,
                                           "vm_hwm_mib": hwm}, indent=1))


if __name__ == "__main__":
    main()
