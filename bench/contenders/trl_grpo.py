"""TRL's GRPOTrainer and RLOOTrainer (TRL 1.16, the `[bench]` extra) on the issue-8 configuration: the
`trl-grpo`, `trl-rloo` and `trl-grpo-vllm` contenders of bench/vs_trl.py.

The same model, LoRA, batch, prompts (llmrl's own order, `shared.prompt_stream`) and reward (llmrl's
`numeric`) as llmrl's contenders, with every TRL default that differs from llmrl's pinned to llmrl's
value (`trl_args`). `trl-grpo-vllm` is TRL's GRPOTrainer with use_vllm=True, vllm_mode="colocate".
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from . import shared
from .shared import (BETA, GENERATIONS, LR, NEW_TOKENS, PROMPTS, SEED, TARGETS, dtypes_of, probe_autocast, prompt_stream,
                     question, sync)


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
        max_steps=steps, logging_steps=1, report_to="none", save_strategy="no", use_cpu=shared.DEVICE == "cpu",
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
