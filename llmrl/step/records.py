"""The rollout batch: the one place where the shapes of a training step are defined.

B prompts, G samples per prompt, N = B·G rows; rows [g·G, (g+1)·G) share prompt g. P = prompt
length (left-padded), T = response length (right-padded).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor


@dataclass
class RolloutBatch:
    """One step's samples and everything computed about them before the update.

    prompt_ids      (N, P) long, left-padded with the pad id
    prompt_mask     (N, P) bool, True = a real prompt token
    response_ids    (N, T) long, cut after the first EOS, right-padded with the pad id
    response_mask   (N, T) bool, True = a generated token that is trained on (EOS included)
    old_logprobs    (N, T) log π_old(a_t|s_t) of the sampled tokens at temperature T; 0 where masked
    ref_logprobs    (N, T) log π_ref, adapters disabled; None when no KL is used
    values          (N, T) V_old(s_t) from the critic; None when the estimator needs no critic
    scores          (N,)   reward of each response
    baseline_scores (N,)   reward of the greedy response to the same prompt (ReMax); else None
    reward_parts    {label: (N,)} each term of a weighted reward (scores = Σ weight · term); else None
    base_hidden     (N, P+T, H) the frozen base's hidden state entering the critic's first layer L−k
                    (a top-k critic's shortcut, `lora.critic_layers`); else None
    group_size      G
    prompt_index    (N,) long, the dataset index of each row's prompt
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    old_logprobs: Tensor
    group_size: int
    prompt_index: Tensor
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    scores: Tensor | None = None
    baseline_scores: Tensor | None = None
    reward_parts: dict[str, Tensor] | None = None
    base_hidden: Tensor | None = None

    @property
    def rows(self) -> int:
        return self.response_ids.shape[0]

    def validate(self) -> None:
        """Check shapes, mask dtype/polarity and that masked positions hold 0."""
        n, t = self.response_ids.shape
        assert self.response_mask.shape == (n, t) and self.response_mask.dtype == torch.bool
        assert self.prompt_ids.shape[0] == n and self.prompt_mask.shape == self.prompt_ids.shape
        assert n % self.group_size == 0, f"{n} rows do not split into groups of {self.group_size}"
        for name in ("old_logprobs", "ref_logprobs", "values"):
            x = getattr(self, name)
            if x is None:
                continue
            assert x.shape == (n, t), f"{name} has shape {tuple(x.shape)}, expected {(n, t)}"
            assert not x.masked_select(~self.response_mask).any(), f"{name} is non-zero where masked"
        for name in ("scores", "baseline_scores"):
            x = getattr(self, name)
            assert x is None or x.shape == (n,), f"{name} has shape {tuple(x.shape)}, expected {(n,)}"

    def select(self, rows: Tensor) -> "RolloutBatch":
        """The sub-batch of the given row indices (every tensor field indexed on dim 0)."""
        picked = {
            f.name: getattr(self, f.name)[rows]
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return replace(self, **picked)
