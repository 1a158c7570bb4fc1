"""Whole `llmrl train` commands of one recipe under named settings, alternated, one at a time: what a
setting changes in a real run's seconds, phases and results (issue 58: `engine.drop_finished`).

    python bench/setting_runs.py --recipe recipes/qwen2.5-0.5b-rg.yaml --task rg:aiw \\
        --contender keep=engine.drop_finished=false --contender drop=engine.drop_finished=true \\
        --out bench/results/drop-finished-rg-aiw.json

Each contender is NAME=KEY=VALUE[,KEY=VALUE...]; the contenders run in the given order for the
first seed, reversed for the next, and so on. Recorded per run: from summary.json held-out accuracy
before and after, mean seconds a step, peak RSS; the whole command's seconds; from metrics.jsonl the
summed generate-phase seconds (`time_generate_s`), the mean `generate_useful_frac` (episodes:
`decode_idle_share`), and a fingerprint
of what the run drew (per step: reward_mean, tokens, response_len), so that two settings that should
draw the same completions can be seen to (float rounding may part a near-tie after some updates).
The output is rewritten after every run; a run already in it is not repeated. `--set` adds overrides
to every command (e.g. --set steps=2 --set eval.size=0 for the step alone).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rg_learning import commit, whole_command  # noqa: E402
from rg_screen import cpu_name  # noqa: E402

KEYS = ("eval_accuracy_before", "eval_accuracy_after", "eval_strict_accuracy_before", "eval_strict_accuracy_after",
        "step_time_s_mean", "peak_rss_mib", "steps")
DRAWN = ("reward_mean", "tokens", "response_len")


def metrics_of(run: Path) -> dict:
    """From RUN/metrics.jsonl: the generate phase's summed seconds, the mean useful share, the fingerprint."""
    path = run / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    rows = [r for r in rows if "step_time_s" in r]
    useful = [r["generate_useful_frac"] for r in rows if "generate_useful_frac" in r]
    idle = [r["decode_idle_share"] for r in rows if "decode_idle_share" in r]  # episodes' rows × steps that had stopped
    return {"time_generate_s": round(sum(r.get("time_generate_s", 0.0) for r in rows), 2),
            "generate_useful_frac": round(sum(useful) / len(useful), 4) if useful else None,
            "decode_idle_share": round(sum(idle) / len(idle), 4) if idle else None,
            "drawn": [[r.get(k) for k in DRAWN] for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=None)
    ap.add_argument("--task", default=None)
    ap.add_argument("--contender", action="append", required=True, metavar="NAME=KEY=VALUE[,KEY=VALUE]")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="for every command")
    ap.add_argument("--root", default="/tmp/setting-runs")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    contenders = {}
    for item in a.contender:
        name, _, sets = item.partition("=")
        if not name or "=" not in sets:
            ap.error(f"--contender takes NAME=KEY=VALUE[,KEY=VALUE], got {item!r}")
        contenders[name] = sets.split(",")
    out = Path(a.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    result.update(recipe=a.recipe, task=a.task, cpu=cpu_name(), contenders=contenders, sets=a.set)
    done = {(r["seed"], r["contender"]): r for r in result.get("runs", [])}
    for i, seed in enumerate(int(s) for s in a.seeds.split(",")):
        for name in (list(contenders) if i % 2 == 0 else list(contenders)[::-1]):
            if (seed, name) in done:
                continue
            run = Path(a.root) / f"{name}-s{seed}"
            args = [*(["--recipe", a.recipe] if a.recipe else []), *(["--task", a.task] if a.task else []),
                    "--seed", str(seed), *[x for s in [*contenders[name], *a.set] for x in ("--set", s)]]
            row = whole_command(args, run, KEYS, seed=seed, contender=name, llmrl=commit())
            row.update(metrics_of(run))
            done[(seed, name)] = row
            result["runs"] = list(done.values())
            out.write_text(json.dumps(result, indent=1) + "\n")
            print(f"seed {seed} {name}: {row.get('eval_strict_accuracy_before', row.get('eval_accuracy_before'))} → "
                  f"{row.get('eval_strict_accuracy_after', row.get('eval_accuracy_after'))}, {row['command_s']} s, "
                  f"generate {row['time_generate_s']} s, useful {row['generate_useful_frac']} {row.get('error', '')}",
                  flush=True)


if __name__ == "__main__":
    main()
