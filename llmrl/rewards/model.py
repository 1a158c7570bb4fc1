"""A reward model: any `AutoModelForSequenceClassification` (hub id or folder), frozen.

Each completion is scored on the text prompt + completion:
  - a string prompt: `prompt + completion`;
  - a chat prompt: the reward model's chat template over the messages plus
    `{role: assistant, content: completion}` when its tokenizer has one, else the message contents
    joined by newlines, a newline, then the completion (`models.prompts.reward_text`, the rule a reward run's
    pairs are read by too).
The score is the logit when the model has one label (the usual reward-model head), else the
softmax probability of the last label (e.g. 'positive'). Texts are scored in batches of
`reward.batch_size`, right-padded and truncated from the left (the completion is kept).
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ..errors import ConfigError, PluginError
from ..models.prompts import reward_text


def check_score_head(source: str, model: Any, missing: Any) -> None:
    """Refuse a checkpoint without the classifier's weights (e.g. a ...ForCausalLM folder): the
    head transformers would initialise at random scores noise (the mirror of `models.load.check_causal`)."""
    if not missing:
        return
    archs = getattr(model.config, "architectures", None) or []
    kind = f"a {archs[0]}, not a sequence classifier" if archs else "not a trained sequence classifier"
    raise ConfigError(f"Reward model '{source}' is {kind}: its checkpoint has no {', '.join(sorted(missing))}, "
                      "so its score head would be random.")


class RewardModel:
    """Callable `rm(prompts, completions, **columns) -> list[float]` over a frozen classifier."""

    def __init__(self, source: str, device: torch.device, dtype: torch.dtype = torch.float32,
                 batch_size: int = 16, trust_remote_code: bool = False) -> None:
        self.source, self.batch_size, self.device = source, batch_size, device
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
            with warnings.catch_warnings():  # a head of 0 labels is refused by its first scores, in one sentence
                warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
                self.model, info = AutoModelForSequenceClassification.from_pretrained(
                    source, dtype=dtype, trust_remote_code=trust_remote_code, output_loading_info=True)
        except (OSError, ValueError, KeyError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"Cannot load reward model '{source}' as a sequence classifier: {first}") from None
        check_score_head(source, self.model, info["missing_keys"])
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.tokenizer.padding_side, self.tokenizer.truncation_side = "right", "left"
        self.max_length = getattr(self.model.config, "max_position_embeddings", None)
        self.model.to(device).eval()
        self.model.requires_grad_(False)

    def text(self, prompt: Any, completion: str) -> str:
        """What the reward model reads for one (prompt, completion) pair (see the module docstring)."""
        return reward_text(self.tokenizer, prompt, completion)

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        texts = [self.text(p, c) for p, c in zip(prompts, completions, strict=True)]
        out: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[start:start + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=self.max_length is not None, max_length=self.max_length)
            logits = self.check_logits(self.model(**enc.to(self.device)).logits, len(enc["input_ids"]), start).float()
            scores = logits[:, 0] if logits.shape[-1] == 1 else logits.softmax(-1)[:, -1]
            out += scores.tolist()
        return out

    def check_logits(self, logits: Any, n: int, first: int = 0) -> torch.Tensor:
        """The classifier's logits for n texts (the batch from completion `first`): a floating tensor of
        shape (n, L), L ≥ 1 labels; anything else a PluginError naming the model (its NaN or infinite
        scores are refused with the other rewards' in step/score.py)."""
        ok = (isinstance(logits, torch.Tensor) and logits.is_floating_point() and logits.ndim == 2
              and logits.shape[0] == n and logits.shape[1] >= 1)
        if not ok:
            what = (f"logits of shape {tuple(logits.shape)} ({logits.dtype})" if isinstance(logits, torch.Tensor)
                    else f"logits that are a {type(logits).__name__}")
            which = f"completion {first}" if n == 1 else f"completions {first}–{first + n - 1}"
            raise PluginError(f"Reward model '{self.source}' returned {what} for {which}, not a floating (batch, labels) "
                              f"tensor of shape ({n}, L) with L ≥ 1 labels.")
        return logits
