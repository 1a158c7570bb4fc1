"""The top-k critic (`lora.critic_layers`) on a PPO step: bench/profile_step.py per variant, alternated.

    python bench/probes/critic_layers.py [--layers all,4,2] [--reps 2] [--steps 3] [--out bench/results/critic-layers.json]

Each repetition runs every variant once, in turn, in its own subprocess (so a slow patch of a shared
CPU hits them all); reported: per variant the median over repetitions of profile_step's medians
(steps after the first), and each variant's step and update times as ratios to `all`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROFILE_STEP = Path(__file__).resolve().parents[1] / "profile_step.py"  # bench/profile_step.py

PPO = ["--set", "algo=ppo", "--set", "rollout.num_generations=1", "--set", "rollout.prompts_per_step=8",
       "--set", "kl.placement=reward", "--set", "kl.estimator=k1", "--set", "kl.beta=0.02"]
KEYS = ("step", "update (forward + backward + AdamW)", "critic forward for the update (values, graph kept)",
        "no-grad forward (reference)", "generate")


def run(layers: str, steps: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="critic-layers-")) / "p.json"
    extra = [] if layers == "all" else ["--set", f"lora.critic_layers={layers}"]
    subprocess.run([sys.executable, str(PROFILE_STEP), "--steps", str(steps), *PPO, *extra, "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="all,4,2")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    variants = a.layers.split(",")
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for rep in range(a.reps):
        for v in variants:
            results[v].append(run(v, a.steps))
            print(f"rep {rep + 1} k={v}: step {results[v][-1]['median']['step']:.2f} s", flush=True)
    med = {v: {k: statistics.median(r["median"].get(k, 0.0) for r in rs) for k in KEYS} for v, rs in results.items()}
    rss = {v: statistics.median(max(r["vm_hwm_mib"].values()) for r in rs) for v, rs in results.items()}
    print(f"{'k':<6}" + "".join(f"{k[:28]:>30}" for k in KEYS) + f"{'peak RSS MiB':>14}")
    for v in variants:
        print(f"{v:<6}" + "".join(f"{med[v][k]:>22.2f} ({med[v][k] / med[variants[0]][k]:.2f})" if med[variants[0]][k]
                                  else f"{med[v][k]:>30.2f}" for k in KEYS) + f"{rss[v]:>14.0f}")
    if a.out:
        Path(a.out).write_text(json.dumps({"variants": variants, "reps": a.reps, "steps": a.steps, "median": med,
                                           "peak_rss_mib": rss, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
