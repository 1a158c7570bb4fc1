"""Where an llmrl GRPO step spends its time: the phase timings every metrics row carries.

The loop times its own phases (`run/one_step.py`: generate, score, forward, estimate, update, sync,
logged as `time_<phase>_s`), so nothing is wrapped or patched: the numbers are those of a normal
step. Configuration: bench/vs_trl.py's (issue 8).

    python bench/profile_step.py [--model PATH] [--steps 3] [--fast] [--set KEY=VALUE ...] [--out profile.json]

The first step is a warm-up and is not counted; medians over the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/profile_step.py` from anywhere
import bench.contenders.shared as vs  # noqa: E402  (the configuration of bench/vs_trl.py)
from llmrl import load_config  # noqa: E402
from llmrl.run.one_step import PHASES, train_step  # noqa: E402
from llmrl.run.reporting import NullReporter  # noqa: E402
from llmrl.run.session import setup  # noqa: E402


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
        row = train_step(s, step)
        phases = {p: row[f"time_{p}_s"] for p in PHASES}
        total = row["step_time_s"]
        steps.append({**phases, "other": total - sum(phases.values()), "step": total, "tokens": row["tokens"]})
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
