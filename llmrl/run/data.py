"""Which prompts a step trains on: a seeded permutation per epoch over the train split.

Step s takes global positions [s·B, (s+1)·B); position k is row perm_e[k mod n] of epoch
e = k // n. The order depends only on the seed, so a resumed run and runs that differ only in their algorithm
see the same prompts in the same order (with a different B they read the same stream in different
chunks).

`stream_digest` fingerprints what a step actually read: Σ_j h(k_j, row_j) mod 2^64 over its
(global position, train row) pairs, h = blake2b-64. The sum is independent of how the stream is cut
into steps, so two runs saw the same prompts at the same positions iff their digests, summed over
the steps that cover the same positions, agree (`llmrl compare` checks this).
"""

from __future__ import annotations

import hashlib

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


def stream_digest(start: int, index: Tensor) -> int:
    """Σ_j blake2b64(f"{start + j}:{index[j]}") mod 2^64: the step's (position, row) fingerprint."""
    total = 0
    for j, row in enumerate(index.tolist()):
        h = hashlib.blake2b(f"{start + j}:{row}".encode(), digest_size=8).digest()
        total += int.from_bytes(h, "little")
    return total % 2**64
