"""llmrl against TRL on one configuration, side by side: seconds per step, generated tokens per
second, peak RSS, and llmrl's step time against the floor of its own algorithm.

Configuration (issue 8): SmolLM2-135M-Instruct, LoRA r=16 (α=32) on q,k,v,o, 2 prompts × 4 samples,
32 new tokens, β=0.04 (KL k3 in the loss), one update per batch, temperature 1, fp32 (or bf16 with
`--dtype bfloat16`, for every contender alike), chat prompts "What is a+b?" (a, b in 1..20, llmrl's
`chat_sum` train split, TRL gets llmrl's own prompt order), reward 1.0 when the last number of the
completion is the sum (llmrl's `numeric` reward, given to TRL too). TRL runs with its defaults
aligned to llmrl's (see `trl_args`): constant learning rate, no gradient checkpointing, no autocast.

Every contender runs in its own subprocess (peak RSS = VmHWM of that process), with
torch.set_num_threads(THREADS); repetitions alternate the contenders (A, B, C, A, B, C, ...), so a
slow patch of a shared CPU hits all of them. A step is timed end to end (rollout, reward, update);
the first step of each run is a warm-up and is not counted.

This file is the runner (the command line, one child process per contender and repetition, the
table); each contender is a module of bench/contenders/ (llmrl_run, trl_grpo, trl_ppo, vllm_generate,
bound), imported only in its own child, on the configuration of contenders/shared.py.

    python bench/vs_trl.py --model PATH --out bench-results.json [--steps 4] [--reps 2] [--dtype bfloat16]
        [--device cuda]

A contender named `NAME@DTYPE` in --only runs in that dtype instead of --dtype (e.g.
`--only llmrl-grpo-fast,llmrl-grpo-fast@bfloat16,trl-grpo,trl-grpo@bfloat16`: both dtypes of both
tools alternated in one run); "fastest TRL" is then the fastest TRL row of either dtype.

`--device cuda` runs every contender on the GPU (llmrl model.device, TRL use_cpu=False): each timed
step is bracketed by torch.cuda.synchronize(), and each child also reports its peak GPU memory
(torch.cuda.max_memory_allocated, and _reserved: what the caching allocator held) next to its RSS.

Contenders: llmrl-grpo-defaults (no performance switch set: what the engine's defaults give, here
update.on_policy_logprobs=auto → on), llmrl-grpo (update.on_policy_logprobs=off pinned: log π_old
then comes from the decoding logits, rollout.generation_logprobs), llmrl-grpo-fast (=on), llmrl-rloo-fast,
trl-grpo, trl-rloo, llmrl-ppo (actor + critic + reference on one base), llmrl-ppo-top4 (the same with the
opt-in lora.critic_layers=4; only when named in --only), trl-ppo, bound (plain HF generate,
llmrl's own generate, one no-grad forward, one LoRA forward + backward); llmrl-grpo-fast-adapters
(llmrl-grpo-fast decoding through the adapters, engine.merge_lora=false; only when named in --only). TRL is optional
(`pip install -e '.[bench]'`); without it the TRL rows are skipped.

vLLM contenders (issue 15; run when named in --only, with an interpreter that has vLLM and TRL, e.g.
`.venv-vllm/bin/pip install trl` then `.venv-vllm/bin/python bench/vs_trl.py --only ...`):
llmrl-vllm (llmrl-grpo-fast with `--engine vllm`, the engine in --dtype, merged-weight sync),
llmrl-vllm-adapter (the same with engine.sync=adapter: the LoRA adapter served by vLLM on
its unmerged base), llmrl-vllm-bf16 (the same with engine.dtype=bfloat16 under a --dtype trainer), trl-grpo-vllm (TRL's
GRPOTrainer with use_vllm=True, vllm_mode="colocate"), vllm-generate (plain vLLM `LLM.generate` of
the same batch: what the llmrl engine's generate phase is compared with, tokens/s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `bench.contenders`
from bench.contenders import shared  # noqa: E402
from bench.contenders.llmrl_run import LLMRL  # noqa: E402
from bench.contenders.report import LABELS, print_table, ratios, split_contender, summarise  # noqa: E402
from bench.contenders.shared import (BETA, DEVICES, DTYPES, GENERATIONS, LR, MODEL, NEW_TOKENS, PROMPTS, SEED,  # noqa: E402
                                     TARGETS, gpu_memory_mib, vm_hwm_mib)

__all__ = ["LABELS", "LLMRL", "machine", "run_child", "run_config"]  # what reward_curve.py uses

CONTENDERS = ["llmrl-grpo-defaults", "llmrl-grpo", "llmrl-grpo-fast", "trl-grpo", "llmrl-rloo-fast", "trl-rloo",
              "llmrl-ppo", "trl-ppo", "bound"]
OPTIONAL = ["llmrl-ppo-top4", "llmrl-grpo-fast-adapters", "llmrl-grpo-nf4", "llmrl-ppo-nf4", "llmrl-vllm", "llmrl-vllm-adapter", "llmrl-vllm-bf16", "trl-grpo-vllm", "vllm-generate"]  # only when named in --only
VLLM = ["llmrl-vllm", "llmrl-vllm-adapter", "llmrl-vllm-bf16", "trl-grpo-vllm", "vllm-generate"]  # need vLLM (the .venv-vllm interpreter)


def child(name: str, model: str, steps: int, dtype: str = "float32", seed: int = SEED, lr: float = LR,
          trl_gc: bool = False) -> dict[str, Any]:
    import torch

    torch.set_num_threads(shared.THREADS)
    torch.manual_seed(seed)
    if name == "bound":
        from bench.contenders.bound import bound_run

        result = bound_run(model, max(steps - 1, 1), dtype)
    elif name == "trl-ppo":  # TRL 1.12 from bench/.trl-1.12: this process must not have imported TRL 1.16
        from bench.contenders.trl_ppo import trl_ppo_run

        result = trl_ppo_run(model, steps, shared.THREADS, dtype, device=shared.DEVICE)
    elif name == "vllm-generate":
        from bench.contenders.vllm_generate import vllm_generate_run

        result = vllm_generate_run(model, max(steps - 1, 1), dtype)
    elif name.startswith("trl-"):
        from bench.contenders.trl_grpo import trl_run

        result = trl_run(model, name.split("-")[1], steps, dtype, seed, lr, gradient_checkpointing=trl_gc,
                         use_vllm=name.endswith("-vllm"))
    elif name in LLMRL:
        from bench.contenders.llmrl_run import llmrl_run

        result = llmrl_run(model, name, steps, dtype, seed, lr)
    else:
        raise SystemExit(f"unknown contender '{name}'; valid: {', '.join(CONTENDERS + OPTIONAL)}")
    result.update(peak_rss_mib=vm_hwm_mib(), threads=torch.get_num_threads(), dtype=dtype, seed=seed,
                  device=shared.DEVICE, **gpu_memory_mib())
    return result


# ---- parent: alternate the contenders, then summarise ----------------------------------------------
FAILURES: list[dict[str, Any]] = []  # contender runs that failed or timed out: written into the result too


def run_child(name: str, model: str, steps: int, timeout: float, *, dtype: str = "float32", seed: int = SEED,
              lr: float = LR, trl_gc: bool = False) -> dict[str, Any] | None:
    """Run one contender in a fresh process of this script; its result dict, or None if it failed."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = Path(f.name)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--model", model, "--steps", str(steps),
           "--threads", str(shared.THREADS), "--device", shared.DEVICE, "--dtype", dtype, "--seed", str(seed),
           "--lr", repr(lr), "--child-out", str(path)]
    if trl_gc:
        cmd.append("--trl-gradient-checkpointing")
    env = {**os.environ, "OMP_NUM_THREADS": str(shared.THREADS), "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  {name} (seed {seed}): killed after {timeout:.0f} s", file=sys.stderr)
        FAILURES.append({"contender": name, "seed": seed, "timeout_s": timeout})
        return None
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"  {name} (seed {seed}): failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-3:]}",
              file=sys.stderr)
        FAILURES.append({"contender": name, "seed": seed, "exit": proc.returncode, "wall_s": wall,
                         "stderr_tail": proc.stderr.strip().splitlines()[-3:]})  # exit -9: the kernel's OOM killer
        return None
    result = json.loads(path.read_text())
    path.unlink()
    result["wall_s"] = wall
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--out", default=None, help="write the results JSON here")
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the first is a warm-up")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each contender, alternated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", choices=DEVICES, default="cpu", help="where every contender runs")
    ap.add_argument("--only", default=",".join(CONTENDERS),
                    help=f"comma-separated contenders (default: all but {', '.join(OPTIONAL)})")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per child run")
    ap.add_argument("--dtype", choices=DTYPES, default="float32",
                    help="weights dtype of every contender (llmrl model.dtype, TRL model_init_kwargs dtype, bound)")
    ap.add_argument("--seed", type=int, default=SEED, help="seed of every contender (llmrl seed, TRL seed)")
    ap.add_argument("--lr", type=float, default=LR, help="learning rate of every contender")
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="TRL's own default (recomputes the forward in the backward); off: like llmrl")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    shared.THREADS, shared.DEVICE = a.threads, a.device
    model = str(Path(os.path.expanduser(a.model)))
    if a.child:
        result = child(a.child, model, a.steps, a.dtype, a.seed, a.lr, a.trl_gradient_checkpointing)
        Path(a.child_out).write_text(json.dumps(result, default=str))
        return
    names = [n for n in a.only.split(",") if n]
    unknown = [n for n in names if split_contender(n)[0] not in CONTENDERS + OPTIONAL]
    if unknown:
        raise SystemExit(f"unknown contender '{unknown[0]}'; valid: {', '.join(CONTENDERS + OPTIONAL)}")
    bad = [n for n in names if (split_contender(n)[1] or a.dtype) not in DTYPES]
    if bad:
        raise SystemExit(f"unknown dtype in '{bad[0]}'; valid: {', '.join(DTYPES)}")
    try:
        import trl  # noqa: F401
    except ImportError:
        print("TRL is not installed (pip install -e '.[bench]'): skipping the TRL contenders", file=sys.stderr)
        names = [n for n in names if not n.startswith("trl-")]
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    t0 = time.perf_counter()
    for rep in range(a.reps):
        for name in names:
            base, dtype = split_contender(name)
            r = run_child(base, model, a.steps, a.timeout, dtype=dtype or a.dtype, seed=a.seed, lr=a.lr,
                          trl_gc=a.trl_gradient_checkpointing)
            if r is not None:
                runs[name].append(r)
                if a.out:  # what has run so far survives a run that is stopped at a time limit
                    Path(a.out).write_text(json.dumps({"partial": True, "command": " ".join(sys.argv), "runs": runs}))
                shown = r.get("step_s") or r.get("pieces_s")
                print(f"rep {rep + 1} {name}: wall {r['wall_s']:.0f} s, RSS {r['peak_rss_mib']:.0f} MiB, "
                      f"{json.dumps(shown)[:140]}", flush=True)
    table = summarise(runs)
    rat = ratios(table)
    print_table(table, rat, a.dtype)
    result = {"config": {**run_config(model, a.dtype, a.seed, a.lr, a.trl_gradient_checkpointing),
                         "steps": a.steps, "reps": a.reps, "device": a.device},
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine(),
              "total_wall_s": time.perf_counter() - t0, "table": table, "ratios": rat, "runs": runs,
              "failures": FAILURES}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
        print(f"\nwrote {a.out}")


def run_config(model: str, dtype: str, seed: int, lr: float, trl_gc: bool) -> dict[str, Any]:
    """The configuration every contender shares, as recorded in the results JSON."""
    return {"model": model, "dtype": dtype, "prompts": PROMPTS, "generations": GENERATIONS, "new_tokens": NEW_TOKENS,
            "beta": BETA, "lr": lr, "seed": seed, "threads": shared.THREADS, "lora": {"r": 16, "alpha": 32, "targets": TARGETS},
            "trl_gradient_checkpointing": trl_gc, "trl_lr_scheduler": "constant", "trl_autocast": False,
            "trl_prompts": "llmrl's prompt order (prompt_stream), unshuffled"}


def machine() -> dict[str, Any]:
    import platform

    import torch
    import transformers

    info = {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
            "transformers": transformers.__version__}
    if shared.DEVICE == "cuda":
        info.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    try:
        import peft
        import trl

        info.update(peft=peft.__version__, trl=trl.__version__)
    except ImportError:
        pass
    return info


if __name__ == "__main__":
    main()
