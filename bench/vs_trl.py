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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

MODEL = "~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-629336b87325"
PROMPTS, GENERATIONS, NEW_TOKENS, BETA, LR, SEED = 2, 4, 32, 0.04, 1e-5, 0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
# the issue's figures for TRL 1.12's experimental PPOTrainer (policy + reference + value model), 2 threads
ISSUE_PPO = {"s_per_step": 10.63, "peak_rss_mib": 5.3 * 1024}
CONTENDERS = ["llmrl-grpo-defaults", "llmrl-grpo", "llmrl-grpo-fast", "trl-grpo", "llmrl-rloo-fast", "trl-rloo",
              "llmrl-ppo", "trl-ppo", "bound"]
OPTIONAL = ["llmrl-ppo-top4", "llmrl-grpo-fast-adapters", "llmrl-vllm", "llmrl-vllm-adapter", "llmrl-vllm-bf16", "trl-grpo-vllm", "vllm-generate"]  # only when named in --only
VLLM = ["llmrl-vllm", "llmrl-vllm-adapter", "llmrl-vllm-bf16", "trl-grpo-vllm", "vllm-generate"]  # need vLLM (the .venv-vllm interpreter)
# llmrl contender → (algorithm, update.on_policy_logprobs); None leaves the key at the engine's default
LLMRL = {"llmrl-grpo-defaults": ("grpo", None), "llmrl-grpo": ("grpo", False), "llmrl-grpo-fast": ("grpo", True),
         "llmrl-rloo-fast": ("rloo", True), "llmrl-grpo-fast-adapters": ("grpo", True), "llmrl-ppo": ("ppo", False), "llmrl-ppo-top4": ("ppo", False),
         "llmrl-vllm": ("grpo", True), "llmrl-vllm-adapter": ("grpo", True), "llmrl-vllm-bf16": ("grpo", True)}
# llmrl contender → config keys it sets on top of the issue-8 configuration
EXTRA = {"llmrl-ppo-top4": {"lora.critic_layers": 4},  # the opt-in critic on the top 4 layers
         "llmrl-grpo-fast-adapters": {"engine.merge_lora": False},  # decoding through the adapters (before 2026-12-04)
         "llmrl-vllm": {"rollout.engine": "vllm"},  # the engine in the model's dtype, merged-weight sync
         "llmrl-vllm-adapter": {"rollout.engine": "vllm", "engine.sync": "adapter"},  # one base: the adapter served
         "llmrl-vllm-bf16": {"rollout.engine": "vllm", "engine.dtype": "bfloat16"}}  # bf16 sampler, --dtype trainer
LABELS = {"llmrl-grpo-defaults": "llmrl grpo (defaults)", "llmrl-grpo": "llmrl grpo, on_policy_logprobs=false",
          "llmrl-grpo-fast": "llmrl grpo, on_policy_logprobs=true", "trl-grpo": "TRL GRPOTrainer",
          "llmrl-rloo-fast": "llmrl rloo-style, on_policy_logprobs",
          "llmrl-grpo-fast-adapters": "llmrl grpo fast, engine.merge_lora=false", "trl-rloo": "TRL RLOOTrainer",
          "llmrl-ppo": "llmrl ppo (actor+critic+ref)", "llmrl-ppo-top4": "llmrl ppo, lora.critic_layers=4",
          "trl-ppo": "TRL 1.12 PPOTrainer (bench/trl_ppo.py)",
          "bound": "floor pieces", "llmrl-vllm": "llmrl grpo, --engine vllm (merged sync)",
          "llmrl-vllm-adapter": "llmrl grpo, --engine vllm, engine.sync=adapter",
          "llmrl-vllm-bf16": "llmrl grpo, vllm engine in bfloat16", "trl-grpo-vllm": "TRL GRPOTrainer, use_vllm colocate",
          "vllm-generate": "plain vLLM LLM.generate"}
DTYPES = ("float32", "bfloat16")
DEVICES = ("cpu", "cuda")


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


# ---- children: one contender per process ---------------------------------------------------------
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


