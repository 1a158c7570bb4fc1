"""The files a compare leaves in DIR besides the run folders: summary.json, report.md and the plots.

Cells read `mean ± std` over seeds (just `mean` for one seed, `—` when not measured); column
definitions are in aggregate.py and docs/compare.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..run.folder import Run, atomic_write, to_json
from .aggregate import by_algo, check_prompts, run_metrics, tasks_by_algo
from .plan import Plan


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _g(x: float) -> str:
    return f"{x:.3g}"


Fmt = Callable[[float], str]
# (column, header, unit suffix of the mean ± std cell, formatter)
OUTCOME: list[tuple[str, str, str, Fmt]] = [
    ("acc_before", "held-out acc. before", " %", _pct),
    ("acc_after", "held-out acc. after", " %", _pct),
    ("strict_before", "strict acc. before", " %", _pct),
    ("strict_after", "strict acc. after", " %", _pct),
    ("lenient_before", "lenient acc. before", " %", _pct),
    ("lenient_after", "lenient acc. after", " %", _pct),
    ("eos_after", "EOS rate after", " %", _pct),
    ("reward_final", "final reward", "", lambda x: f"{x:.3f}"),
    ("reward_auc", "reward AUC", "", lambda x: f"{x:.3f}"),
    ("kl", "KL to ref.", "", lambda x: f"{x:.4f}"),
    ("response_len", "response len.", "", lambda x: f"{x:.2f}"),
]
COST: list[tuple[str, str, str, Fmt]] = [
    ("sec_per_step", "s / step", "", lambda x: f"{x:.2f}"),
    ("tokens_per_s", "gen. tokens / s", "", lambda x: f"{x:,.0f}"),
    ("peak_rss_mib", "peak RSS MiB", "", lambda x: f"{x:,.0f}"),
    ("peak_device_mib", "peak GPU MiB", "", lambda x: f"{x:,.0f}"),
    ("prompts_seen", "prompts seen", "", lambda x: f"{x:,.0f}"),
]
VARIANCE: list[tuple[str, str, str, Fmt]] = [
    ("adv_std", "advantage std", "", _g),
    ("grad_norm_var", "Var ‖g_m‖", "", _g),
    ("grad_var", "tr Cov g", "", _g),
    ("grad_rel_var", "tr Cov g / ‖ḡ‖²", "", _g),
]


def cell(stat: dict[str, Any], fmt: Fmt, unit: str = "") -> str:
    """'55.8 ± 1.2 %', '55.8 %' (one seed) or '—' (not measured)."""
    if stat["mean"] is None:
        return "—"
    if stat["std"] is None:
        return f"{fmt(stat['mean'])}{unit}"
    return f"{fmt(stat['mean'])} ± {fmt(stat['std'])}{unit}"


def columns(table: list[tuple[str, str, str, Fmt]], algos: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, Fmt]]:
    """Drop columns no run measured (e.g. GPU memory on a CPU)."""
    return [c for c in table if any(a[c[0]]["mean"] is not None for a in algos.values())]


def summarize(plan: Plan, runs: dict[str, Run], plots: dict[str, Path]) -> dict[str, Any]:
    """summary.json's content but the command's own `wall_time_s` (which `compare` adds last): the plan,
    what differs, the prompt check, per-algo and per-run numbers, and `runs_wall_time_s`, the sum of the
    runs' own wall times (each from whichever command trained it: a rerun reuses finished runs)."""
    per_run = {name: {**run_metrics(run), "run_dir": str(run.path)} for name, run in runs.items()}
    first = {r.algo: r for r in plan.runs if r.seed == plan.seeds[0]}
    return {
        "plan": {
            "algos": list(plan.algos), "seeds": list(plan.seeds), "match": plan.match,
            "steps": plan.runs[0].config.steps, "task": plan.runs[0].config.task,
            "model": plan.runs[0].config.model.name, "rows_per_step": plan.runs[0].rows_per_step,
            "prompts_per_step": {a: r.config.rollout.prompts_per_step for a, r in first.items()},
            "num_generations": {a: r.config.rollout.num_generations for a, r in first.items()},
        },
        "differences": plan.differences(),
        "prompts": check_prompts(plan, runs),
        "algos": by_algo(plan, per_run),
        "tasks": tasks_by_algo(plan, runs),  # a mixture's held-out numbers per task
        "runs": per_run,
        "runs_wall_time_s": sum((run.summary or {}).get("wall_time_s", 0.0) for run in runs.values()),
        "plots": {k: p.name for k, p in plots.items()},
    }


