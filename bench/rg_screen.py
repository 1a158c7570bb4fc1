"""Screen reasoning-gym tasks with a base model: greedy held-out accuracy before any training, the
measurement that chooses which tasks a learning test can show a rise on (issue 28: tasks the base
model solves at 5–60 %).

    python bench/rg_screen.py --model smollm2-135m-instruct \
        --tasks "leg_counting;chain_sum?max_terms=2;..." --size 40 --max-new-tokens 40 --out bench/results/rg-screen.json

Each task runs `llmrl eval --samples 0 --json` in its own subprocess (the held-out split, the first
`--size` questions, the run's answer convention and chat template), one after another, never two at
once. The output file is rewritten after every task, so an interrupted screen keeps what it measured;
a task already in it is not measured again. Reported per task: strict and lenient accuracy, EOS
rate, mean completion length, seconds, and the error line for a task that failed.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name and whether it has AMX (bfloat16 is fast only with it)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda key: next((ln.split(":", 1)[1].strip() for ln in text.splitlines()  # noqa: E731
                              if ln.split(":", 1)[0].strip() == key), "")
    name = field("model name") or platform.processor()
    family = f" family {field('cpu family')} model {field('model')}" if field("cpu family") else ""
    return f"{name}{family} ({'amx_bf16' if 'amx_bf16' in text else 'no AMX'})"


def screen_one(model: str, task: str, size: int, max_new_tokens: int) -> dict:
    """One `llmrl eval` of the base model on rg:task; its greedy block, or the error's last line."""
    start = time.perf_counter()
    cmd = ["llmrl", "eval", "--model", model, "--task", f"rg:{task}", "--samples", "0", "--size", str(size),
           "--max-new-tokens", str(max_new_tokens), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    row: dict = {"task": task, "seconds": round(time.perf_counter() - start, 1)}
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        row["error"] = lines[-1] if lines else f"exit {proc.returncode}"
        return row
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    row.update({k: report["greedy"].get(k) for k in ("strict_accuracy", "lenient_accuracy", "eos_rate", "response_len")})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", required=True, help="reasoning-gym names (without rg:), each with its ?key=value settings, separated by ';' (a setting's list holds commas)")
    parser.add_argument("--size", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--out", default="bench/results/rg-screen.json")
    args = parser.parse_args()
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    result.update(model=args.model, size=args.size, max_new_tokens=args.max_new_tokens, cpu=cpu_name())
    rows = {r["task"]: r for r in result.get("tasks", [])}
    for task in [t.strip() for t in args.tasks.split(";") if t.strip()]:
        if task in rows:
            continue
        rows[task] = screen_one(args.model, task, args.size, args.max_new_tokens)
        result["tasks"] = list(rows.values())
        out.write_text(json.dumps(result, indent=1) + "\n")
        r = rows[task]
        print(f"{task:28s} strict {r.get('strict_accuracy')} lenient {r.get('lenient_accuracy')} "
              f"eos {r.get('eos_rate')} len {r.get('response_len')} {r['seconds']} s {r.get('error', '')}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
