"""The settings of a reward-model run (`llmrl reward train`): the base, its LoRA, the preference pairs,
the Bradley–Terry training.

A reward run shares `model` and `lora` with `llmrl train` (the same base loads the same way, float or
`model.quantize`), `checkpoint`, `memory` (config/memory.py), `seed`, `out` and `threads`; its own sections are `pairs` (where the
preference data comes from) and `rm` (the training). Recipes and `--set` address it by the same dotted
keys (`rm.lr=1e-4`); config/load.py validates it against this root.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .domains import SEED_MAX
from .memory import MemoryConfig
from .schema import CheckpointConfig, LoraConfig, ModelConfig, opt


@dataclass(frozen=True)
class PairsConfig:
    dataset: str | None = opt(None, "preference pairs in TRL's format: a local .jsonl/.parquet/.csv file or a `datasets` "
                              "hub name, with columns prompt + chosen + rejected (text or lists of messages) or chosen + "
                              "rejected alone (whole conversations, the implicit prompt)")
    split: str = opt("train", "split of a hub dataset to train on")
    eval_dataset: str | None = opt(None, "held-out pairs from this file or hub name; default: hold out pairs.eval_fraction")
    eval_split: str = opt("test", "split of a hub eval_dataset")
    eval_fraction: float = opt(0.1, "share of the pairs held out when no eval_dataset is given", min=0, max=0.9)
    split_seed: int = opt(1234, "seed of the fixed train/held-out shuffle (independent of the run's seed)", min=0,
                          max=SEED_MAX)
    max_rows: int | None = opt(None, "use only the first N pairs of the dataset (and of eval_dataset)", min=1)
    margin_column: str | None = opt(None, "column of a margin m ≥ 0 per pair: loss −log σ(r_w − r_l − m); default: "
                                    "'margin' where the dataset has it, as TRL's RewardTrainer reads it")
    max_length: int | None = opt(None, "tokens of prompt + answer at most; a longer pair is refused, naming it; "
                                 "default: the model's context window", min=2)
    chat_template: str = opt("auto", "'auto': conversations through the tokenizer's chat template (text pairs as they are); "
                             "'on': require one", choices=("auto", "on"))


@dataclass(frozen=True)
class RMTrainConfig:
    epochs: float = opt(1.0, "passes over the training pairs (a fraction stops part-way)", gt=0)
    batch_size: int = opt(8, "pairs per optimizer step", min=1)
    micro_batch_size: int | None = opt(None, "pairs per forward/backward (gradients accumulated to batch_size); "
                                       "default: the whole batch", min=1)
    lr: float = opt(1e-4, "AdamW learning rate of the reward adapter and score head", gt=0)
    weight_decay: float = opt(0.0, "AdamW weight decay", min=0)
    lr_schedule: str = opt("linear", "learning-rate schedule over the run", choices=("constant", "linear", "cosine"))
    warmup_ratio: float = opt(0.0, "share of the steps the learning rate rises linearly from 0", min=0, max=1)
    max_grad_norm: float = opt(1.0, "clip the gradient's global norm to this (0: off)", min=0)
    center_coefficient: float = opt(0.0, "TRL's reward centering (Eisenstein et al. 2023): + c·mean((r_w + r_l)²) keeps "
                                    "scores near 0 (TRL suggests 0.01; 0: off)", min=0)
    eval_every: int = opt(50, "score the held-out pairs every N optimizer steps (0: only before and after)", min=0)
    eval_batch_size: int = opt(16, "pairs per held-out forward", min=1)
    share_prompt: bool = opt(True, "run the tokens a pair's chosen and rejected texts start with once (their prompt, "
                             "and the opening every pair shares once per batch), not twice: the same scores up to float "
                             "rounding in fewer positions; off: one plain forward of both whole texts (TRL's way)")


@dataclass(frozen=True)
class RewardRunConfig:
    seed: int = opt(0, "seed of the shuffles, the score head's start and the adapter's initialisation", min=0, max=SEED_MAX)
    out: str | None = opt(None, "run folder; default: runs/reward-<data>-<time>")
    threads: int | None = opt(None, "torch CPU threads; default: torch's choice", min=1, max=1024)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    pairs: PairsConfig = field(default_factory=PairsConfig)
    rm: RMTrainConfig = field(default_factory=RMTrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)


def load_reward_config(recipe: str | None = None, overrides: dict[str, Any] | None = None,
                       sets: list[str] | None = None) -> RewardRunConfig:
    """A reward run's settings: defaults < recipe < overrides (typed CLI flags) < `--set key=value`, with
    `model.dtype: auto` resolved for this hardware as `llmrl train` resolves it (config/precision.py)."""
    from . import precision
    from .load import build, parse_override, read_recipe
    from .model_defaults import device_kind

    user: dict[str, Any] = read_recipe(recipe, RewardRunConfig) if recipe else {}
    user.update({k: v for k, v in (overrides or {}).items() if v is not None})
    user.update(dict(parse_override(s) for s in sets or []))
    device = str(user.get("model.device", ModelConfig.device))
    merged = precision.resolve(user, device_kind(device), ModelConfig.dtype, ModelConfig.name)
    return build(merged, RewardRunConfig)
