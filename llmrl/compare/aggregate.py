"""The numbers of a compare: one row of metrics per run, mean ± std per algorithm, and the check
that every run of a seed read the same prompts in the same order.

Per run (S = steps, r_s = mean train reward of step s, t_s = its seconds, n_s = its generated tokens):

    acc_before / acc_after   held-out greedy accuracy before the first step and after the last
    strict_before / strict_after
                             held-out strict accuracy (the task's `strict_accuracy`: only the first
                             number stated counts; None for a task without it)
    lenient_before / lenient_after
                             held-out lenient accuracy (the task's `lenient_accuracy`: reasoning-gym
                             tasks score the last line or number too; None for a task without it)
    eos_after                held-out share of greedy completions ending with a stop token, after
    reward_final             mean of r_s over the last 10 % of steps (≥ 1): summary's reward_mean_last
    reward_auc               (1/S) Σ_s r_s: the area under the reward-vs-step curve per step
    kl                       KL to the reference per sequence, mean over the last 10 % of steps
    response_len             (1/S) Σ_s (tokens of step s / rows of step s)
    sec_per_step             (1/S) Σ_s t_s (rollout + reward + advantage + update; evaluation excluded)
    tokens_per_s             Σ_s n_s / Σ_s t_s
    peak_rss_mib             peak resident memory during the run (reset before each run)
    peak_device_mib          peak CUDA memory allocated by torch during the run (None on CPU)
    adv_std                  (1/S) Σ_s std of the advantages over the trained tokens of step s
    grad_norm_var, grad_var, grad_rel_var
                             (1/S') Σ_s of the actor's minibatch-gradient noise of step s
                             (step/grad_stats.py), over the S' steps where it is defined
    prompts_seen             prompts read from the stream (S · B)

Per run and task of a mixture (`per_task`): `<metric>/<task>` before and after, from summary.json's
`eval_<metric>/<task>_before/after` (metric: accuracy, strict_accuracy, lenient_accuracy).

Per algorithm each is mean ± std over seeds (std with n − 1; None for one seed).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from ..run.folder import Run
from .plan import Plan

COLUMNS = ("acc_before", "acc_after", "strict_before", "strict_after", "lenient_before", "lenient_after", "eos_after", "reward_final", "reward_auc",
           "kl", "response_len", "sec_per_step", "tokens_per_s", "peak_rss_mib", "peak_device_mib", "adv_std", "grad_norm_var", "grad_var",
           "grad_rel_var", "prompts_seen")


def _mean(values: Iterable[Any]) -> float | None:
    xs = [float(v) for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def run_metrics(run: Run) -> dict[str, Any]:
    """The per-run numbers defined in the module docstring."""
    rows, s = run.metrics, run.summary or {}
    seconds = sum(r.get("step_time_s", 0.0) for r in rows)
    return {
        "acc_before": s.get("eval_accuracy_before"),
        "acc_after": s.get("eval_accuracy_after"),
        "strict_before": s.get("eval_strict_accuracy_before"),
        "strict_after": s.get("eval_strict_accuracy_after"),
        "lenient_before": s.get("eval_lenient_accuracy_before"),
        "lenient_after": s.get("eval_lenient_accuracy_after"),
        "eos_after": s.get("eval_eos_rate_after"),
        "reward_final": s.get("reward_mean_last"),
        "reward_auc": _mean(r["reward_mean"] for r in rows),
        "kl": s.get("kl_last"),
        "response_len": _mean(r.get("response_len") for r in rows),
        "sec_per_step": _mean(r.get("step_time_s") for r in rows),
        "tokens_per_s": sum(r.get("tokens", 0) for r in rows) / seconds if seconds > 0 else None,
        "peak_rss_mib": s.get("peak_rss_mib"),
        "peak_device_mib": s.get("peak_device_mib"),
        "adv_std": _mean(r.get("adv_std") for r in rows),
        "grad_norm_var": _mean(r.get("actor_grad_norm_var") for r in rows),
        "grad_var": _mean(r.get("actor_grad_var") for r in rows),
        "grad_rel_var": _mean(r.get("actor_grad_rel_var") for r in rows),
        "prompts_seen": rows[-1].get("prompts_seen") if rows else 0,
    }


def per_task(run: Run) -> dict[str, dict[str, Any]]:
    """{task: {'<metric>_before'/'<metric>_after': value}} of a mixture's run (summary keys
    `eval_<metric>/<task>_<when>`); {} for a run of one task."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in (run.summary or {}).items():
        if key.startswith("eval_") and "/" in key and key.endswith(("_before", "_after")):
            head, when = key.rsplit("_", 1)
            metric, task = head[len("eval_"):].split("/", 1)
            out.setdefault(task, {})[f"{metric}_{when}"] = value
    return out