def llmrl_run(model: str, name: str, steps: int, dtype: str = "float32", seed: int = SEED,
              lr: float = LR) -> dict[str, Any]:
    """`steps` llmrl train steps (setup as `llmrl train` does, no eval, no checkpoints)."""
    from dataclasses import asdict

    from llmrl import load_config
    from llmrl.run.reporting import NullReporter
    from llmrl.run.one_step import train_step
    from llmrl.run.session import setup

    algo, on_policy = LLMRL[name]
    config = load_config(overrides={**llmrl_overrides(model, algo, on_policy, dtype=dtype, seed=seed, lr=lr),
                                    **EXTRA.get(name, {})})
    s = setup(config, NullReporter(), overwrite=True)
    seen: dict[str, Any] = dtypes_of(s.stack)
    probe_autocast(s.stack.lm.get_decoder(), seen)  # the update's forward runs the decoder directly
    times, tokens, rewards, lengths, prompts, rows = [], [], [], [], [], []
    for step in range(steps):
        prompts.append([question(s.task.train[i]["prompt"]) for i in s.sampler.indices(step).tolist()])
        sync()
        t0 = time.perf_counter()
        row = train_step(s, step)
        sync()
        times.append(time.perf_counter() - t0)
        tokens.append(row["tokens"])
        rewards.append(row["reward_mean"])
        lengths.append(row["response_len"])
        rows.append({k: v for k, v in row.items() if isinstance(v, (int, float, bool, str)) or v is None})
    return {"step_s": times, "tokens": tokens, "reward": rewards, "completion_len": lengths, "prompts": prompts,
            "metrics": rows, "llmrl_config": asdict(config), "generate_s": [r["time_generate_s"] for r in rows],
            "sync_s": [r["time_sync_s"] for r in rows], **seen}


def trl_args(kind: str, *, steps: int, dtype: str = "float32", seed: int = SEED, lr: float = LR,
             gradient_checkpointing: bool = False) -> dict[str, Any]:
    """GRPOConfig / RLOOConfig keyword arguments for the issue-8 configuration, with every TRL
    default that differs from llmrl's pinned to llmrl's value:
    - model_init_kwargs dtype = `dtype` and bf16 = fp16 = False: the weights are loaded in `dtype`, no
      autocast (TRL's bf16 default is True: accelerate's bf16 autocast, also on CPU); peft keeps the
      LoRA weights in fp32 as it does for llmrl;
    - lr_scheduler_type constant (TrainingArguments: linear decay to 0 at max_steps; llmrl: constant);
    - gradient_checkpointing False (TRL's default is True: one more forward per backward; llmrl: off);
    - shuffle_dataset False: the dataset is llmrl's prompt order (`prompt_stream`);
    - GRPO: scale_rewards "group" (A = (R − mean_g) / (std_g + 1e-4), std unbiased; llmrl: + 1e-6) and
      loss_type "dapo" (Σ over all completion tokens of the batch / their count = llmrl's token-mean),
      written out so that a TRL release changing its defaults does not change the benchmark.
    The rest are the same in both: AdamW β = (0.9, 0.999), ε = 1e-8, weight decay 0, gradient norm clip
    1.0, ratio clip ε = 0.2, k3 KL in the loss, temperature 1, top_p 1, top_k 0."""
    args = dict(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), per_device_train_batch_size=PROMPTS * GENERATIONS,
        num_generations=GENERATIONS, max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0,
        beta=BETA, num_iterations=1, epsilon=0.2, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        max_steps=steps, logging_steps=1, report_to="none", save_strategy="no", use_cpu=DEVICE == "cpu",
        bf16=False, fp16=False, model_init_kwargs={"dtype": dtype}, gradient_checkpointing=gradient_checkpointing,
        shuffle_dataset=False, seed=seed, dataloader_num_workers=0, gradient_accumulation_steps=1,
    )
    if kind == "grpo":
        args.update(scale_rewards="group", loss_type="dapo")
    return args


