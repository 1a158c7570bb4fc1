"""Which prompts a step trains on: a seeded permutation per epoch over the train split.

Step s takes global positions [s·B, (s+1)·B); position k is row perm_e[k mod n] of epoch
e = k // n. The order depends only on (seed, B), so a resumed run and runs that differ only in
their algorithm see the same prompts in the same order.
"""

from __future__ import annotations

import torch
from torch import Tensor


class PromptSampler:
    def __init__(self, n_rows: int, per_step: int, seed: int) -> None:
        if n_rows < 1:
            raise ValueError("the train split is empty")
        self.n, self.per_step, self.seed = n_rows, per_step, seed
        self._perms: dict[int, Tensor] = {}

    def _perm(self, epoch: int) -> Tensor:
        if epoch not in self._perms:
            g = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._perms = {epoch: torch.randperm(self.n, generator=g)}
        return self._perms[epoch]

    def indices(self, step: int) -> Tensor:
        """(B,) long: the train-row indices of step `step` (0-based)."""
        out = []
        for k in range(step * self.per_step, (step + 1) * self.per_step):
            out.append(int(self._perm(k // self.n)[k % self.n]))
        return torch.tensor(out, dtype=torch.long)
