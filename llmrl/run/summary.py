"""The end of a run: summary.json's headline numbers and curves.png."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from ..config import Config
from .evaluate import EvalResult
from .folder import read_run
from .memory import peak_device_mib, peak_rss_mib


LEGITIMATE = "dynamic sampling"
"""How `no_update` begins when the run applied no update for a legitimate reason (exit 0): every step's
groups were dropped by rollout.filter_groups. Any other reason is a failed run (exit 1, run/loop.py)."""


def optimizer_steps(opt: Any) -> int:
    """How many steps `opt` (an AdamW) has taken over the whole run, resumes included: its per-parameter
    `step` count, which a checkpoint saves and restores; 0 when it never stepped (no state yet)."""
    steps = [int(st["step"]) for st in opt.state.values() if "step" in st]
    return max(steps, default=0)


def no_update_reason(history: list[dict[str, Any]], updates: int) -> str | None:
    """None when the actor was updated at least once; else why not, from the metrics rows: every step's
    groups dropped by dynamic sampling (legitimate: LEGITIMATE), or every pass skipped for a non-finite
    loss or gradient, or both."""
    if updates > 0:
        return None
    dropped = sum(1 for r in history if r.get("groups_kept") == 0)
    skipped = sum(1 for r in history if r.get("groups_kept") != 0 and r.get("skipped_updates"))
    if history and dropped == len(history):
        return (f"{LEGITIMATE} (rollout.filter_groups) dropped every group of all {dropped} steps, each prompt's "
                "samples having the same reward, so no step had anything to learn from")
    if history and skipped == len(history):
        return (f"every actor update pass of all {skipped} steps had a non-finite loss or gradient and was skipped "
                "(skipped_updates in metrics.jsonl)")
    if history and dropped + skipped == len(history):
        return (f"every actor update pass of {skipped} steps had a non-finite loss or gradient (skipped_updates in "
                f"metrics.jsonl) and dynamic sampling dropped every group of the other {dropped}")
    return "the actor's optimizer never took a step"


def summarize(config: Config, history: list[dict[str, Any]], before: EvalResult | None,
              after: EvalResult | None, wall: float, path: Path, updates: int | None = None,
              peaks: dict[str, float] | None = None, predicted_peak: int | None = None) -> dict[str, Any]:
    """summary.json: the run's headline numbers. `*_last` average the last 10 % of steps (≥ 1);
    `eval_<metric>_before/after` are the evaluations' `metrics` (EvalResult). `updates`: the actor's
    optimizer steps over the run (`optimizer_steps`), `updates_applied`; `no_update` says why there
    were none (`no_update_reason`), null when there were. `peaks`: the run's peak memory of each phase
    (`PhasePeaks.run`: `peak_rss_load_mib`, `peak_rss_evaluate_mib`, …, each ≤ `peak_rss_mib`);
    `predicted_peak`: the memory plan's peak in bytes (memory/plan.py), `predicted_peak_mib`."""
    tail = history[-max(1, len(history) // 10):]
    names = sorted({*(before.metrics if before else {}), *(after.metrics if after else {})})
    metrics = {f"eval_{k}_{when}": (r.metrics.get(k) if r else None)
               for k in names for when, r in (("before", before), ("after", after))}
    mean = lambda key: (sum(r[key] for r in tail) / len(tail)) if tail and tail[0].get(key) is not None else None  # noqa: E731
    return {
        "algo": config.algo,
        "estimator": config.estimator.name,
        "task": config.data.dataset or config.task,
        "model": config.model.name,
        "seed": config.seed,
        "steps": len(history),
        "eval_accuracy_before": before.accuracy if before else None,
        "eval_accuracy_after": after.accuracy if after else None,
        "eval_reward_before": before.reward_mean if before else None,
        "eval_reward_after": after.reward_mean if after else None,
        **metrics,  # eval_strict_accuracy_before/after (a task's metrics), eval_eos_rate_*, eval_response_len_*
        "eval_prompts": len(after.completions) if after else None,  # held out and decoded: ≤ eval.size
        "reward_mean_first": history[0]["reward_mean"] if history else None,
        "reward_mean_last": mean("reward_mean"),
        "kl_last": mean("kl"),
        "tokens_total": sum(r["tokens"] for r in history),
        "step_time_s_mean": sum(r["step_time_s"] for r in history) / max(len(history), 1),
        "wall_time_s": wall,
        "peak_rss_mib": peak_rss_mib(),
        "predicted_peak_mib": None if predicted_peak is None else round(predicted_peak / 2**20, 1),  # memory/plan.py
        "peak_device_mib": peak_device_mib(config.model.device),
        **(peaks or {}),
        "run_dir": str(path),
        "updates_applied": updates,
        "no_update": None if updates is None else no_update_reason(history, updates),
    }


def eval_scalars(result: EvalResult) -> dict[str, Any]:
    return {"eval_accuracy": result.accuracy, "eval_reward": result.reward_mean,
            **{f"eval_{k}": v for k, v in result.metrics.items()}}


def draw_curves(path: Path) -> None:
    """RUN/curves.png: reward, KL and held-out accuracy vs step. A plotting failure never fails a
    finished run: it becomes a warning (`llmrl plot RUN` can draw it again)."""
    try:
        from .plots import draw_runs  # late: matplotlib is only needed at the end

        draw_runs([read_run(path)], path / "curves.png")
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"could not draw {path / 'curves.png'}: {exc}", stacklevel=2)
