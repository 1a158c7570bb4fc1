"""Does a run in bfloat16 learn what it learns in float32, and is it faster end to end? (issue 29)

    python bench/dtype_runs.py --recipe recipes/smollm2-135m-fast.yaml --seeds 0,1,2 \
        --dtypes float32,bfloat16 --root /tmp/dtype-runs --out bench/results/dtype-runs.json
    python bench/dtype_runs.py --recipe recipes/qwen2.5-0.5b-calc.yaml --seeds 0,1,2 \
        --dtypes float32+nf4 --out bench/results/nf4-runs-qwen0.5b-calc.json     # a 4-bit base (issue 56)

Each run is a whole `llmrl train --recipe R --seed S --set model.dtype=D` command in a fresh process,
one at a time, the dtypes alternated within each seed (f32, bf16, f32, bf16, ...) so that a slow patch
of a shared VM hits both. Recorded per run, from its summary.json: held-out accuracy before and after
(greedy; strict where the task has it), mean seconds per step, the whole command's seconds, peak RSS.
The output is rewritten after every run; a run already in it is not repeated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rg_learning import whole_command  # noqa: E402
from rg_screen import cpu_name  # noqa: E402

KEYS = ("eval_accuracy_before", "eval_accuracy_after", "eval_strict_accuracy_before", "eval_strict_accuracy_after",
        "step_time_s_mean", "peak_rss_mib", "steps")
QUANTIZE = ("nf4", "fp4")  # a contender "float32+nf4": model.dtype float32 over a 4-bit base (issue 56)


def one_run(recipe: str | None, seed: int, dtype: str, out: Path, task: str | None = None) -> dict:
    """One whole `llmrl train` command (the built-in default when `recipe` is None; the recipe's task
    unless `task`); its summary's numbers. `dtype` "D+Q" also sets model.quantize=Q."""
    dtype_name, _, quantize = dtype.partition("+")
    args = [*(["--recipe", recipe] if recipe else []), *(["--task", task] if task else []),
            "--seed", str(seed), "--set", f"model.dtype={dtype_name}",
            *(["--set", f"model.quantize={quantize}"] if quantize else [])]
    return whole_command(args, out, KEYS, seed=seed, dtype=dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=None, help="a recipe; none: the built-in default")
    ap.add_argument("--task", default=None, help="a task instead of the recipe's, e.g. rg:number_format")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--dtypes", default="float32,bfloat16",
                    help="contenders separated by commas: a dtype, or dtype+nf4 / dtype+fp4 over a 4-bit base")
    ap.add_argument("--root", default="/tmp/dtype-runs")
    ap.add_argument("--out", default="bench/results/dtype-runs.json")
    a = ap.parse_args()
    if not all(s.strip().isdigit() for s in a.seeds.split(",")):
        ap.error(f"--seeds takes whole numbers separated by commas, got {a.seeds!r}")
    dtypes = {"float32", "bfloat16", "float16"}
    if not set(a.dtypes.split(",")) <= dtypes | {f"{d}+{q}" for d in dtypes for q in QUANTIZE}:
        ap.error(f"--dtypes takes float32, bfloat16 or float16 (each alone or +nf4 / +fp4) separated by commas, "
                 f"got {a.dtypes!r}")
    out = Path(a.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    result.update(recipe=a.recipe or "(the built-in default)", cpu=cpu_name(), **({"task": a.task} if a.task else {}))
    done = {(r["seed"], r["dtype"]): r for r in result.get("runs", [])}
    for seed in (int(s) for s in a.seeds.split(",")):
        for dtype in a.dtypes.split(","):
            if (seed, dtype) in done:
                continue
            row = one_run(a.recipe, seed, dtype, Path(a.root) / f"{dtype}-s{seed}", a.task)
            done[(seed, dtype)] = row
            result["runs"] = list(done.values())
            out.write_text(json.dumps(result, indent=1) + "\n")
            print(f"seed {seed} {dtype}: accuracy {row.get('eval_accuracy_before')} → {row.get('eval_accuracy_after')}, "
                  f"{row.get('step_time_s_mean')} s/step, {row['command_s']} s {row.get('error', '')}", flush=True)
    by = {d: [r for r in done.values() if r["dtype"] == d and "error" not in r] for d in a.dtypes.split(",")}
    result["means"] = {d: {"accuracy_after": statistics.mean(r["eval_accuracy_after"] for r in rows),
                           "command_s": statistics.mean(r["command_s"] for r in rows)} for d, rows in by.items() if rows}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["means"], indent=1))


if __name__ == "__main__":
    main()
