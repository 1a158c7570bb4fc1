"""Which prompts a step trains on: a seeded permutation per epoch over the train split.

Step s takes global positions [s·B, (s+1)·B); position k is row perm_e[k mod n] of epoch
e = k // n. perm_0 is the seeded permutation of epoch 0; perm_e (e ≥ 1) is epoch e's seeded
permutation with its head rearranged so that no step reads a row twice. A step that straddles the
boundary of epochs e−1 and e reads the last t = (e·n) mod B rows of perm_{e−1} (the tail) and the
first h = B − t of perm_e (the head); each head position j < h whose row is in the tail is swapped
with the next position j′ ≥ h (scanning forward) whose row is not, so the epoch stays a permutation
(every row once per epoch) and only those positions change. A swap partner always exists when
B ≤ n (the tail's t rows leave n − t others, of which the head holds at most h − d when d of its
rows are the tail's: n − B + d ≥ d remain beyond it); a step of B > n rows would have to repeat a
row, so a run refuses it (run/session.py). Without such a collision perm_e is the seeded permutation
itself, so the stream is the plain one up to the first step that would have read a row twice.

The order depends only on the seed, n and B, so a resumed run and runs that differ only in their
algorithm see the same prompts in the same order (with a different B they read the same stream in
different chunks, except near an epoch boundary, where the swaps depend on how B cuts the stream).

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
        if per_step > n_rows:
            raise ValueError(f"a step of {per_step} prompts would read some of the {n_rows} train rows twice")
        self.n, self.per_step, self.seed = n_rows, per_step, seed
        self._perms: dict[int, Tensor] = {}

    def _seeded(self, epoch: int) -> Tensor:
        g = torch.Generator().manual_seed(self.seed * 7919 + epoch)
        return torch.randperm(self.n, generator=g)

    def _perm(self, epoch: int) -> Tensor:
        """perm_epoch (the module docstring), built forward from the latest epoch at hand (or from 0);
        the last two epochs are kept (a step reads at most two)."""
        if epoch not in self._perms:
            known = [e for e in self._perms if e < epoch]
            e = max(known) if known else 0
            perm = self._perms[e] if known else self._seeded(0)
            while e < epoch:
                e += 1
                perm = self._apart(self._seeded(e), perm, e)
            self._perms = {k: v for k, v in self._perms.items() if k == epoch - 1}
            self._perms[epoch] = perm
        return self._perms[epoch]

    def _apart(self, perm: Tensor, previous: Tensor, epoch: int) -> Tensor:
        """`perm` (epoch `epoch`'s seeded order) with every row of its head that the boundary step also
        reads in `previous`'s tail swapped with the next row beyond the head that it does not read."""
        tail = (epoch * self.n) % self.per_step
        if tail == 0:  # the boundary is a step's first position: no step reads both epochs
            return perm
        head = self.per_step - tail
        seen = set(previous[self.n - tail:].tolist())
        rows = perm.tolist()
        if not seen.intersection(rows[:head]):
            return perm
        partner = head
        for j in range(head):
            if rows[j] in seen:
                while rows[partner] in seen:
                    partner += 1
                rows[j], rows[partner] = rows[partner], rows[j]
                partner += 1
        return torch.tensor(rows, dtype=perm.dtype)

    def indices(self, step: int) -> Tensor:
        """(B,) long: the train-row indices of step `step` (0-based), B distinct rows."""
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
