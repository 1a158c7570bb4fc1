"""A reward model given as a LoRA adapter: an llmrl reward run (`llmrl reward train`, RUN/reward.json +
RUN/adapter) or a peft SEQ_CLS adapter folder trained elsewhere (TRL's `RewardTrainer` with a LoRA config).

Where its base is the model the run trains, the run puts it on the one loaded base as a fourth role
(models/stack.py, `reward`: scored under no_grad with the adapters switched, never updated;
run/reward_role.py binds it). Elsewhere it is a separate classifier: the base loaded as
`AutoModelForSequenceClassification`, the adapter merged into it (`separate`). Either way it reads the text
`RewardModel.text` reads and scores r = w·h at the last non-pad token (models/scorer.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..config.schema import ModelConfig
from ..errors import ConfigError
from ..models.prompts import reward_text
from ..models.scorer import SavedReward, read_reward_adapter

Scores = Callable[[Sequence[str]], list[float]]  # texts → r per text


def adapter_folder(source: str) -> Path | None:
    """The adapter folder `source` names (RUN/adapter of a reward run, or `source` itself when it holds a peft
    SEQ_CLS adapter); None for anything else (a plain classifier folder, a hub id)."""
    path = Path(source).expanduser()
    if (path / "reward.json").exists():  # a reward run's folder (its reward.json, even damaged: _info says so)
        return path / "adapter"
    try:
        raw = json.loads((path / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    return path if isinstance(raw, dict) and raw.get("task_type") == "SEQ_CLS" else None


class AdapterReward:
    """Callable `rm(prompts, completions, **columns) -> list[float]` over a reward adapter, scored where
    `bind` says (the shared base, or a separate classifier)."""

    def __init__(self, source: str, batch_size: int = 16) -> None:
        self.source, self.batch_size = source, batch_size
        folder = adapter_folder(source)
        assert folder is not None
        info = _info(Path(source).expanduser())
        self.saved: SavedReward = read_reward_adapter(folder)
        self.base: str | None = info.get("base") or self.saved.base  # the model it was trained on
        self.quantize: str = info.get("quantize", "none")
        if not self.base:  # refused here, before any run folder is made
            where = "its reward.json has no 'base' and " if info else ""
            raise ConfigError(f"Reward model '{source}' names no base model ({where}its adapter_config.json has no "
                              "base_model_name_or_path); llmrl cannot tell what to load it on.")
        self.tokenizer: Any = None
        self._scores: Scores | None = None
        self.where = "unbound"  # 'shared' (the fourth role) or 'separate'

    def bind(self, scores: Scores, tokenizer: Any, where: str) -> None:
        self._scores, self.tokenizer, self.where = scores, tokenizer, where

    def text(self, prompt: Any, completion: str) -> str:
        return reward_text(self.tokenizer, prompt, completion)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        if self._scores is None:
            raise ConfigError(f"Reward model '{self.source}' is a LoRA adapter and was never placed on a base.")
        return self._scores([self.text(p, c) for p, c in zip(prompts, completions, strict=True)])


QUANTIZE = ("none", "nf4", "fp4")


def _info(path: Path) -> dict[str, Any]:
    """A reward run's reward.json ({} where there is none: a peft adapter folder); one that cannot be read, or
    whose kind, base or quantize is not what `llmrl reward train` writes, is refused in one sentence."""
    if not (path / "reward.json").exists():
        return {}
    try:
        info = json.loads((path / "reward.json").read_text(encoding="utf-8"))
    except OSError as exc:  # a folder in its place, no permission
        why = f"it cannot be read: {exc.strerror or type(exc).__name__}"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        why = f"it is not JSON: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    else:
        why = _wrong(info)
    if why:
        raise ConfigError(f"Reward run '{path}' has a reward.json llmrl cannot use ({why}); it was cut short or "
                          "edited: restore it, or train the reward run again.")
    return info


def _wrong(info: Any) -> str | None:
    """What in a parsed reward.json is not as `llmrl reward train` writes it (None: nothing)."""
    if not isinstance(info, dict):
        return f"it holds a {type(info).__name__}, not an object"
    if info.get("kind") != "reward-model":
        return f"its kind is {info.get('kind')!r}, not 'reward-model'"
    if "base" in info and not (isinstance(info["base"], str) and info["base"]):
        return f"its base is {info['base']!r}, not a model name"
    if info.get("quantize", "none") not in QUANTIZE:
        return f"its quantize is {info.get('quantize')!r}, not one of {', '.join(QUANTIZE)}"
    return None


def separate(reward: AdapterReward, model: ModelConfig, device: torch.device, dtype: torch.dtype) -> Scores:
    """A separate classifier: `reward.base` loaded as a sequence classifier (one label), the adapter merged in,
    frozen; texts scored in batches, right-padded. Returns the scoring function (and binds the tokenizer)."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ..models.load import model_source
    from ..models.scorer import text_scores

    from transformers.utils import logging as hf_logging

    try:
        source, _ = model_source(ModelConfig(name=str(reward.base), trust_remote_code=model.trust_remote_code),
                                 show_progress=False)
    except ConfigError as exc:
        raise ConfigError(f"The base of reward model '{reward.source}' cannot be loaded: {exc}") from None
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report: the score head is missing from a causal LM, as it must be
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=model.trust_remote_code)
        classifier = AutoModelForSequenceClassification.from_pretrained(
            source, num_labels=1, dtype=dtype, trust_remote_code=model.trust_remote_code)
        merged = PeftModel.from_pretrained(classifier, str(adapter_folder(reward.source))).merge_and_unload()
    except Exception as exc:  # transformers and peft raise many kinds for a missing or mismatched base
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
        first = next((line for line in lines if "size mismatch" in line), lines[0]).rstrip(".:")
        raise ConfigError(f"Cannot load reward model '{reward.source}' on its base '{reward.base}': {first}.") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    merged.to(device).eval().requires_grad_(False)
    decoder, head = merged.base_model, merged.score

    reward.tokenizer = tokenizer
    return lambda texts: text_scores(decoder, head, tokenizer, texts, reward.batch_size)
