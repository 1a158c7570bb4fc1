"""TRL 1.12.0's experimental PPOTrainer on vs_trl's configuration: the PPO row of issue 8, re-measured.

The `trl-ppo` contender of bench/vs_trl.py; bench/trl_ppo.py is its command line.

TRL removed PPOTrainer in 1.13.0 (huggingface/trl#7020): neither 1.16 (the `[bench]` extra) nor any release
after 1.12.0 ships `trl.experimental.ppo`. 1.12.0, the last that does, runs unchanged
against transformers 5.24 / peft 0.21 / accelerate 1.15 (no shim needed). `ensure_trl112()` installs
it with `pip install --no-deps --target bench/.trl-1.12 trl==1.12.0` (git-ignored) and
`trl_ppo_run` puts that folder first on sys.path before importing `trl`, so run it in a process that
has not imported TRL 1.16 (vs_trl's children are such processes).

Configuration, the same rows per step as vs_trl's `llmrl-ppo` contender (8 prompts × 1 sample):
SmolLM2-135M-Instruct, 32 new tokens, temperature 1, stop at EOS, one PPO epoch, one minibatch of all
8 rows, lr 1e-5 (constant), KL coefficient `kl_coef` = 0.02 with the k1 estimator in the reward
(llmrl's ppo preset: β = 0.02, k1, placement 'reward'), γ = 1, λ = 0.95, ratio clip 0.2, value clip
0.2, value-loss coefficient 0.5, fp32, no gradient checkpointing. Models held:

- lora=True (default): the policy is the base + a LoRA adapter (r=16, α=32 on q,k,v,o) that TRL adds
  from `peft_config`; the reference is the same base with the adapter disabled (TRL's
  `null_ref_context`), so no second copy; the value model is a full
  `AutoModelForSequenceClassification` (its own copy of the 135M weights, all trainable: TRL has no
  LoRA critic). Three sets of weights' worth of memory: base, value model, value model's Adam state.
- lora=False (`--full`): full-parameter policy + a frozen reference copy + the full value model, the
  four-model layout the issue's 5.3 GiB figure describes (policy, reference, value, reward).

Reward: `NumericReward`, a weightless nn.Module shaped like the sequence-classification model TRL's
`get_reward` expects (`getattr(m, m.base_model_prefix)(input_ids=..., ...)`, then
`m.score(hidden_states[-1])[row, last_position]`). Its backbone decodes each row's response with the
tokenizer and applies llmrl's `numeric` reward (1.0 when the completion's last number is the sum), so
the learning signal is llmrl's. It has no parameters and runs no model; its cost (a batch_decode of
8 × ≤ 32 tokens and 8 regexes) is timed per step and reported as `reward_s` (about a millisecond).

Padding: SmolLM2's pad token is its EOS `<|im_end|>`, which every chat prompt contains; TRL's PPO
takes `token == pad_token_id` as padding (in prompts and responses), which would mask the prompt's
turn ends. So the pad token here is `<|endoftext|>` (id 0, never in a prompt), for the tokenizer,
the collator (left padding) and generation.

    python -m bench.trl_ppo --steps 3 [--threads 2] [--full] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .shared import GENERATIONS, LR, MODEL, NEW_TOKENS, PROMPTS, SEED, TARGETS, vm_hwm_mib

TRL_VERSION = "1.12.0"
TRL_DIR = Path(__file__).resolve().parents[1] / ".trl-1.12"  # bench/.trl-1.12 (gpu_table.sh installs there too)
ROWS = PROMPTS * GENERATIONS  # 8 prompts × 1 sample, as vs_trl's llmrl-ppo contender
KL_COEF, KL_ESTIMATOR, VF_COEF = 0.02, "k1", 0.5  # llmrl's ppo preset and update.vf_coef
PAD_TOKEN = "<|endoftext|>"


def ensure_trl112(dir: Path = TRL_DIR) -> Path:  # noqa: A002 - the brief's name
    """TRL 1.12.0 in `dir` (pip --no-deps --target, from PyPI) unless it is already there; returns `dir`."""
    dir = Path(dir).resolve()
    if not (dir / "trl" / "experimental" / "ppo" / "ppo_trainer.py").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(dir),
                        f"trl=={TRL_VERSION}"], check=True)
    return dir


def import_trl112(dir: Path = TRL_DIR) -> Any:
    """`trl` 1.12 from `dir`, put first on sys.path; refuses when another TRL is already imported."""
    loaded = sys.modules.get("trl")
    if loaded is not None and getattr(loaded, "__version__", None) != TRL_VERSION:
        raise RuntimeError(f"trl {loaded.__version__} is already imported; run trl_ppo_run in a fresh process")
    path = str(ensure_trl112(dir))
    if path not in sys.path:
        sys.path.insert(0, path)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import trl

    if trl.__version__ != TRL_VERSION:
        raise RuntimeError(f"imported trl {trl.__version__} from {trl.__file__}, wanted {TRL_VERSION}")
    return trl


def _reward_module(tokenizer: Any, prompts: list[list[int]], answers: list[str]) -> Any:
    """The weightless reward stand-in (built here so that torch is imported only in the run)."""
    import torch
    from torch import nn

    from llmrl.rewards.builtin import numeric

    by_prompt = {tuple(p): a for p, a in zip(prompts, answers, strict=True)}
    lengths = sorted({len(p) for p in prompts})

    class Backbone(nn.Module):
        """Rows (B, L) → 'hidden states' (B, L, 1): every position holds the row's numeric reward."""

        def __init__(self) -> None:
            super().__init__()
            self.calls: list[dict[str, float]] = []

        def split(self, ids: list[int]) -> tuple[str, list[int]]:
            for n in lengths:  # the prompt is the prefix of the unpadded row that is a known prompt
                if tuple(ids[:n]) in by_prompt:
                    return by_prompt[tuple(ids[:n])], ids[n:]
            raise ValueError("row does not start with a known prompt")

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any) -> Any:
            t0 = time.perf_counter()
            rows = [self.split(r[m].tolist()) for r, m in zip(input_ids, attention_mask.bool(), strict=True)]
            texts = tokenizer.batch_decode([resp for _, resp in rows], skip_special_tokens=True)
            scores = numeric([None] * len(rows), texts, answer=[a for a, _ in rows])
            self.calls.append({"tokens": sum(len(resp) for _, resp in rows), "reward": sum(scores) / len(scores),
                               "seconds": time.perf_counter() - t0})
            r = torch.tensor(scores, dtype=torch.float32, device=input_ids.device)
            r = r.view(-1, 1, 1).expand(-1, input_ids.shape[1], 1)
            return type("Out", (), {"hidden_states": (r,)})()

    class NumericReward(nn.Module):
        """What `trl.experimental.utils.get_reward` calls: `backbone(...)` then `score(h[-1])`; no weights."""

        base_model_prefix = "backbone"

        def __init__(self) -> None:
            super().__init__()
            self.backbone = Backbone()

        def score(self, hidden: torch.Tensor) -> torch.Tensor:
            return hidden

    return NumericReward()


