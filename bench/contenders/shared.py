"""The configuration every contender of bench/vs_trl.py shares (issue 8) and the helpers its children use.

SmolLM2-135M-Instruct, LoRA r=16 (α=32) on q,k,v,o, 2 prompts × 4 samples, 32 new tokens, β=0.04 (KL
k3 in the loss), one update per batch, temperature 1, lr 1e-5, seed 0; chat prompts "What is a+b?"
(llmrl's `chat_sum` train split) and llmrl's `numeric` reward for every contender.

`THREADS` and `DEVICE` are the run's torch threads and device: the runner (and the scripts that reuse
this configuration: reward_curve.py) set them before anything runs; the functions
here and in the contender modules read them when called.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

MODEL = "~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-629336b87325"
PROMPTS, GENERATIONS, NEW_TOKENS, BETA, LR, SEED = 2, 4, 32, 0.04, 1e-5, 0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
DTYPES = ("float32", "bfloat16")
DEVICES = ("cpu", "cuda")

THREADS = 1
DEVICE = "cpu"


def sync() -> None:
    """Wait for the GPU's queued work (no-op on CPU): a step's time must include its kernels."""
    if DEVICE == "cuda":
        import torch

        torch.cuda.synchronize()


def gpu_memory_mib() -> dict[str, float]:
    """Peak GPU memory of this process (MiB), allocated by tensors and reserved by the caching
    allocator; empty on CPU."""
    if DEVICE != "cuda":
        return {}
    import torch

    return {"peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20,
            "peak_gpu_reserved_mib": torch.cuda.max_memory_reserved() / 2**20}


def vm_hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def llmrl_overrides(model: str, algo: str, on_policy_logprobs: bool | None, *, dtype: str = "float32",
                    seed: int = SEED, lr: float = LR, out: str | None = None) -> dict[str, Any]:
    """The issue-8 configuration as llmrl config overrides. `on_policy_logprobs=None` leaves that
    switch (and every other performance switch) at the engine's default."""
    overrides = {
        "algo": algo, "task": "chat_sum", "seed": seed, "threads": THREADS,
        "out": out or tempfile.mkdtemp(prefix="bench-llmrl-"),
        "model.name": model, "model.dtype": dtype, "model.device": DEVICE, "data.chat_template": "auto",
        "lora.r": 16, "lora.alpha": 32.0, "lora.dropout": 0.0, "lora.target_modules": TARGETS,
        "rollout.prompts_per_step": PROMPTS, "rollout.num_generations": 1 if algo == "ppo" else GENERATIONS,
        "rollout.max_new_tokens": NEW_TOKENS, "rollout.temperature": 1.0, "rollout.top_p": 1.0,
        "update.epochs": 1, "update.minibatch_size": PROMPTS * GENERATIONS,  # one update of all 8 rows
        "update.lr_actor": lr, "eval.size": 0, "checkpoint.every": 0,
    }
    if on_policy_logprobs is not None:
        overrides["update.on_policy_logprobs"] = on_policy_logprobs
    if algo == "ppo":  # same rows per step: 8 prompts × 1 sample
        overrides["rollout.prompts_per_step"] = PROMPTS * GENERATIONS
    else:
        overrides.update({"kl.beta": BETA, "kl.estimator": "k3", "kl.placement": "loss"})
    return overrides


def prompt_stream(steps: int, seed: int = SEED) -> list[dict[str, Any]]:
    """The chat_sum train rows llmrl's GRPO/RLOO run with `seed` reads in its first `steps` steps
    (PROMPTS per step), in that order: TRL is given exactly these, unshuffled, so both see the same
    prompts at the same step."""
    from llmrl.run.data import PromptSampler
    from llmrl.tasks import get_task

    train = get_task("chat_sum").train
    sampler = PromptSampler(len(train), PROMPTS, seed)
    return [train[i] for step in range(steps) for i in sampler.indices(step).tolist()]


def question(prompt: Any) -> str:
    """The user message of a chat prompt (or the prompt itself)."""
    return prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)


def dtypes_of(model: Any) -> dict[str, str]:
    """dtype of the frozen base weights and of the trainable LoRA weights of a (peft) model."""
    named = list(model.named_parameters())
    base = next((p.dtype for n, p in named if "lora_" not in n), None)
    lora = next((p.dtype for n, p in named if "lora_" in n and p.requires_grad), None)
    return {"base_dtype": str(base), "adapter_dtype": str(lora)}


def probe_autocast(module: Any, seen: dict[str, Any]) -> None:
    """Record in seen["autocast"] whether the first gradient-enabled forward of `module` runs under
    CPU autocast (what a trainer really does, not what its flags say)."""
    import torch

    def hook(mod: Any, args: Any, kwargs: Any) -> None:
        if torch.is_grad_enabled():
            seen.setdefault("autocast", torch.is_autocast_enabled("cpu"))

    module.register_forward_pre_hook(hook, with_kwargs=True)
