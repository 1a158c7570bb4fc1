"""Does one recipe, unchanged, learn reasoning-gym tasks it was not tuned on? (issue 28)

    python bench/rg_learning.py --recipe recipes/smollm2-135m-rg.yaml \
        --runs "chain_sum?max_terms=2&max_digits=2:0;gcd?max_value=20:0;..." \
        --root /tmp/rg-runs --out bench/results/rg-learning.json

Each run is `llmrl train --recipe R --task rg:TASK --seed S --out ROOT/<n>` in a fresh process,
timed as a whole command (model load, both held-out evaluations, training), one after another,
never two at once. `--runs` holds TASK:SEED entries separated by ';' (a task's settings may hold
commas and '&'). The output file is rewritten after every run and a run already in it is not
repeated. Per run it records, from the run's summary.json: held-out strict and lenient accuracy
before and after (greedy, the first eval.size held-out questions, the same for every seed), EOS rate
and mean length after, the wall time of the whole command, mean seconds per step, peak RSS.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from rg_screen import cpu_name  # noqa: E402

KEYS = ("eval_strict_accuracy_before", "eval_strict_accuracy_after", "eval_lenient_accuracy_before",
        "eval_lenient_accuracy_after", "eval_eos_rate_after", "eval_response_len_after", "step_time_s_mean",
        "peak_rss_mib", "steps")


def whole_command(args: list[str], out: Path, keys: tuple[str, ...], **row: object) -> dict:
    """Run `llmrl train ARGS --out OUT --overwrite` as a whole command in a fresh process: `row` with
    the command's seconds and, from the run's summary.json, `keys` (or the error's last line)."""
    cmd = [sys.executable, "-m", "llmrl", "train", *args, "--out", str(out), "--overwrite"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    done: dict = {**row, "command_s": round(time.perf_counter() - start, 1)}
    summary = out / "summary.json"
    if proc.returncode != 0 or not summary.exists():
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return {**done, "error": lines[-1] if lines else f"exit {proc.returncode}"}
    data = json.loads(summary.read_text())
    return {**done, **{k: data.get(k) for k in keys}}


def commit() -> str:
    """The short git commit of the llmrl checkout being measured ('' outside a git checkout)."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent)
    return proc.stdout.strip()


def train_one(recipe: str, task: str, seed: int, out: Path) -> dict:
    """One whole `llmrl train` command; the summary's numbers, or the error's last line, with where
    and when it ran (the CPU, the UTC start, the llmrl commit): one file collects runs of several machines."""
    where = {"cpu": cpu_name(), "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "llmrl": commit()}
    return whole_command(["--recipe", recipe, "--task", f"rg:{task}", "--seed", str(seed)], out, KEYS,
                         task=task, seed=seed, run_dir=str(out), **where)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/smollm2-135m-rg.yaml")
    parser.add_argument("--runs", required=True, help="TASK:SEED entries separated by ';'")
    parser.add_argument("--root", default="/tmp/rg-runs")
    parser.add_argument("--out", default="bench/results/rg-learning.json")
    args = parser.parse_args()
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    result["recipe"] = args.recipe
    done = {(r["task"], r["seed"]): r for r in result.get("runs", [])}
    entries = [e.strip().rsplit(":", 1) for e in args.runs.split(";") if e.strip()]
    for n, (task, seed) in enumerate(entries):
        if (task, int(seed)) in done:
            continue
        folder = Path(args.root) / f"{len(done):02d}-{task.split('?')[0]}-s{seed}"
        row = train_one(args.recipe, task, int(seed), folder)
        done[(task, int(seed))] = row
        result["runs"] = list(done.values())
        out.write_text(json.dumps(result, indent=1) + "\n")
        pct = lambda k: "—" if row.get(k) is None else f"{100 * row[k]:.0f}"  # noqa: E731
        print(f"{task} seed {seed}: strict {pct('eval_strict_accuracy_before')} → {pct('eval_strict_accuracy_after')}, "
              f"lenient {pct('eval_lenient_accuracy_before')} → {pct('eval_lenient_accuracy_after')}, "
              f"{row['command_s']} s {row.get('error', '')}", flush=True)


if __name__ == "__main__":
    main()
