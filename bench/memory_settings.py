"""What each memory setting costs in seconds and saves in peak RSS, on one model: whole `llmrl train`
commands of one configuration under each set of settings, alternated, each in its own process.

    defaults        nothing set
    micro8          update.micro_batch_size=8, no engine copies (engine.pack_weights/merge_lora=false)
    micro8+malloc   the same with MALLOC_MMAP_THRESHOLD_=1048576 in the environment (glibc)
    micro4+malloc   micro-batches of 4 rows, no engine copies, the allocator setting
    ckpt            update.activation_checkpointing=true, no engine copies
    ckpt+malloc     the same with MALLOC_MMAP_THRESHOLD_=1048576
    float32         model.dtype=float32 (the defaults' `auto` picks bfloat16 with AMX)
    bfloat16        model.dtype=bfloat16 (issue 42's step in both dtypes: `--only float32,bfloat16`)
    nf4             model.quantize=nf4: the frozen base's linear layers in 4 bits (issue 56)
    nf4+micro8      the same with micro-batches of 8 rows and the allocator setting
    nf4+ckpt        the same with activation checkpointing and the allocator setting
    nf4+lean        the 4-bit base with no engine copies (generation multiplies by the 4-bit layers): what a
                    model whose float copy the machine cannot hold runs (a 7B shape, docs/scaling.md)
    nf4+lean+micro2 the same with micro-batches of 2 rows and the allocator setting

Per contender: peak RSS (the larger of GNU time's `%M` and summary.json's `peak_rss_mib`: a run restarts VmHWM at each phase), the seconds of each training step (`step_time_s` of
metrics.jsonl: the first step is a warm-up, the median of the others counts; with `--steps 1` the one
step) and, to show the settings change no numbers beyond float rounding, the first step's loss, KL and
entropy. The configuration is issue 42's GRPO step: `--task chat_sum`, 8 prompts × 8 samples, up to
64 new tokens, 2 minibatches of 32, no evaluation; `--algo` another algorithm's preset on the same rows
(`--set` changes them, e.g. 8 rows × 32 tokens: `--set rollout.num_generations=1 --set
rollout.max_new_tokens=32 --set update.minibatch_size=8`).

    python bench/memory_settings.py --model qwen2.5-coder-0.5b-instruct --steps 2 --reps 1 \\
        --out bench/results/memory-settings-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NO_COPIES = ["engine.pack_weights=false", "engine.merge_lora=false"]
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "1048576"}
CONTENDERS: dict[str, tuple[list[str], dict[str, str]]] = {
    "defaults": ([], {}),
    "micro8": (["update.micro_batch_size=8", *NO_COPIES], {}),
    "micro8+malloc": (["update.micro_batch_size=8", *NO_COPIES], MALLOC),
    "micro4+malloc": (["update.micro_batch_size=4", *NO_COPIES], MALLOC),
    "ckpt": (["update.activation_checkpointing=true", *NO_COPIES], {}),
    "ckpt+malloc": (["update.activation_checkpointing=true", *NO_COPIES], MALLOC),
    "float32": (["model.dtype=float32"], {}),
    "bfloat16": (["model.dtype=bfloat16"], {}),
    "nf4": (["model.quantize=nf4"], {}),
    "nf4+micro8": (["model.quantize=nf4", "update.micro_batch_size=8"], MALLOC),
    "nf4+ckpt": (["model.quantize=nf4", "update.activation_checkpointing=true"], MALLOC),
    "nf4+lean": (["model.quantize=nf4", *NO_COPIES], {}),
    "nf4+lean+micro2": (["model.quantize=nf4", "update.micro_batch_size=2", *NO_COPIES], MALLOC),
}
BASE = ["--task", "chat_sum", "--seed", "0", "--set", "rollout.prompts_per_step=8",
        "--set", "rollout.num_generations=8", "--set", "rollout.max_new_tokens=64",
        "--set", "update.minibatch_size=32", "--set", "eval.size=0", "--set", "checkpoint.every=0"]
SAME = ("policy_loss", "kl", "entropy", "reward_mean", "tokens")


def run(model: str, name: str, steps: int, threads: int, extra: list[str], algo: str = "grpo") -> dict:
    """One `llmrl train` command of `name`'s settings in a child process: its peak RSS, step times and
    first-step metrics."""
    sets, env = CONTENDERS[name]
    work = tempfile.mkdtemp(prefix=f"bench-mem-{name}-")
    out, rss_file = str(Path(work, "run")), Path(work, "peak-rss-kib")
    cmd = ["/usr/bin/time", "-f", "%M", "-o", str(rss_file), sys.executable, "-m", "llmrl", "train", "--model", model, "--steps", str(steps), "--out", out,
           "--algo", algo, *BASE, "--set", f"threads={threads}"]
    for s in [*sets, *extra]:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak = int(rss_file.read_text().split()[-1]) if rss_file.exists() else 0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (rc {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    rows = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "step_time_s" in r]
    times = [r["step_time_s"] for r in rows]
    peak = max(peak / 1024, json.loads(Path(out, "summary.json").read_text())["peak_rss_mib"])  # %M: since the last phase
    return {"peak_rss_mib": peak, "step_s": times, "wall_s": wall,
            "phases": [{k: r[k] for k in r if k.startswith("time_")} for r in rows],
            "first": {k: rows[0].get(k) for k in SAME}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--only", default="defaults,micro8,micro8+malloc,ckpt,ckpt+malloc",
                    help=f"comma-separated contenders, in this order, of {', '.join(CONTENDERS)}")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--algo", default="grpo", help="the algorithm preset of every command (grpo: issue 42's step)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra config override for every command (repeatable), e.g. rollout.max_new_tokens=8")
    args = ap.parse_args()
    names = args.only.split(",")
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        ap.error(f"unknown contender {', '.join(unknown)}; choose from {', '.join(CONTENDERS)}")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:  # alternated, the order reversed each repetition
            runs[name].append(run(args.model, name, args.steps, args.threads, args.set, args.algo))
            r = runs[name][-1]
            print(f"{name:14s} rep {rep}: peak {r['peak_rss_mib']} MiB, steps {[round(t, 2) for t in r['step_s']]} s",
                  flush=True)
    table = {}
    for name, rs in runs.items():
        counted = [t for r in rs for t in (r["step_s"][1:] or r["step_s"])]
        phases = [p for r in rs for p in (r["phases"][1:] or r["phases"])]
        table[name] = {"s_per_step": statistics.median(counted), "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
                       "phase_s": {k: statistics.median(p[k] for p in phases) for k in phases[0]} if phases else {},
                       "first": rs[0]["first"]}
    ref = table[names[0]]
    for name, row in table.items():
        row["s_per_step_ratio"] = row["s_per_step"] / ref["s_per_step"]
        print(f"{name:14s} {row['s_per_step']:8.2f} s/step ({row['s_per_step_ratio']:.2f}x)  "
              f"{row['peak_rss_mib']:8.0f} MiB  phases {({k: round(v, 2) for k, v in row['phase_s'].items()})}  "
              f"first step {row['first']}")
    if args.out:
        machine = {"cpus": os.cpu_count(), "platform": platform.platform(),
                   "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                                if ln.startswith("model name")), "?")}
        Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "machine": machine, "table": table,
                                              "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
