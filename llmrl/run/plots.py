"""PNG plots of finished (or running) runs with matplotlib's Agg canvas (no display, no pyplot state).

    draw_runs(runs, path)            reward, KL and held-out accuracy vs step, one line per run
                                     (`llmrl plot`, and curves.png at the end of `llmrl train`)
    draw_compare(groups, folder)     the four plots of `llmrl compare`, one line per algorithm:
                                     mean over seeds with a ±1 std band

Reward curves are smoothed by a trailing moving average over w = max(1, S // 25) steps (S = steps
shown); the raw per-step reward of a single run is drawn faintly behind its smoothed line. Step axes
have whole-number ticks only; accuracy axes run over [0, 1].
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..errors import ConfigError
from .folder import Run

FORMATS = (".png", ".svg", ".pdf")


def smooth(values: Sequence[float], window: int | None = None) -> np.ndarray:
    """Trailing moving average: out[i] = mean(values[max(0, i−w+1) : i+1]), w = max(1, len // 25)."""
    x = np.asarray(values, dtype=float)
    w = window or max(1, len(x) // 25)
    csum = np.cumsum(np.insert(x, 0, 0.0))
    lo = np.maximum(np.arange(len(x)) + 1 - w, 0)
    return (csum[1:] - csum[lo]) / (np.arange(len(x)) + 1 - lo)


def series(run: Run, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of metric `key`, skipping steps where it is missing or None."""
    rows = [r for r in run.metrics if r.get(key) is not None]
    return np.array([r["step"] for r in rows], dtype=float), np.array([r[key] for r in rows], dtype=float)


def accuracy_points(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Held-out accuracy at step 0 (before), at every intermediate evaluation, and at the end (after)."""
    points = [(float(r["step"]), r["eval_accuracy"]) for r in run.metrics if r.get("eval_accuracy") is not None]
    s = run.summary or {}
    if s.get("eval_accuracy_before") is not None:
        points.insert(0, (0.0, s["eval_accuracy_before"]))
    if s.get("eval_accuracy_after") is not None:
        points.append((float(s["steps"]), s["eval_accuracy_after"]))
    return np.array([p[0] for p in points]), np.array([p[1] for p in points], dtype=float)


def wall_clock(run: Run) -> np.ndarray:
    """Seconds of training (Σ step_time_s, evaluations excluded) at the end of each logged step."""
    return np.cumsum([r.get("step_time_s", 0.0) for r in run.metrics])


def label_of(run: Run) -> str:
    return run.path.name or str(run.path)


def check_target(path: Path) -> None:
    if path.suffix.lower() not in FORMATS:
        raise ConfigError(f"Plot file '{path}' must end in {', '.join(FORMATS)}.")


def _save(fig: Figure, path: Path) -> Path:
    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


def step_axis(ax: Axes) -> None:
    """Ticks at whole steps only (a 2-step run would otherwise get 1.0, 1.2, …, 2.0)."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def accuracy_axis(ax: Axes) -> None:
    """An accuracy (a share of prompts) runs from 0 to 1, whatever matplotlib's margins or ±std bars do."""
    ax.set_ylim(0.0, 1.0)


def _axes(title: str, xlabel: str, ylabel: str, size: tuple[float, float] = (7, 4)) -> tuple[Figure, Axes]:
    fig = Figure(figsize=size, layout="constrained")
    ax = fig.add_subplot()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def draw_runs(runs: Sequence[Run], path: Path, labels: Sequence[str] | None = None) -> Path:
    """`runs_figure` saved to `path`."""
    return _save(runs_figure(runs, labels), path)


def runs_figure(runs: Sequence[Run], labels: Sequence[str] | None = None) -> Figure:
    """Three panels (train reward, KL to the reference, held-out accuracy) vs step, one line per run."""
    if not runs:
        raise ConfigError("Nothing to plot: no runs given.")
    labels = list(labels or [label_of(r) for r in runs])
    gold = any(gold_proxy(r)[0].size for r in runs)  # a learned reward beside the task's verifier
    fig = Figure(figsize=(17 if gold else 13, 3.8), layout="constrained")
    axes = fig.subplots(1, 4 if gold else 3)
    for ax, title, ylabel in zip(axes, ("train reward", "KL to reference (per sequence)", "held-out accuracy (greedy)"),
                                 ("mean reward", "KL", "accuracy")):
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
    for i, (run, name) in enumerate(zip(runs, labels)):
        color = f"C{i % 10}"
        x, y = series(run, "reward_mean")
        if len(runs) == 1 and len(x):
            axes[0].plot(x, y, color=color, alpha=0.25, lw=0.8)
        if len(x):
            axes[0].plot(x, smooth(y), color=color, label=name)
        x, y = series(run, "kl")
        if len(x):
            axes[1].plot(x, smooth(y), color=color, label=name)
        x, y = accuracy_points(run)
        if len(x):
            axes[2].plot(x, y, "o-", color=color, label=name, clip_on=False)  # points at 0 or 1 drawn whole
    for ax in axes[:3]:
        step_axis(ax)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    accuracy_axis(axes[2])
    if gold:
        draw_gold_proxy(axes[3], runs, labels)
    return fig


def gold_proxy(run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(KL, gold, proxy) at each evaluation that reports the task's verifier beside a learned reward:
    KL the mean per-sequence KL to the reference at that step (0 before the first), gold its
    `eval_gold_accuracy` (the summary's before and after too), proxy `eval_reward` (the reward model's mean score, docs/reward-models.md)."""
    s, kl = run.summary or {}, 0.0
    out = [(0.0, s["eval_gold_accuracy_before"], s.get("eval_reward_before", np.nan))] \
        if s.get("eval_gold_accuracy_before") is not None else []
    for r in run.metrics:
        kl = r.get("kl", kl) if r.get("kl") is not None else kl
        if r.get("eval_gold_accuracy") is not None:
            out.append((kl, r["eval_gold_accuracy"], r.get("eval_reward", np.nan)))
    if s.get("eval_gold_accuracy_after") is not None:
        out.append((kl, s["eval_gold_accuracy_after"], s.get("eval_reward_after", np.nan)))
    arr = np.array(out, dtype=float).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def draw_gold_proxy(ax: Axes, runs: Sequence[Run], labels: Sequence[str]) -> None:
    """Gold accuracy (solid, left axis) and the proxy's mean score (dashed, right axis) against KL."""
    twin = ax.twinx()
    ax.set(title="gold and proxy against KL", xlabel="KL to reference (per sequence)", ylabel="gold accuracy")
    twin.set_ylabel("proxy: reward model's mean score")
    for i, (run, name) in enumerate(zip(runs, labels)):
        kl, gold, proxy = gold_proxy(run)
        if kl.size:
            ax.plot(kl, gold, "o-", color=f"C{i % 10}", label=f"{name} gold")
            twin.plot(kl, proxy, "s--", color=f"C{i % 10}", alpha=0.7, label=f"{name} proxy")
    accuracy_axis(ax)
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles, [h.get_label() for h in handles], fontsize=8)


def _mean_band(curves: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std (ddof=1; 0 for one curve) over equal-length prefixes of `curves`."""
    n = min(len(c) for c in curves)
    stack = np.stack([c[:n] for c in curves])
    std = stack.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(n)
    return stack.mean(axis=0), std


def _group_lines(ax: Axes, groups: dict[str, list[Run]], key: str, x_of) -> None:
    for i, (algo, runs) in enumerate(groups.items()):
        pairs = [(x_of(r), smooth(y)) for r in runs if len(y := series(r, key)[1])]
        if not pairs:
            continue
        mean, std = _mean_band([y for _, y in pairs])
        x = _mean_band([x for x, _ in pairs])[0][: len(mean)]  # seeds' x averaged (wall time differs)
        mean, std = mean[: len(x)], std[: len(x)]
        ax.plot(x, mean, color=f"C{i % 10}", label=f"{algo} (n={len(pairs)})")
        ax.fill_between(x, mean - std, mean + std, color=f"C{i % 10}", alpha=0.2, lw=0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _steps_of(run: Run) -> np.ndarray:
    return np.array([r["step"] for r in run.metrics], dtype=float)


def _kl_steps(run: Run) -> np.ndarray:
    return series(run, "kl")[0]


def accuracy_figure(groups: dict[str, list[Run]]) -> Figure:
    """Bars of held-out accuracy before and after per algorithm: mean over seeds, ±1 std error bars."""
    fig, ax = _axes("held-out accuracy (greedy), mean ± std over seeds", "", "accuracy")
    names = list(groups)
    x = np.arange(len(names))
    for offset, key, label, alpha in ((-0.2, "eval_accuracy_before", "before", 0.45), (0.2, "eval_accuracy_after", "after", 1.0)):
        means, stds = [], []
        for algo in names:
            vals = [r.summary[key] for r in groups[algo] if r.summary and r.summary.get(key) is not None]
            means.append(float(np.mean(vals)) if vals else np.nan)
            stds.append(float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0)
        bars = ax.bar(x + offset, means, 0.4, yerr=stds, capsize=4, alpha=alpha,
                      color=[f"C{i % 10}" for i in range(len(names))])
        ax.bar_label(bars, labels=["" if np.isnan(m) else f"{100 * m:.1f}" for m in means], fontsize=7, padding=2)
    ax.set_xticks(x, names)
    ax.legend(handles=[Patch(facecolor="grey", alpha=0.45, label="before"), Patch(facecolor="grey", label="after")], fontsize=8)
    accuracy_axis(ax)
    return fig


def compare_figures(groups: dict[str, list[Run]]) -> dict[str, Figure]:
    """reward_vs_step, reward_vs_time, kl_vs_step and accuracy, one line (or bar) per algorithm."""
    out: dict[str, Figure] = {}
    fig, ax = _axes("train reward vs step (mean ± std over seeds)", "step", "mean reward")
    _group_lines(ax, groups, "reward_mean", _steps_of)
    step_axis(ax)
    out["reward_vs_step"] = fig
    fig, ax = _axes("train reward vs wall time (mean ± std over seeds)", "training seconds (evaluation excluded)", "mean reward")
    _group_lines(ax, groups, "reward_mean", wall_clock)
    out["reward_vs_time"] = fig
    fig, ax = _axes("KL to reference vs step (mean ± std over seeds)", "step", "KL per sequence")
    _group_lines(ax, groups, "kl", _kl_steps)
    step_axis(ax)
    out["kl_vs_step"] = fig
    out["accuracy"] = accuracy_figure(groups)
    return out


def draw_compare(groups: dict[str, list[Run]], folder: Path) -> dict[str, Path]:
    """reward_vs_step.png, reward_vs_time.png, kl_vs_step.png, accuracy.png under `folder`."""
    return {name: _save(fig, folder / f"{name}.png") for name, fig in compare_figures(groups).items()}
