"""Settings a model recommends for itself, applied between the algorithm preset and the recipe (so a
recipe or `--set` still overrides them; `llmrl config --model M` shows the result).

The `tiny` model is 132 K parameters with hidden size 64: its LoRA adapters need a unit scale
(α = r) and the RMSNorm weights trained inside each adapter so that RL can sharpen its output
distribution, whose scale a frozen final norm would otherwise pin. The schema's own defaults
(512 rows per step, 5 new tokens, 400 steps) are sized for it and its arithmetic task.

Any other model (a hub id, a folder, a `.gguf` file) is a real model: a step of 512 rows of a
135 M-parameter model takes minutes on a CPU, and its answers need more than 5 tokens. On a CPU its
defaults take the batch of `recipes/smollm2-135m-grpo.yaml`, measured on a 2-core CPU
(docs/real-models.md): 4 prompts × 8 samples, two minibatches of 16, actor lr 2e-4, 100 held-out
prompts before and after; with room for answers longer than the recipe's "a + b = c." (32 new
tokens, the recipe 20) and twice its 25 steps. On a GPU (`model.device` cuda, or auto with one
present) the batch and the answers grow:

    rows per step R = B × G      CPU 32, GPU 128; G = 8 for a preset with groups (B = R / 8), else B = R, G = 1
    update.minibatch_size        R / 2 (two optimizer steps per step; on a smaller step set by the user,
                                 half of it: `default_minibatch`)
    rollout.max_new_tokens       CPU 32, GPU 256
    steps                        CPU 50, GPU 200
    threads (CPU only)           max(1, min(8, cores // 2))

Threads: torch's default (one per core) makes every small matmul wait for all its threads; on a
CPU that anything else uses too, a waiting thread is a descheduled one, and the docs' 135 M step took
282 s with 2 threads against 50 s with 1 (a 16×576 @ 576×576 linear: 3.7 ms against 0.29 ms). A
second thread can at best halve an idle machine's time, and small matmuls gain less (not measured
here: the CPU was never idle), against 5-10× lost on a busy one; so a real model takes half the
cores it may run on (at least 1: one on a 2-core machine, as the recipe), at most 8, since decoding
a few dozen rows of a small model has little parallel work per matmul. Rows per step are the same for every algorithm, so
`llmrl compare` sees equal budgets.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from .schema import RolloutConfig, UpdateConfig

TINY = "tiny"
TINY_SHAPES = (64, 256, 21)
"""The built-in tiny models' (hidden, intermediate, vocabulary) sizes: models/tiny.py builds them from
these (the vocabulary is the char tokenizer's, models/tokenizer.py); config/dtype_probe.py times them."""

_TINY_DEFAULTS: dict[str, Any] = {
    "lora.r": 8,
    "lora.alpha": 8.0,
    "lora.modules_to_save": ["norm"],
    "update.lr_actor": 1e-3,
    "update.lr_critic": 5e-3,
}
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {TINY: _TINY_DEFAULTS, "tiny-tools": _TINY_DEFAULTS,
                                             "tiny-guess": _TINY_DEFAULTS}  # the same architecture

# (rows per step, new tokens, steps, held-out prompts, evaluate every N steps) on each kind of device
_REAL = {"cpu": (32, 32, 50, 100, 0), "cuda": (128, 256, 200, 200, 50)}
GROUP_SIZE = 8  # samples per prompt for presets with groups: more groups with a mixed outcome (docs/real-models.md)


def cpu_threads() -> int:
    """Half the cores this process may run on, in [1, 8] (see the module docstring)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores // 2))


def device_kind(device: str) -> str:
    """'cuda' for model.device cuda, or auto on a machine with a GPU; else 'cpu'."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device == "cuda" else "cpu"


def real_model_defaults(device: str, grouped: bool) -> dict[str, Any]:
    """The dotted-key defaults of a real model on `device` (cpu, cuda, auto); `grouped`: the algorithm
    samples G > 1 responses per prompt, so the R rows are R / 8 prompts × 8."""
    kind = device_kind(device)
    rows, new_tokens, steps, eval_size, eval_every = _REAL[kind]
    group = GROUP_SIZE if grouped else 1
    out: dict[str, Any] = {
        "steps": steps,
        "rollout.prompts_per_step": rows // group,
        "rollout.num_generations": group,
        "rollout.max_new_tokens": new_tokens,
        "update.minibatch_size": rows // 2,
        "update.lr_actor": 2e-4,
        "eval.size": eval_size,
        "eval.every": eval_every,
        "eval.batch_size": min(eval_size, 100),
        "checkpoint.every": 10 if kind == "cpu" else 50,
        "log.completions_every": 10 if kind == "cpu" else 50,
    }
    if kind == "cpu":
        out["threads"] = cpu_threads()
    return out


def defaults_for_model(name: str, device: str = "cpu", grouped: bool = False) -> dict[str, Any]:
    """The recommended dotted-key settings of model `name`: tiny's own, else a real model's."""
    if name in MODEL_DEFAULTS:
        return dict(MODEL_DEFAULTS[name])
    return real_model_defaults(device, grouped)


def default_minibatch(rows: int, defaults: Mapping[str, Any]) -> int:
    """update.minibatch_size where no recipe, flag or --set gives one, for a step of `rows` rows: the
    defaults' own size M₀ (the schema's < the algorithm preset's < the model's), or, on a step smaller than
    the R₀ rows the defaults make, as many minibatches of it as the defaults make of theirs, so that a
    default never exceeds the rows a user asked for (only a size the user set is refused for that):

        k = ⌈R₀ / M₀⌉,   M = min(M₀, ⌈rows / k⌉)       (k = 2 for every built-in default)"""
    m0 = int(defaults.get("update.minibatch_size", UpdateConfig.minibatch_size))
    r0 = (int(defaults.get("rollout.prompts_per_step", RolloutConfig.prompts_per_step))
          * int(defaults.get("rollout.num_generations", RolloutConfig.num_generations)))
    return m0 if rows >= r0 else min(m0, -(-rows // -(-r0 // m0)))
