"""generate: B dataset rows → `Samples` (G responses to each prompt, through the run's engine).

Each response row gets its seed key from (seed, step, prompt index, sample index), so the same
prompt gets the same completion whichever batch or process it lands in. The greedy response to
each prompt (ReMax's baseline) is a second request to the same engine.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from ..config.schema import RolloutConfig
from ..engines.base import GenerationEngine, GenerationRequest, SamplingSettings, row_keys
from ..models.prompts import Prompt, tokenize_prompts
from .records import Samples


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt], device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-padded (ids, bool mask), both (B, P); chat templates are applied here (`models/prompts.py`)."""
    enc = tokenize_prompts(tokenizer, prompts, return_tensors="pt", padding=True)
    return enc.input_ids.to(device), enc.attention_mask.to(device).bool()


def decode(tokenizer: PreTrainedTokenizerBase, response_ids: Tensor, response_mask: Tensor) -> list[str]:
    """Completion texts, without the stop token and padding."""
    ids = torch.where(response_mask, response_ids, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)


def settings_of(cfg: RolloutConfig) -> SamplingSettings:
    return SamplingSettings(cfg.max_new_tokens, cfg.temperature, cfg.top_p)


@torch.no_grad()
def generate(engine: GenerationEngine, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict[str, Any]],
             prompt_index: Tensor, *, cfg: RolloutConfig, seed: int, step: int, device: torch.device,
             logprobs: bool = False, greedy: bool = False, first_sample: int = 0) -> Samples:
    """Sample G = cfg.num_generations responses to each of the B `rows`' prompts.

    `prompt_index` (B,): the rows' dataset indices (they key the samples). `logprobs`: ask the
    engine for the behaviour log-probs; `greedy`: also the greedy response to each prompt.
    `first_sample`: the sample index of each prompt's first row (a later round of dynamic sampling
    starts at d·G, so a prompt drawn again in a step draws new responses)."""
    g = cfg.num_generations
    ids, mask = encode_prompts(tokenizer, [r["prompt"] for r in rows], device)
    index = prompt_index.repeat_interleave(g)
    keys = row_keys(seed, step, index, torch.arange(first_sample, first_sample + g).repeat(len(rows)))
    gen = engine.generate(GenerationRequest(ids, mask, g, settings_of(cfg), keys, logprobs=logprobs))
    # prompt_index lives on the model's device like every row field: the update indexes them all
    # with its minibatch rows, which live there
    return Samples(
        rows=tuple(rows), prompt_ids=ids.repeat_interleave(g, 0), prompt_mask=mask.repeat_interleave(g, 0),
        response_ids=gen.response_ids, response_mask=gen.response_mask, group_size=g,
        prompt_index=index.to(device), completions=tuple(decode(tokenizer, gen.response_ids, gen.response_mask)),
        behaviour_logprobs=gen.logprobs,
        greedy_completions=tuple(greedy_completions(engine, tokenizer, rows, cfg, device)) if greedy else None,
    )


@torch.no_grad()
def greedy_completions(engine: GenerationEngine, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict[str, Any]],
                       cfg: RolloutConfig, device: torch.device, role: str = "actor") -> list[str]:
    """The greedy response to each row's prompt (B texts), under `role`."""
    ids, mask = encode_prompts(tokenizer, [r["prompt"] for r in rows], device)
    gen = engine.generate(GenerationRequest(ids, mask, 1, settings_of(cfg), role=role))
    return decode(tokenizer, gen.response_ids, gen.response_mask)