def prompt_verdict(seed: dict[str, Any]) -> str:
    """'identical over the first 8 prompts', 'DIFFERENT …' or why it could not be checked."""
    if seed["identical"] is None:
        return "not checked (no prompt count ends a step in every run yet, or digests were not logged)"
    word = "identical" if seed["identical"] else "DIFFERENT"
    return f"{word} over the first {seed['checked']:,} prompts"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _algo_table(summary: dict[str, Any], table: list[tuple[str, str, str, Fmt]]) -> str:
    algos = summary["algos"]
    cols = columns(table, algos)
    rows = [[f"`{a}`", *(cell(algos[a][c], f, u) for c, _, u, f in cols)] for a in algos]
    return _md_table(["algo", *(h for _, h, _, _ in cols)], rows)


TASK_METRICS = [("strict_accuracy", "strict"), ("lenient_accuracy", "lenient"), ("accuracy", "acc.")]


def _task_table(summary: dict[str, Any]) -> list[str]:
    """A mixture's held-out accuracy per task, before → after, one row per algorithm ([] for one task)."""
    per = summary.get("tasks") or {}
    if not per:
        return []
    tasks = list(dict.fromkeys(t for a in per.values() for t in a))
    header, cols = ["algo"], []
    for t in tasks:
        for metric, word in TASK_METRICS:
            if any(f"{metric}_after" in per[a].get(t, {}) for a in per):
                header.append(f"`{t}` {word} before → after")
                cols.append((t, metric))
                break
    rows = []
    for algo, by_task in per.items():
        row = [f"`{algo}`"]
        for t, metric in cols:
            stats = by_task.get(t, {})
            before, after = stats.get(f"{metric}_before"), stats.get(f"{metric}_after")
            row.append(f"{cell(before, _pct) if before else '—'} → {cell(after, _pct, ' %') if after else '—'}")
        rows.append(row)
    return ["## Held-out accuracy per task", "", _md_table(header, rows), ""]


def markdown(summary: dict[str, Any], command: str) -> str:
    """report.md: what was held identical, what differed, the tables and the plots."""
    p = summary["plan"]
    seeds = ", ".join(map(str, p["seeds"]))
    diff = summary["differences"]
    diff_rows = [[f"`{k}`", *(f"`{v[a]!r}`" for a in p["algos"])] for k, v in diff.items()]
    check = summary["prompts"]
    prompt_lines = [f"- seed {s}: {prompt_verdict(v)}" for s, v in check["seeds"].items()]
    parts = [
        f"# llmrl compare: {', '.join(p['algos'])}",
        "",
        f"`{command}`",
        "",
        f"Task `{p['task']}`, model `{p['model']}`, {p['steps']} steps, seeds {seeds}; "
        f"{p['rows_per_step']} rows per step in every run (budget matched by `{p['match']}`); "
        f"wall time of the command {summary['wall_time_s']:.0f} s (the runs' own: "
        f"{summary['runs_wall_time_s']:.0f} s). Cells are mean ± std over seeds.",
        "",
        "## What differs between the runs",
        "",
        _md_table(["setting", *p["algos"]], diff_rows) if diff_rows else "Nothing but the algorithm name.",
        "",
        "Prompts read in the same order (checked from each run's logged prompt digests):",
        "",
        *prompt_lines,
        "",
        "## Outcome",
        "",
        _algo_table(summary, OUTCOME),
        "",
        *_task_table(summary),
        "## Cost",
        "",
        _algo_table(summary, COST),
        "",
        "## Variance",
        "",
        "Advantage std per step, and the actor's minibatch-gradient noise per step (g_m pre-clip, "
        "see docs/compare.md), averaged over steps.",
        "",
        _algo_table(summary, VARIANCE),
        "",
        "## Plots",
        "",
        *(f"![{k.replace('_', ' ')}]({name})\n" for k, name in summary["plots"].items()),
    ]
    return "\n".join(parts) + "\n"


def write(out: Path, summary: dict[str, Any], command: str) -> None:
    atomic_write(out / "summary.json", to_json(summary, indent=2, default=str) + "\n")
    atomic_write(out / "report.md", markdown(summary, command))
