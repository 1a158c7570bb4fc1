"""A reward run's folder built by hand (the shared design of issue 67), for tests of what reads one.

`build_reward_run` writes what `llmrl reward train --out RUN` leaves behind, with plain peft and no training:

    RUN/adapter/        peft's SEQ_CLS adapter of `AutoModelForSequenceClassification.from_pretrained(base,
                        num_labels=1)`: LoRA r 4 on every projection of the decoder, every LoRA B and the score
                        head drawn at random (not peft's zeros), so the adapter changes the scores; the tokenizer
    RUN/reward.json     kind, base, quantize, dtype, pad_token_id, score
    RUN/config.yaml     a RewardRunConfig tree (config/load.to_tree)
    RUN/summary.json    held-out figures before → after

A TRL `RewardTrainer` + peft LoRA run saves its adapter in the same format (task_type SEQ_CLS, `score` in
modules_to_save), so what reads this reads TRL's too.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
import yaml
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from llmrl.config.load import to_tree
from llmrl.config.reward_run import PairsConfig, RewardRunConfig
from llmrl.config.schema import LoraConfig, ModelConfig

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SUMMARY = {"kind": "reward-model", "train_pairs": 144, "held_out_pairs": 16, "steps": 18, "seconds": 12.5,
           "eval_accuracy_before": 0.5, "eval_accuracy_after": 0.875, "eval_margin_before": 0.01,
           "eval_margin_after": 1.25, "eval_loss_before": 0.69, "eval_loss_after": 0.41}  # reward_model/train.py's keys


def reward_peft(base: str | Path, seed: int = 0, r: int = 4) -> tuple[PeftModel, object]:
    """(the peft SEQ_CLS model on `base`, eval mode, its pad_token_id set, LoRA B and score ~ N(0, 0.3²)), tokenizer)."""
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=1,
                                                               pad_token_id=tokenizer.pad_token_id)
    peft = get_peft_model(model, PeftLoraConfig(task_type="SEQ_CLS", r=r, lora_alpha=2 * r, lora_dropout=0.0,
                                                target_modules=PROJECTIONS))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name or ("score" in name and "modules_to_save" in name):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return peft.eval(), tokenizer


def build_reward_run(run: Path, base: str | Path, *, quantize: str = "none", seed: int = 0,
                     dataset: str = "/home/someone/data/pairs.jsonl", summary: dict | None = SUMMARY) -> PeftModel:
    """Write a reward run folder at `run` for the model folder `base` (its reward.json and config.yaml naming
    `base` as given, `quantize` the 4-bit kind it claims to have trained on) → the peft model it saved."""
    peft, tokenizer = reward_peft(base, seed)
    adapter = run / "adapter"
    peft.save_pretrained(str(adapter))
    tokenizer.save_pretrained(str(adapter))
    model = ModelConfig(name=str(base), dtype="float32", quantize=quantize)
    config = replace(RewardRunConfig(), seed=seed, out=str(run), model=model, lora=LoraConfig(r=4, alpha=8.0),
                     pairs=PairsConfig(dataset=dataset))
    (run / "config.yaml").write_text(yaml.safe_dump(to_tree(config), sort_keys=False))
    info = {"kind": "reward-model", "base": str(base), "quantize": quantize, "dtype": "float32",
            "pad_token_id": tokenizer.pad_token_id, "score": "last non-pad token"}
    (run / "reward.json").write_text(json.dumps(info, indent=2) + "\n")
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return peft