def trl_run(model: str, kind: str, steps: int, dtype: str = "float32", seed: int = SEED, lr: float = LR,
            gradient_checkpointing: bool = False, use_vllm: bool = False) -> dict[str, Any]:
    """`steps` TRL GRPOTrainer / RLOOTrainer steps with the same model, LoRA, batch, prompts and reward."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    import trl

    from llmrl.rewards.builtin import numeric

    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in prompt_stream(steps, seed)])
    tokens: list[int] = []
    rewards: list[float] = []
    questions: list[list[str]] = []

    def reward(prompts, completions, answer, completion_ids=None, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = numeric(prompts, texts, answer=answer)
        tokens.append(sum(len(ids) for ids in completion_ids) if completion_ids is not None else -1)
        rewards.append(sum(scores) / len(scores))
        questions.append([question(p) for p in prompts[::GENERATIONS]])
        return scores

    reward.__name__ = "numeric"  # TRL logs the reward under the function's name
    times: list[float] = []
    seen: dict[str, Any] = {}

    class Probe(TrainerCallback):
        """Step timer; records what the training model really is (dtypes, checkpointing) and whether
        its forward runs under autocast."""

        def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
            seen.update(dtypes_of(model))
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            seen["gradient_checkpointing"] = bool(getattr(base, "is_gradient_checkpointing", False))
            probe_autocast(base, seen)

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            sync()
            times.append(time.perf_counter() - self.t0)

    Config, Trainer = (trl.GRPOConfig, trl.GRPOTrainer) if kind == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
    kwargs = trl_args(kind, steps=steps, dtype=dtype, seed=seed, lr=lr, gradient_checkpointing=gradient_checkpointing)
    if use_vllm:  # TRL's in-process vLLM (its weights pushed with model.load_weights after each step)
        kwargs.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_max_model_length=1024)
    config = Config(**kwargs)
    trainer = Trainer(
        model=model, reward_funcs=reward, args=config, train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(model),
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"),
        callbacks=[Probe()],
    )
    seen["mixed_precision"] = str(trainer.accelerator.mixed_precision)
    trainer.train()
    n = len(times)
    logs = [h for h in trainer.state.log_history if "step" in h and "train_runtime" not in h]
    resolved = config.to_dict()
    return {"step_s": times, "tokens": tokens[:n], "reward": rewards[:n], "prompts": questions[:n],
            "completion_len": [t / (PROMPTS * GENERATIONS) for t in tokens[:n]], "metrics": logs[:n],
            "trl": trl.__version__, "trl_args": {k: resolved.get(k) for k in kwargs if k != "output_dir"}, **seen}


def bound_run(model: str, reps: int, dtype: str = "float32") -> dict[str, Any]:
    """Medians over `reps` of the pieces a GRPO step cannot avoid, on one batch of 2 × 4 rows."""
    import torch

    from llmrl import load_config
    from llmrl.run.reporting import NullReporter
    from llmrl.engines.hf import generate, row_uniforms
    from llmrl.step.forward import masked_logprobs
    from llmrl.step.generate import encode_prompts, generate as generate_samples
    from llmrl.run.session import setup
    from llmrl.models.stack import layout, token_logprobs

    config = load_config(overrides=llmrl_overrides(model, "grpo", False, dtype=dtype,
                                                   out=tempfile.mkdtemp(prefix="bench-bound-")))
    s = setup(config, NullReporter(), overwrite=True)
    with torch.no_grad():  # a trained-looking adapter (B ≠ 0), as after a few steps
        for p in s.stack.parameters_of("actor"):
            p.add_(1e-3 * torch.randn_like(p))
    rows = s.task.train[:PROMPTS]
    tok, stack = s.tokenizer, s.stack
    ids, mask = encode_prompts(tok, [r["prompt"] for r in rows], stack.lm.device)
    ids, mask = ids.repeat_interleave(GENERATIONS, 0), mask.repeat_interleave(GENERATIONS, 0)
    batch = generate_samples(s.engine, tok, rows, torch.arange(PROMPTS), cfg=config.rollout, seed=0, step=0,
                             device=stack.lm.device)
    out: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        sync()
        t0 = time.perf_counter()
        result = fn()
        sync()
        out.setdefault(name, []).append(time.perf_counter() - t0)
        return result

    def hf_generate() -> int:
        g = stack.lm.generate(input_ids=ids, attention_mask=mask.long(), do_sample=True, temperature=1.0, top_k=0,
                              top_p=1.0, max_new_tokens=NEW_TOKENS, pad_token_id=tok.pad_token_id)
        resp = g[:, ids.shape[1]:]
        ended = (resp == tok.eos_token_id).long().cumsum(-1)
        return int(((ended == 0) | ((ended == 1) & (resp == tok.eos_token_id))).sum())

    def own_generate(i: int) -> int:
        u = row_uniforms(0, 100 + i, torch.arange(PROMPTS).repeat_interleave(GENERATIONS),
                         torch.arange(GENERATIONS).repeat(PROMPTS), NEW_TOKENS).to(ids.device)
        g = generate(stack, ids, mask, max_new_tokens=NEW_TOKENS, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                     temperature=1.0, uniforms=u)
        return int(g.response_mask.sum())

    def fwd_bwd() -> None:
        seq = layout(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
        lp = token_logprobs(stack.response_logits(seq, 1.0), batch.response_ids)
        loss = -(lp * batch.response_mask).sum() / batch.response_mask.sum()
        loss.backward()
        stack.zero_grad(set_to_none=True)

    gen_tokens: dict[str, list[int]] = {"hf_generate_lora": [], "hf_generate_base": [], "llmrl_generate": []}
    for i in range(reps + 1):  # the first round is a warm-up
        with torch.no_grad(), stack.use("actor"):
            gen_tokens["hf_generate_lora"].append(timed("hf_generate_lora", hf_generate))
        with torch.no_grad(), stack.use("reference"):
            gen_tokens["hf_generate_base"].append(timed("hf_generate_base", hf_generate))
        with stack.use("actor"):
            gen_tokens["llmrl_generate"].append(timed("llmrl_generate", lambda: own_generate(i)))
        with stack.use("reference"):
            timed("nograd_forward_ref", lambda: masked_logprobs(stack, batch, 1.0))
        with stack.use("actor"):
            timed("nograd_forward_lora", lambda: masked_logprobs(stack, batch, 1.0))
            timed("lora_fwd_bwd", fwd_bwd)
    return {"pieces_s": {k: v[1:] for k, v in out.items()}, "gen_tokens": {k: v[1:] for k, v in gen_tokens.items()},
            "batch_response_tokens": int(batch.response_mask.sum()), **dtypes_of(stack)}


def child(name: str, model: str, steps: int, dtype: str = "float32", seed: int = SEED, lr: float = LR,
          trl_gc: bool = False) -> dict[str, Any]:
    import torch

    torch.set_num_threads(THREADS)
    torch.manual_seed(seed)
    if name == "bound":
        result = bound_run(model, max(steps - 1, 1), dtype)
    elif name == "trl-ppo":  # TRL 1.12 from bench/.trl-1.12: this process must not have imported TRL 1.16
        try:
            from bench.trl_ppo import trl_ppo_run
        except ImportError:
            from trl_ppo import trl_ppo_run  # run as a script: bench/ is sys.path[0]
        result = trl_ppo_run(model, steps, THREADS, dtype, device=DEVICE)
    elif name == "vllm-generate":
        result = vllm_generate_run(model, max(steps - 1, 1), dtype)
    elif name.startswith("trl-"):
        result = trl_run(model, name.split("-")[1], steps, dtype, seed, lr, gradient_checkpointing=trl_gc,
                         use_vllm=name.endswith("-vllm"))
    elif name in LLMRL:
        result = llmrl_run(model, name, steps, dtype, seed, lr)
    else:
        raise SystemExit(f"unknown contender '{name}'; valid: {', '.join(CONTENDERS + OPTIONAL)}")
    result.update(peak_rss_mib=vm_hwm_mib(), threads=torch.get_num_threads(), dtype=dtype, seed=seed, device=DEVICE,
                  **gpu_memory_mib())
    return result


# ---- parent: alternate the contenders, then summarise ----------------------------------------------
def run_child(name: str, model: str, steps: int, timeout: float, *, dtype: str = "float32", seed: int = SEED,
              lr: float = LR, trl_gc: bool = False) -> dict[str, Any] | None:
    """Run one contender in a fresh process of this script; its result dict, or None if it failed."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = Path(f.name)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--model", model, "--steps", str(steps),
           "--threads", str(THREADS), "--device", DEVICE, "--dtype", dtype, "--seed", str(seed), "--lr", repr(lr), "--child-out", str(path)]
    if trl_gc:
        cmd.append("--trl-gradient-checkpointing")
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  {name} (seed {seed}): killed after {timeout:.0f} s", file=sys.stderr)
        return None
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"  {name} (seed {seed}): failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-3:]}",
              file=sys.stderr)
        return None
    result = json.loads(path.read_text())
    path.unlink()
    result["wall_s"] = wall
    return result