def mean_std(values: list[Any]) -> dict[str, Any]:
    """{'mean', 'std' (n − 1; None when n < 2), 'n', 'values'} over the non-None values."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"mean": None, "std": None, "n": 0, "values": values}
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None
    return {"mean": mean, "std": std, "n": len(xs), "values": values}


def by_algo(plan: Plan, per_run: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{algo: {column: mean_std over its seeds}}."""
    out: dict[str, dict[str, Any]] = {}
    for algo in plan.algos:
        names = [r.name for r in plan.runs if r.algo == algo]
        out[algo] = {c: mean_std([per_run[n][c] for n in names]) for c in COLUMNS}
    return out


def tasks_by_algo(plan: Plan, runs: dict[str, Run]) -> dict[str, dict[str, dict[str, Any]]]:
    """{algo: {task: {'<metric>_<when>': mean_std over its seeds}}} of a mixture's runs ({} otherwise)."""
    per_run = {name: per_task(run) for name, run in runs.items()}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for algo in plan.algos:
        names = [r.name for r in plan.runs if r.algo == algo and r.name in per_run]
        tasks = list(dict.fromkeys(t for n in names for t in per_run[n]))
        keys = {t: list(dict.fromkeys(k for n in names for k in per_run[n].get(t, {}))) for t in tasks}
        if tasks:
            out[algo] = {t: {k: mean_std([per_run[n].get(t, {}).get(k) for n in names]) for k in keys[t]} for t in tasks}
    return out


def _boundaries(run: Run) -> dict[int, int] | None:
    """{prompts read so far: Σ of the step digests so far mod 2^64} at every step end; None if unlogged."""
    out, total = {}, 0
    for r in run.metrics:
        if r.get("prompt_digest") is None or r.get("prompts_seen") is None:
            return None
        total = (total + int(r["prompt_digest"], 16)) % 2**64
        out[int(r["prompts_seen"])] = total
    return out


def check_prompts(plan: Plan, runs: dict[str, Run]) -> dict[str, Any]:
    """Per seed: did every run read the same train rows at the same stream positions?

    The per-step digests (run/data.py) add up over steps, so at every prompt count that ends a
    step in all runs of the seed, the running sums must agree. `checked` is the largest such count.
    """
    seeds: dict[str, Any] = {}
    for seed in plan.seeds:
        marks = [_boundaries(runs[r.name]) for r in plan.runs if r.seed == seed]
        if any(m is None for m in marks):
            seeds[str(seed)] = {"identical": None, "checked": 0}
            continue
        common = set.intersection(*(set(m) for m in marks))  # type: ignore[union-attr]
        same = all(len({m[c] for m in marks}) == 1 for c in common)  # type: ignore[index]
        seeds[str(seed)] = {"identical": same if common else None, "checked": max(common, default=0)}
    verdicts = [v["identical"] for v in seeds.values()]
    overall = False if False in verdicts else True if all(v is True for v in verdicts) else None
    return {"identical": overall, "seeds": seeds}
