"""forward: `Samples` → `Forwards`, the forwards the plan asks for on the frozen sample.

log π_old (unless the engine's decoding gave it, or the update's own forward will), log π_ref
under the reference role (adapters disabled), V_old under the critic, and the base's hidden state
for a top-k critic. What is computed is decided by the `StepPlan`, never by an algorithm's name.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from ..config.schema import RolloutConfig
from ..models.stack import PolicyStack, Sequences, at_least_float32, layout
from .records import Forwards, Samples, StepPlan


class Responses(Protocol):
    """Anything holding prompt and response ids and masks, (N, P) and (N, T) (Samples, TrainRows)."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor


def generation_logprobs(cfg: RolloutConfig, dtype: torch.dtype) -> bool:
    """Whether log π_old comes from the decoding logits: asked for, and the model computes in at
    least float32 (in float16/bfloat16 the KV-cached decode and a full forward round differently
    enough to matter in the PPO ratio)."""
    return cfg.generation_logprobs and dtype in (torch.float32, torch.float64)


def sequences(x: Responses) -> Sequences:
    """The rows as one left-padded sequence each; an episode's attention covers the environment's
    tokens too (`context_mask`), which its response mask leaves out of every loss."""
    context = getattr(x, "context_mask", None)
    return layout(x.prompt_ids, x.prompt_mask, x.response_ids, x.response_mask if context is None else context)


@torch.no_grad()
def masked_logprobs(stack: PolicyStack, x: Responses, temperature: float) -> Tensor:
    """log π(a_t|s_t) of the responses in the current role, 0 where masked: (N, T)."""
    lp, _ = stack.response_stats(sequences(x), x.response_ids, x.response_mask, temperature)
    return torch.where(x.response_mask, lp, torch.zeros_like(lp))


@torch.no_grad()
def masked_values(stack: PolicyStack, x: Responses, base_hidden: Tensor | None = None) -> Tensor:
    """V(s_t) of the responses under the critic, 0 where masked: (N, T)."""
    v = critic_values(stack, x, base_hidden)
    return torch.where(x.response_mask, v, torch.zeros_like(v))


def critic_values(stack: PolicyStack, x: Responses, base_hidden: Tensor | None = None) -> Tensor:
    """V(s_t) of every response position under the critic, (N, T), with a graph when grad is on
    (from `base_hidden` when given: only the critic's top layers run)."""
    with stack.use("critic"):
        return stack.values(sequences(x), base_hidden)


def forward(stack: PolicyStack, samples: Samples, plan: StepPlan, temperature: float) -> Forwards:
    """Run the forwards `plan` asks for on `samples` (no grad, but for the kept critic graph).

    With `plan.critic_in_update` the critic's forward runs *with* its graph and LoRA dropout, as a
    gradient forward of the update (`update.on_policy_values`): its detached values serve as V_old
    and the update's critic pass backpropagates through `value_graph`."""
    dtype = at_least_float32(stack.lm.dtype)
    with torch.no_grad():
        old = _old_logprobs(stack, samples, plan, temperature)
        kept: list[Tensor] = []  # the base's hidden state at the critic's first layer, from the reference forward
        ref = None
        if plan.reference:
            with stack.use("reference"), stack.keeping_base(kept if plan.base_hidden else None):
                ref = masked_logprobs(stack, samples, temperature)
        base = None
        if plan.base_hidden:
            base = kept[0] if kept else stack.base_hidden(sequences(samples))
        values = masked_values(stack, samples, base) if plan.critic else None
    graph = None
    if plan.critic_in_update:
        with stack.dropout_active():
            graph = critic_values(stack, samples, base)
        values = torch.where(samples.response_mask, graph.detach(), torch.zeros_like(graph))
    return Forwards(dtype, old, ref, values, graph, base)


def _old_logprobs(stack: PolicyStack, samples: Samples, plan: StepPlan, temperature: float) -> Tensor | None:
    """log π_old: the engine's decoding log-probs when the plan takes them from generation, an actor
    forward otherwise, None when the update's own forward provides them."""
    if not plan.old_logprobs:
        return None
    if plan.from_generation and samples.behaviour_logprobs is not None:
        return samples.behaviour_logprobs
    with stack.use("actor"):
        return masked_logprobs(stack, samples, temperature)