def trl_ppo_run(model: str, steps: int, threads: int = 1, dtype: str = "float32", lora: bool = True,
                device: str = "cpu", reward_model: str | None = None) -> dict[str, Any]:
    """`steps` TRL 1.12 PPOTrainer steps; per step: seconds (on_step_end to on_step_end, the first from
    on_train_begin; on cuda after torch.cuda.synchronize()), generated tokens (response tokens up to
    and including EOS) and mean reward. `device` "cuda" sets use_cpu=False: accelerate places the
    models on the GPU. `reward_model`: a sequence-classifier folder (e.g. `llmrl export` of a reward run)
    loaded as TRL's reward model, its own copy of the weights, instead of the weightless stand-in."""
    trl = import_trl112()
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    from llmrl.models.prompts import tokenize_prompts
    from llmrl.tasks import get_task

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    dt = getattr(torch, dtype)
    tok = AutoTokenizer.from_pretrained(model, padding_side="left")
    tok.pad_token = PAD_TOKEN
    rows = get_task("chat_sum").train[:64]
    ids = tokenize_prompts(tok, [r["prompt"] for r in rows])["input_ids"]
    data = Dataset.from_dict({"input_ids": ids})
    reward = _reward_module(tok, ids, [r["answer"] for r in rows]) if reward_model is None else \
        AutoModelForSequenceClassification.from_pretrained(reward_model, num_labels=1, dtype=dt)
    if reward_model is not None:
        reward.config.pad_token_id = tok.pad_token_id

    policy = AutoModelForCausalLM.from_pretrained(model, dtype=dt)
    policy.generation_config.pad_token_id = tok.pad_token_id
    value = AutoModelForSequenceClassification.from_pretrained(model, num_labels=1, dtype=dt)
    value.config.pad_token_id = tok.pad_token_id
    ref = None if lora else AutoModelForCausalLM.from_pretrained(model, dtype=dt)
    peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM") if lora else None

    times: list[float] = []
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    class Timer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            sync()
            t = time.perf_counter()
            times.append(t - self.t0)
            self.t0 = t

    args = PPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-ppo-"), per_device_train_batch_size=ROWS,
        gradient_accumulation_steps=1, num_mini_batches=1, num_ppo_epochs=1, total_episodes=steps * ROWS,
        local_rollout_forward_batch_size=ROWS, response_length=NEW_TOKENS, temperature=1.0, stop_token="eos",
        kl_coef=KL_COEF, kl_estimator=KL_ESTIMATOR, vf_coef=VF_COEF, cliprange=0.2, cliprange_value=0.2,
        gamma=1.0, lam=0.95, whiten_rewards=False, learning_rate=LR, lr_scheduler_type="constant",
        num_sample_generations=0, gradient_checkpointing=False, bf16=False, fp16=False, use_cpu=device == "cpu",
        seed=SEED, logging_steps=1, report_to="none", save_strategy="no", dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                         train_dataset=data, value_model=value, peft_config=peft, callbacks=[Timer()])
    trainer.train()
    calls = getattr(getattr(reward, "backbone", None), "calls", [])
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return {"step_s": times, "tokens": [c["tokens"] for c in calls], "reward": [c["reward"] for c in calls],
            "reward_s": [c["seconds"] for c in calls], "trl": trl.__version__, "lora": lora,
            "trainable_params": trainable, "reward_params": sum(p.numel() for p in reward.parameters())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--full", action="store_true", help="full-parameter policy + reference copy (no LoRA)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--reward-model", default=None, help="a sequence-classifier folder as TRL's reward model "
                    "(default: the weightless numeric stand-in)")
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    r = trl_ppo_run(str(Path(os.path.expanduser(a.model))), a.steps, threads=a.threads, lora=not a.full,
                    device=a.device, reward_model=a.reward_model)
    print(f"TRL {r['trl']} PPOTrainer, {'LoRA policy' if r['lora'] else 'full policy + reference'}, "
          f"{a.threads} threads, trainable params {r['trainable_params']:,}, reward params {r['reward_params']}")
    for i, (s, n, rw, rs) in enumerate(zip(r["step_s"], r["tokens"], r["reward"], r["reward_s"], strict=False)):
        print(f"step {i}: {s:.2f} s, {n} tokens, reward {rw:.3f} (stand-in {rs * 1e3:.1f} ms)")
    if not r["tokens"]:  # a real reward model: TRL logs its scores, not the stand-in's calls
        print("steps: " + ", ".join(f"{s:.2f} s" for s in r["step_s"]) + f"; reward model {a.reward_model}")
    print(f"peak RSS (VmHWM): {vm_hwm_mib():.0f} MiB")


if __name__ == "__main__":
    main()
