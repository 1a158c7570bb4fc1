"""The end of a run: summary.json's headline numbers and curves.png."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from ..config import Config
from .evaluate import EvalResult
from .folder import read_run
from .memory import peak_device_mib, peak_rss_mib


def summarize(config: Config, history: list[dict[str, Any]], before: EvalResult | None,
              after: EvalResult | None, wall: float, path: Path) -> dict[str, Any]:
    """summary.json: the run's headline numbers. `*_last` average the last 10 % of steps (≥ 1);
    `eval_<metric>_before/after` are the evaluations' `metrics` (EvalResult)."""
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
        "reward_mean_first": history[0]["reward_mean"] if history else None,
        "reward_mean_last": mean("reward_mean"),
        "kl_last": mean("kl"),
        "tokens_total": sum(r["tokens"] for r in history),
        "step_time_s_mean": sum(r["step_time_s"] for r in history) / max(len(history), 1),
        "wall_time_s": wall,
        "peak_rss_mib": peak_rss_mib(),
        "peak_device_mib": peak_device_mib(config.model.device),
        "run_dir": str(path),
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