def vllm_generate_run(model: str, reps: int, dtype: str = "float32") -> dict[str, Any]:
    """Plain vLLM `LLM.generate` of one GRPO batch (2 chat prompts × 4 samples × 32 tokens, temperature
    1, one seeded request per row, log-probs of the drawn tokens) against llmrl's `vllm` engine
    generating the same request from the same `LLM` (the wrapper's cost: request building, padding,
    log-prob gathering), alternated, medians over `reps` after a warm-up round."""
    import torch

    from llmrl import load_config
    from llmrl.engines import GenerationRequest, SamplingSettings, build_engine
    from llmrl.engines.base import row_keys
    from llmrl.models.load import load_base
    from llmrl.models.prompts import apply_chat_setting, tokenize_prompts
    from llmrl.models.stack import PolicyStack
    from llmrl.tasks import get_task
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    config = load_config(overrides={**llmrl_overrides(model, "grpo", True, dtype=dtype), "rollout.engine": "vllm"})
    base, tok = load_base(config.model)
    apply_chat_setting(tok, "auto", config.model.name)
    engine = build_engine("vllm", stack=PolicyStack(base, config.lora, with_critic=False), tokenizer=tok, config=config)
    enc = tokenize_prompts(tok, [r["prompt"] for r in get_task("chat_sum").train[:PROMPTS]], return_tensors="pt",
                           padding=True)
    ids, mask = enc.input_ids, enc.attention_mask.bool()
    index = torch.arange(PROMPTS).repeat_interleave(GENERATIONS)
    out: dict[str, list[float]] = {"vllm_generate": [], "llmrl_vllm_engine": []}
    counts: dict[str, list[int]] = {k: [] for k in out}

    def plain(keys: torch.Tensor) -> int:
        prompts = [TokensPrompt(prompt_token_ids=row[m].tolist()) for row, m in zip(ids, mask) for _ in range(GENERATIONS)]
        params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=k, logprobs=0, detokenize=False,
                                 stop_token_ids=engine.stop_ids) for k in keys.tolist()]
        return sum(len(o.outputs[0].token_ids) for o in engine.llm.generate(prompts, params, use_tqdm=False))

    def wrapped(keys: torch.Tensor) -> int:
        request = GenerationRequest(ids, mask, GENERATIONS, SamplingSettings(NEW_TOKENS, 1.0), keys, logprobs=True)
        return int(engine.generate(request).response_mask.sum())

    for rep in range(reps + 1):  # the first round is a warm-up; both see the same keys, so the same tokens
        keys = row_keys(SEED, rep, index, torch.arange(GENERATIONS).repeat(PROMPTS))
        for name, fn in (("vllm_generate", plain), ("llmrl_vllm_engine", wrapped)):
            sync()
            t0 = time.perf_counter()
            n = fn(keys)
            sync()
            if rep:
                out[name].append(time.perf_counter() - t0)
                counts[name].append(n)
    return {"pieces_s": out, "gen_tokens": counts}


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def memory_of(results: list[dict[str, Any]]) -> dict[str, float]:
    """Median over repetitions of peak RSS and, on a GPU, of peak GPU memory (allocated, reserved)."""
    keys = ("peak_rss_mib", "peak_gpu_mib", "peak_gpu_reserved_mib")
    return {k: median([r[k] for r in results]) for k in keys if k in results[0]}


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per contender: median s/step over (steps after the warm-up) × repetitions, tokens/s over the
    same steps, median peak RSS over repetitions, mean reward over all steps."""
    table: dict[str, Any] = {}
    for name, results in runs.items():
        if not results:
            continue
        if name in ("bound", "vllm-generate"):
            pieces = {k: median([x for r in results for x in r["pieces_s"][k]]) for k in results[0]["pieces_s"]}
            toks = {k: median([x for r in results for x in r["gen_tokens"][k]]) for k in results[0]["gen_tokens"]}
            table[name] = {"pieces_s": pieces, "gen_tokens": toks,
                           "gen_tokens_per_s": {k: toks[k] / pieces[k] for k in toks},
                           **memory_of(results), "dtype": results[0].get("dtype", "float32")}
            continue
        steps = [x for r in results for x in r["step_s"][1:]]
        toks = [x for r in results for x in r["tokens"][1:]]
        table[name] = {
            "s_per_step": median(steps), "steps_counted": len(steps),
            "tokens_per_step": statistics.mean(toks) if toks else None,
            "tokens_per_s": sum(toks) / sum(steps) if steps else None,
            **memory_of(results),
            **generation_rate(results),
            "reward_mean": statistics.mean([x for r in results for x in r["reward"]]),
            "dtype": results[0].get("dtype", "float32"), "label": label_of(name),
        }
    return table


def generation_rate(results: list[dict[str, Any]]) -> dict[str, float]:
    """llmrl runs: tokens/s of the generate phase alone and the median sync seconds (after the warm-up)."""
    if "generate_s" not in results[0]:
        return {}
    gen = [x for r in results for x in r["generate_s"][1:]]
    toks = [x for r in results for x in r["tokens"][1:]]
    return {"generate_tokens_per_s": sum(toks) / sum(gen), "sync_s": median([x for r in results for x in r["sync_s"][1:]])}


def split_contender(name: str) -> tuple[str, str | None]:
    """'NAME@DTYPE' → (NAME, DTYPE); a plain name → (name, None): it runs in --dtype."""
    base, _, dtype = name.partition("@")
    return base, dtype or None


def label_of(name: str) -> str:
    base, dtype = split_contender(name)
    return LABELS.get(base, base) + (f" ({dtype})" if dtype else "")


def pair_ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """ours/theirs for time, throughput and every memory figure both have."""
    keys = ("s_per_step", "tokens_per_s", "peak_rss_mib", "peak_gpu_mib", "peak_gpu_reserved_mib")
    return {k: a[k] / b[k] for k in keys if k in a and k in b}


def ratios(table: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pairs = [("llmrl-grpo-defaults", "trl-grpo"), ("llmrl-grpo", "trl-grpo"), ("llmrl-grpo-fast", "trl-grpo"),
             ("llmrl-rloo-fast", "trl-rloo"), ("llmrl-grpo-fast", "llmrl-grpo-fast-adapters")]
    for ours, theirs in pairs:
        if ours in table and theirs in table:
            a, b = table[ours], table[theirs]
            out[f"{ours}/{theirs}"] = pair_ratios(a, b)
    for ours in ("llmrl-ppo", "llmrl-ppo-top4"):
        if ours in table and "trl-ppo" in table:
            out[f"{ours}/trl-ppo"] = pair_ratios(table[ours], table["trl-ppo"])
    if "llmrl-ppo" in table and "peak_gpu_mib" not in table["llmrl-ppo"]:  # the issue's figures are CPU ones
        out["llmrl-ppo/issue-trl-ppo"] = {k: table["llmrl-ppo"][k] / v for k, v in ISSUE_PPO.items()}
    trl_best = min((table[n] for n in table if split_contender(n)[0] in ("trl-grpo", "trl-grpo-vllm")),
                   key=lambda r: r["s_per_step"], default=None)
    for ours in table:
        if split_contender(ours)[0] in ("llmrl-vllm", "llmrl-vllm-adapter", "llmrl-vllm-bf16", "llmrl-grpo-fast",
                                        "llmrl-grpo-fast-adapters") and trl_best is not None:
            out[f"{ours}/fastest TRL ({trl_best['label']})"] = pair_ratios(table[ours], trl_best)
    for ours in ("llmrl-vllm", "llmrl-vllm-adapter", "llmrl-vllm-bf16"):  # issue 29: the engine's memory
        if ours in table and "llmrl-grpo-fast" in table:
            out[f"{ours}/llmrl-grpo-fast"] = pair_ratios(table[ours], table["llmrl-grpo-fast"])
    if "vllm-generate" in table:
        rate = table["vllm-generate"]["gen_tokens_per_s"]
        out["vllm-generate"] = {"llmrl engine/plain LLM.generate tokens_per_s": rate["llmrl_vllm_engine"] / rate["vllm_generate"]}
        for ours in ("llmrl-vllm", "llmrl-vllm-bf16"):
            if ours in table:
                out[f"{ours} generate phase/plain vLLM generate"] = {
                    "tokens_per_s": table[ours]["generate_tokens_per_s"] / rate["vllm_generate"]}
    if "bound" in table:
        p = table["bound"]["pieces_s"]
        floor = p["hf_generate_lora"] + p["nograd_forward_ref"] + p["lora_fwd_bwd"]
        out["bound"] = {"grpo_floor_s": floor, "grpo_floor_with_old_forward_s": floor + p["nograd_forward_lora"]}
        for name in ("llmrl-grpo-defaults", "llmrl-grpo", "llmrl-grpo-fast", "llmrl-rloo-fast", "trl-grpo", "trl-rloo"):
            if name in table:
                out["bound"][f"{name}/floor"] = table[name]["s_per_step"] / floor
        t = table["bound"]["gen_tokens_per_s"]
        out["bound"]["llmrl_generate/hf_generate_lora tokens_per_s"] = t["llmrl_generate"] / t["hf_generate_lora"]
    return out


def print_table(table: dict[str, Any], rat: dict[str, Any], dtype: str) -> None:
    print(f"\ndtype {dtype}, device {DEVICE} (every contender)")
    print(f"{'contender':<21}{'dtype':>9}{'s/step':>9}{'tok/step':>10}{'tok/s':>8}{'RSS MiB':>9}{'GPU MiB':>9}"
          f"{'reward':>8}  label")
    for name, r in table.items():
        if name in ("bound", "vllm-generate"):
            continue
        gpu = f"{r['peak_gpu_mib']:>9.0f}" if "peak_gpu_mib" in r else f"{'-':>9}"
        print(f"{name:<21}{r['dtype']:>9}{r['s_per_step']:>9.2f}{r['tokens_per_step']:>10.1f}{r['tokens_per_s']:>8.1f}"
              f"{r['peak_rss_mib']:>9.0f}{gpu}{r['reward_mean']:>8.3f}  {r['label']}")
    if "bound" in table:
        b = table["bound"]
        print("\nfloor pieces (median s):", {k: round(v, 3) for k, v in b["pieces_s"].items()})
        print("generate tokens/s:", {k: round(v, 1) for k, v in b["gen_tokens_per_s"].items()})
    if "vllm-generate" in table:
        print("vLLM generate tokens/s:", {k: round(v, 1) for k, v in table["vllm-generate"]["gen_tokens_per_s"].items()})
    for name, r in table.items():
        if "generate_tokens_per_s" in r:
            print(f"{name}: generate phase {r['generate_tokens_per_s']:.1f} tokens/s, sync {r['sync_s']:.3f} s")
    print("\nratios:")
    for k, v in rat.items():
        print(f"  {k}: " + ", ".join(f"{kk}={vv:.3f}" for kk, vv in v.items()))


def main() -> None:
    global THREADS, DEVICE
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
    THREADS, DEVICE = a.threads, a.device
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
              "total_wall_s": time.perf_counter() - t0, "table": table, "ratios": rat, "runs": runs}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
        print(f"\nwrote {a.out}")


def run_config(model: str, dtype: str, seed: int, lr: float, trl_gc: bool) -> dict[str, Any]:
    """The configuration every contender shares, as recorded in the results JSON."""
    return {"model": model, "dtype": dtype, "prompts": PROMPTS, "generations": GENERATIONS, "new_tokens": NEW_TOKENS,
            "beta": BETA, "lr": lr, "seed": seed, "threads": THREADS, "lora": {"r": 16, "alpha": 32, "targets": TARGETS},
            "trl_gradient_checkpointing": trl_gc, "trl_lr_scheduler": "constant", "trl_autocast": False,
            "trl_prompts": "llmrl's prompt order (prompt_stream), unshuffled"}


def machine() -> dict[str, Any]:
    import platform

    import torch
    import transformers

    info = {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
            "transformers": transformers.__version__}
    if DEVICE == "cuda":
        info.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    try:
        import peft
        import trl

        info.update(peft=peft.__version__, trl=trl.__version__)
    except ImportError:
        pass
    return info


THREADS = 1
DEVICE = "cpu"

if __name__ == "__main__":
    main()
