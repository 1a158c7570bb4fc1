"""Reward curves of llmrl GRPO and TRL's GRPOTrainer on issue 8's configuration, several seeds.

Issue 8's target "same reward curve within noise": both learn on the same configuration (the one
bench/vs_trl.py builds: SmolLM2-135M-Instruct, LoRA r=16 on q,k,v,o, 2 prompts × 4 samples, 32 new
tokens, β=0.04 k3 in the loss, temperature 1, lr 1e-5, llmrl's `numeric` reward on `chat_sum`
prompts, TRL's defaults aligned to llmrl's: see `trl_args` in bench/contenders/trl_grpo.py) and TRL reads llmrl's prompts in
llmrl's order. Timings are not the point: every run is a subprocess of bench/vs_trl.py with one
torch thread, `--parallel N` of them at once.

    python bench/reward_curve.py --steps 40 --seeds 0,1 --parallel 2 --out bench/results/reward-curve.json

Writes the JSON (per contender and seed: per-step mean reward, completion length, prompts, the
trainers' own metrics rows), a summary with a verdict, and a PNG of the smoothed curves next to the
JSON (same name, .png).

Summary statistics: the per-step mean reward r_{s,k} (8 completions) of seed s, step k is one
observation; per contender, mean = mean over steps × seeds and SE = sd / √n over those n values (over
all steps, and over the last half k ≥ K/2). difference = mean_llmrl − mean_TRL ± √(SE_llmrl² +
SE_TRL²); "within 2 SE" when |difference| ≤ 2 SE. The steps of one run are not independent draws
(the policy drifts, and both contenders see the same prompt at step k), so this SE is a rough guide.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `bench.vs_trl`
import bench.vs_trl as vs  # noqa: E402  (bench/vs_trl.py: the child runs)
from bench.contenders import shared  # noqa: E402  (the configuration, the run's threads)

CONTENDERS = ["llmrl-grpo-defaults", "trl-grpo"]
SAMPLING_NOTE = (
    "Sampling differs in the draws, not in the distribution: both sample softmax(logits / 1.0) over the full "
    "vocabulary (top_p 1, top_k 0) in fp32 and stop at <|im_end|> (id 2) or 32 tokens. llmrl draws each token by "
    "inverse CDF from its own counter-based uniforms, a function of (seed, step, prompt, sample) only, in its own "
    "KV-cache decode loop; TRL calls HF generate, which draws with torch.multinomial from the global torch "
    "generator seeded once by set_seed(seed), so its draws depend on the whole history of the run. The same seed "
    "therefore gives different completions in llmrl and TRL, and the LoRA A init (random, B = 0) differs too; "
    "only the distribution at step 0 is the same."
)


def run_all(names: list[str], seeds: list[int], a: argparse.Namespace, model: str) -> list[dict[str, Any]]:
    """Every (seed, contender) run, `a.parallel` at a time; the contenders of one seed are adjacent so
    that with --parallel 2 llmrl and TRL share the CPU at the same time."""
    jobs = [(seed, name) for seed in seeds for name in names]

    def one(job: tuple[int, str]) -> dict[str, Any]:
        seed, name = job
        r = vs.run_child(name, model, a.steps, a.timeout, dtype=a.dtype, seed=seed, lr=a.lr)
        if r is None:
            return {"name": name, "seed": seed, "failed": True}
        later = r["step_s"][1:] or r["step_s"]  # the first step is a warm-up
        print(f"{name} seed {seed}: wall {r['wall_s']:.0f} s, median s/step {statistics.median(later):.2f}, "
              f"mean reward {statistics.mean(r['reward']):.3f}", flush=True)
        return {"name": name, "seed": seed, **r}

    with ThreadPoolExecutor(max_workers=a.parallel) as pool:
        return list(pool.map(one, jobs))


def mean_se(xs: list[float]) -> tuple[float, float, int]:
    """(mean, standard error sd/√n, n); SE is nan for n < 2."""
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0
    return statistics.mean(xs), (statistics.stdev(xs) / math.sqrt(n) if n > 1 else math.nan), n


def summarise(runs: list[dict[str, Any]], names: list[str], steps: int) -> dict[str, Any]:
    """Per contender and window (all steps, last half): mean reward ± SE over steps × seeds, mean
    completion length; the llmrl − TRL difference and its verdict; whether the prompts matched."""
    ok = [r for r in runs if not r.get("failed")]
    half = steps // 2
    windows = {"all": range(0, steps), "last_half": range(half, steps)}
    table: dict[str, Any] = {}
    for name in names:
        mine = [r for r in ok if r["name"] == name]
        table[name] = {"seeds": sorted(r["seed"] for r in mine), "label": vs.LABELS.get(name, name)}
        for w, ks in windows.items():
            rewards = [r["reward"][k] for r in mine for k in ks if k < len(r["reward"])]
            lengths = [r["completion_len"][k] for r in mine for k in ks if k < len(r["completion_len"])]
            m, se, n = mean_se(rewards)
            table[name][w] = {"reward_mean": m, "reward_se": se, "n": n,
                              "completion_len_mean": statistics.mean(lengths) if lengths else math.nan}
        table[name]["s_per_step_median"] = statistics.median([x for r in mine for x in r["step_s"][1:]] or [math.nan])
    verdicts: dict[str, Any] = {}
    ours = [n for n in names if n.startswith("llmrl-")]
    theirs = [n for n in names if n.startswith("trl-")]
    for a_name in ours:
        for b_name in theirs:
            for w in windows:
                a, b = table[a_name][w], table[b_name][w]
                diff, se = a["reward_mean"] - b["reward_mean"], math.hypot(a["reward_se"], b["reward_se"])
                within = abs(diff) <= 2 * se if math.isfinite(se) else None
                line = (f"difference {diff:+.3f} ± {se:.3f} ({'within' if within else 'outside'} 2 SE)"
                        if within is not None else f"difference {diff:+.3f} (no SE: fewer than 2 values per contender)")
                verdicts[f"{a_name} - {b_name} ({w})"] = {"difference": diff, "se": se, "within_2se": within,
                                                          "line": line}
    return {"table": table, "verdicts": verdicts, "same_prompts": same_prompts(ok, ours, theirs),
            "last_half_from_step": half + 1}


def same_prompts(runs: list[dict[str, Any]], ours: list[str], theirs: list[str]) -> dict[str, bool]:
    """Per seed: did every llmrl and TRL run of that seed read the same questions at every step?"""
    out: dict[str, bool] = {}
    for seed in sorted({r["seed"] for r in runs}):
        seqs = [r["prompts"] for r in runs if r["seed"] == seed and r["name"] in ours + theirs]
        out[str(seed)] = len(seqs) > 1 and all(s == seqs[0] for s in seqs)
    return out


def smooth(xs: list[float], w: int) -> list[float]:
    """Trailing moving average over up to `w` points (the first points average what there is)."""
    return [statistics.mean(xs[max(0, i - w + 1): i + 1]) for i in range(len(xs))]


def plot(runs: list[dict[str, Any]], names: list[str], steps: int, path: Path, title: str) -> None:
    """Two panels (reward, completion length): thin lines per seed, thick the mean over seeds, all
    smoothed by a trailing moving average of max(1, K // 8) steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = max(1, steps // 8)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, name in enumerate(names):
        mine = [r for r in runs if r["name"] == name and not r.get("failed")]
        if not mine:
            continue
        color = f"C{i}"
        for ax, key in zip(axes, ("reward", "completion_len")):
            for r in mine:
                ax.plot(range(1, len(r[key]) + 1), smooth(r[key], w), color=color, alpha=0.3, lw=0.8)
            n = min(len(r[key]) for r in mine)
            mean = [statistics.mean(r[key][k] for r in mine) for k in range(n)]
            ax.plot(range(1, n + 1), smooth(mean, w), color=color, lw=2,
                    label=f"{vs.LABELS.get(name, name)} ({len(mine)} seeds)")
    axes[0].set(xlabel="step", ylabel=f"mean reward (moving average of {w})", title="reward")
    axes[1].set(xlabel="step", ylabel="tokens", title="completion length")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_summary(summary: dict[str, Any], dtype: str) -> None:
    half = summary["last_half_from_step"]
    print(f"\ndtype {dtype}; mean reward ± SE over steps × seeds (last half: steps ≥ {half})")
    print(f"{'contender':<21}{'all steps':>16}{'last half':>16}{'len all':>9}{'s/step':>8}  seeds")
    for name, t in summary["table"].items():
        a, b = t["all"], t["last_half"]
        print(f"{name:<21}{a['reward_mean']:>9.3f} ± {a['reward_se']:.3f}{b['reward_mean']:>9.3f} ± {b['reward_se']:.3f}"
              f"{a['completion_len_mean']:>9.1f}{t['s_per_step_median']:>8.1f}  {t['seeds']}")
    print("same prompts at every step (per seed):", summary["same_prompts"])
    for k, v in summary["verdicts"].items():
        print(f"{k}: {v['line']}")
    print("\nnote:", SAMPLING_NOTE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=shared.MODEL)
    ap.add_argument("--steps", type=int, default=40, help="training steps per run (K)")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once (each with one torch thread)")
    ap.add_argument("--only", default=",".join(CONTENDERS), help="comma-separated contenders of bench/vs_trl.py")
    ap.add_argument("--dtype", choices=shared.DTYPES, default="float32")
    ap.add_argument("--lr", type=float, default=shared.LR)
    ap.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per run")
    ap.add_argument("--out", default="bench/results/reward-curve.json", help="JSON path; the PNG goes next to it")
    a = ap.parse_args()
    if a.steps < 1 or a.parallel < 1:
        raise SystemExit("--steps and --parallel must be at least 1.")
    names = [n for n in a.only.split(",") if n]
    bad = [n for n in names if n not in vs.LLMRL and n not in ("trl-grpo", "trl-rloo")]
    if bad:
        raise SystemExit(f"unknown contender(s) {', '.join(bad)}; valid: {', '.join([*vs.LLMRL, 'trl-grpo', 'trl-rloo'])}")
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    shared.THREADS = 1
    model = str(Path(os.path.expanduser(a.model)))
    t0 = time.perf_counter()
    runs = run_all(names, seeds, a, model)
    summary = summarise(runs, names, a.steps)
    print_summary(summary, a.dtype)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    title = (f"issue 8 config, {a.dtype}, lr {a.lr:g}, {a.steps} steps, seeds {seeds}; "
             f"TRL: constant lr, scale_rewards=group, loss_type=dapo, llmrl's prompt order")
    plot(runs, names, a.steps, out.with_suffix(".png"), title)
    common = {k: v for k, v in vs.run_config(model, a.dtype, 0, a.lr, False).items() if k != "seed"}
    result = {"config": {**common,
                         "seeds": seeds, "steps": a.steps, "parallel": a.parallel, "contenders": names},
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": vs.machine(),
              "total_wall_s": time.perf_counter() - t0, "summary": summary, "sampling_note": SAMPLING_NOTE,
              "runs": runs}
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
