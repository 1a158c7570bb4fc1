"""Importance-sampling corrections between the sampler μ and the trainer's π_old (`update.is_correction`).

A generation engine with its own kernels (vLLM) samples from μ, which differs slightly from the
trainer's π_old (another kernel, another dtype), so the samples of a step are not quite on-policy
for the update's ratio π_θ/π_old. A correction turns the per-token ratio

    ρ_t = exp(log π_old_t − log μ_t)

into a weight w ≥ 0 that multiplies each token's policy-gradient term (llmrl/step/update.py). All
per-token tensors are (N, T) with a bool `mask` (True = trained token); masked positions never
influence a result, whatever they hold, and get w = 0. Registered by name (`@register_correction`);
each takes (log π_old, log μ, mask, C, (low, high)) and returns a `Correction`.

The weighting corrections (tis, seq_tis) scale a token's term. The rejecting ones (token_mask,
seq_mask; `config.schema.REJECTING_CORRECTIONS`) *drop* tokens or rows: `Correction.kept` says which
stay, and the update removes the others from the batch (from every loss term and from the token
and sequence counts the losses are normalised by), so a batch with a rejected row trains exactly as
the batch without it. Zeroing their advantage instead would leave them in the counts, in the
KL-in-loss and entropy terms and in GSPO's sequence ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from .errors import ConfigError


@dataclass(frozen=True)
class Correction:
    weights: Tensor  # (N, T) float, detached, ≥ 0; 0 where masked
    truncated: Tensor  # (N, T) bool: tokens whose weight was truncated (cut to C) or masked (set to 0)
    kept: Tensor | None = None  # (N, T) bool: a rejecting correction's tokens that stay in the batch; None: all


CorrectionFn = Callable[[Tensor, Tensor, Tensor, float, tuple[float, float]], Correction]

CORRECTIONS: dict[str, CorrectionFn] = {}


def register_correction(name: str) -> Callable[[CorrectionFn], CorrectionFn]:
    """Decorator: register a correction under `name`. A duplicate name is an error."""

    def wrap(fn: CorrectionFn) -> CorrectionFn:
        if name in CORRECTIONS:
            raise ValueError(f"IS correction '{name}' is already registered")
        CORRECTIONS[name] = fn
        return fn

    return wrap


def get_correction(name: str) -> CorrectionFn:
    """The correction registered under `name`; unknown names list the valid ones."""
    if name not in CORRECTIONS:
        raise ConfigError(f"Unknown IS correction '{name}'; valid IS corrections: {', '.join(sorted(CORRECTIONS))}.")
    return CORRECTIONS[name]


def _log_ratio(old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log ρ_t = log π_old_t − log μ_t where kept, 0 where masked; (N, T), detached, at least float32."""
    diff = (old_logprobs.detach() - behaviour_logprobs.detach()).to(torch.promote_types(old_logprobs.dtype, torch.float32))
    return torch.where(mask, diff, torch.zeros_like(diff))


def _result(weights: Tensor, truncated: Tensor, mask: Tensor, keep: Tensor | None = None) -> Correction:
    """Zero the weights where masked; a masked position never counts as truncated, nor as kept."""
    return Correction(torch.where(mask, weights, torch.zeros_like(weights)), truncated & mask,
                      None if keep is None else keep & mask)


@register_correction("off")
def no_correction(old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, clip: float = 2.0,
                  band: tuple[float, float] = (0.5, 2.0)) -> Correction:
    """w_t = 1 on every kept token (μ is taken to be π_old)."""
    ones = torch.ones_like(_log_ratio(old_logprobs, behaviour_logprobs, mask))
    return _result(ones, torch.zeros_like(mask), mask)


@register_correction("tis")
def token_tis(old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, clip: float = 2.0,
              band: tuple[float, float] = (0.5, 2.0)) -> Correction:
    """Token-level truncated IS (Yao et al. 2025): w_t = min(ρ_t, C), computed as exp(min(log ρ_t, log C))
    so a huge ratio cannot overflow. `truncated`: ρ_t > C."""
    log_ratio = _log_ratio(old_logprobs, behaviour_logprobs, mask)
    return _result(torch.exp(log_ratio.clamp(max=math.log(clip))), log_ratio > math.log(clip), mask)


@register_correction("seq_tis")
def sequence_tis(old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, clip: float = 2.0,
                 band: tuple[float, float] = (0.5, 2.0)) -> Correction:
    """Sequence-level truncated IS: w_i = min(exp(Σ_t m_t log ρ_t), C), the product of row i's token
    ratios, on every kept token of row i. `truncated`: every kept token of a row whose product > C."""
    seq = _log_ratio(old_logprobs, behaviour_logprobs, mask).sum(-1, keepdim=True)  # (N, 1)
    weights = torch.exp(seq.clamp(max=math.log(clip))).expand(mask.shape)
    return _result(weights, (seq > math.log(clip)).expand(mask.shape), mask)


@register_correction("token_mask")
def token_mask(old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, clip: float = 2.0,
               band: tuple[float, float] = (0.5, 2.0)) -> Correction:
    """Token rejection: token t stays in the batch (w_t = 1) if low ≤ ρ_t ≤ high, else it is dropped
    (w_t = 0, `kept` False). `truncated`: the rejected tokens."""
    log_ratio = _log_ratio(old_logprobs, behaviour_logprobs, mask)
    keep = (log_ratio >= math.log(band[0])) & (log_ratio <= math.log(band[1]))
    return _result(keep.to(log_ratio.dtype), ~keep, mask, keep)


@register_correction("seq_mask")
def sequence_mask(old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, clip: float = 2.0,
                  band: tuple[float, float] = (0.5, 2.0)) -> Correction:
    """Sequence rejection by the geometric-mean ratio (verl's geo mask):
    r_i = exp((1/|y_i|) Σ_t m_t log ρ_t);  row i stays in the batch (w_i = 1 on its tokens) if
    low ≤ r_i ≤ high, else it is dropped whole (w_i = 0, `kept` False). `truncated`: every token of a
    rejected row."""
    log_ratio = _log_ratio(old_logprobs, behaviour_logprobs, mask)
    mean = log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # (N, 1)
    keep = ((mean >= math.log(band[0])) & (mean <= math.log(band[1]))).expand(mask.shape)
    return _result(keep.to(log_ratio.dtype), ~keep, mask, keep)
