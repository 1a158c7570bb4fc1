"""rollout: prompts → a scored `RolloutBatch` (generate, then the forwards the algorithm needs).

What is computed is decided by `RolloutPlan`, which the trainer derives from the estimator's
`needs` and the KL settings, never from an algorithm's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from ..batch import RolloutBatch
from ..config.schema import RolloutConfig
from ..models.prompts import Prompt, tokenize_prompts
from ..models.stack import PolicyStack, at_least_float32, layout, token_logprobs
from ..models.tokenizer import stop_token_ids
from .rewards import score, score_parts
from .sampling import generate, row_uniforms


@dataclass(frozen=True)
class RolloutPlan:
    """What to compute besides the samples and their old log-probs."""

    reference: bool  # ref_logprobs (any KL with β > 0)
    critic: bool  # values
    greedy: bool  # baseline_scores from a greedy response (ReMax)
    old_logprobs: bool = True  # False: the update's own forward fills them in (update.on_policy_logprobs)
    from_generation: bool = False  # old log-probs from the decoding logits, not a second actor forward
    critic_in_update: bool = False  # values from the critic's update forward (update.on_policy_values)
    base_hidden: bool = False  # keep the base's hidden state at the critic's first layer (lora.critic_layers)


def generation_logprobs(cfg: RolloutConfig, dtype: torch.dtype) -> bool:
    """Whether log π_old comes from the decoding logits: asked for, and the model computes in at
    least float32 (in float16/bfloat16 the KV-cached decode and a full forward round differently
    enough to matter in the PPO ratio)."""
    return cfg.generation_logprobs and dtype in (torch.float32, torch.float64)


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt], device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-padded (ids, bool mask), both (N, P); chat templates are applied here (`models/prompts.py`)."""
    enc = tokenize_prompts(tokenizer, prompts, return_tensors="pt", padding=True)
    return enc.input_ids.to(device), enc.attention_mask.to(device).bool()


def decode(tokenizer: PreTrainedTokenizerBase, response_ids: Tensor, response_mask: Tensor) -> list[str]:
    """Completion texts, without EOS and padding."""
    ids = torch.where(response_mask, response_ids, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)


@torch.no_grad()
def masked_logprobs(stack: PolicyStack, batch: RolloutBatch, temperature: float) -> Tensor:
    """log π(a_t|s_t) of the batch's responses in the current role, 0 where masked: (N, T)."""
    seq = layout(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    lp = token_logprobs(stack.response_logits(seq, temperature), batch.response_ids)
    return torch.where(batch.response_mask, lp, torch.zeros_like(lp))


@torch.no_grad()
def masked_values(stack: PolicyStack, batch: RolloutBatch) -> Tensor:
    """V(s_t) of the batch's responses under the critic, 0 where masked: (N, T)."""
    v = critic_values(stack, batch)
    return torch.where(batch.response_mask, v, torch.zeros_like(v))


def critic_values(stack: PolicyStack, batch: RolloutBatch) -> Tensor:
    """V(s_t) of every response position under the critic, (N, T), with a graph when grad is on
    (from `batch.base_hidden` when the rollout kept it: only the critic's top layers run)."""
    with stack.use("critic"):
        return stack.values(layout(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask),
                            batch.base_hidden)


@torch.no_grad()
def rollout(
    stack: PolicyStack,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, Any]],
    prompt_index: Tensor,
    *,
    cfg: RolloutConfig,
    plan: RolloutPlan,
    reward_fn: Any,
    seed: int,
    step: int,
) -> tuple[RolloutBatch, list[str]]:
    """Sample G responses for each of B prompts and compute what `plan` asks for.

    `rows` are the B dataset rows; the returned batch has N = B·G rows, group-contiguous.
    Returns the batch and the N completion texts.
    """
    g = cfg.num_generations
    device = stack.lm.device
    prompts = [r["prompt"] for r in rows]
    ids, mask = encode_prompts(tokenizer, prompts, device)
    ids, mask = ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0)
    index = prompt_index.repeat_interleave(g)
    sample = torch.arange(g).repeat(len(rows))
    uniforms = row_uniforms(seed, step, index, sample, cfg.max_new_tokens).to(device)
    eos, pad = stop_token_ids(tokenizer, stack.lm), tokenizer.pad_token_id
    with stack.use("actor"):
        gen = generate(stack, ids, mask, max_new_tokens=cfg.max_new_tokens, eos_id=eos, pad_id=pad,
                       temperature=cfg.temperature, top_p=cfg.top_p, uniforms=uniforms,
                       logprobs=plan.old_logprobs and plan.from_generation)
    # prompt_index lives on the model's device like every row field: `batch.select` indexes them all
    # with the update's minibatch rows, which live there
    batch = RolloutBatch(ids, mask, gen.response_ids, gen.response_mask,
                         old_logprobs=torch.zeros(0), group_size=g, prompt_index=index.to(device))
    if gen.logprobs is not None:
        batch.old_logprobs = gen.logprobs
    elif plan.old_logprobs:
        with stack.use("actor"):
            batch.old_logprobs = masked_logprobs(stack, batch, cfg.temperature)
    else:  # filled in by the update's forward, before its one optimizer step (update.py)
        batch.old_logprobs = torch.zeros(gen.response_ids.shape, dtype=at_least_float32(stack.lm.dtype), device=device)
    kept: list[Tensor] = []  # the base's hidden state at the critic's first layer, from the reference forward
    if plan.reference:
        with stack.use("reference"), stack.keeping_base(kept if plan.base_hidden else None):
            batch.ref_logprobs = masked_logprobs(stack, batch, cfg.temperature)
    if plan.base_hidden:
        batch.base_hidden = kept[0] if kept else stack.base_hidden(
            layout(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask))
    if plan.critic:
        batch.values = masked_values(stack, batch)
    completions = decode(tokenizer, gen.response_ids, gen.response_mask)
    expanded = [r for r in rows for _ in range(g)]
    scores, parts = score_parts(reward_fn, expanded, completions)
    batch.scores, batch.reward_parts = scores.to(device), parts or None
    if plan.greedy:
        batch.baseline_scores = greedy_scores(stack, tokenizer, rows, cfg, reward_fn).repeat_interleave(g).to(device)
    batch.validate()
    return batch, completions


@torch.no_grad()
def greedy_scores(stack: PolicyStack, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict[str, Any]],
                  cfg: RolloutConfig, reward_fn: Any) -> Tensor:
    """(B,) reward of the actor's greedy response to each prompt (the ReMax baseline)."""
    ids, mask = encode_prompts(tokenizer, [r["prompt"] for r in rows], stack.lm.device)
    with stack.use("actor"):
        gen = generate(stack, ids, mask, max_new_tokens=cfg.max_new_tokens,
                       eos_id=stop_token_ids(tokenizer, stack.lm), pad_id=tokenizer.pad_token_id)
    return score(reward_fn, rows, decode(tokenizer, gen.response_ids, gen.response_mask))
