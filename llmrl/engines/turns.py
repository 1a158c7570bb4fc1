"""An episode batch's decoder, turn after turn (`step/episodes.generate_episodes`).

Every turn the episodes still playing are continued from their whole token sequence so far
(prompt + the model's turns + the environment's answers). `open_turns(engine, pad_id, role)` gives
the engine's own decoder when it has one (`engine.turn_decoder(role)`: the `hf` engine keeps each
episode's KV cache between turns, `engines/hf_turns.py`), else `Reprefill`, which sends the grown
sequences as a fresh left-padded request (the `vllm` engine: its prefix cache reuses the shared
part). Both sample turn k of episode i with the key the caller gives, so they draw the same tokens up
to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch
from torch import Tensor

from .base import Generation, GenerationEngine, GenerationRequest, SamplingSettings


class TurnDecoder(Protocol):
    """turn(episodes, sequences, settings, keys, logprobs=, room=) → a Generation of one row per
    episode: `episodes` (N,) the batch's episode numbers (a subset of the last turn's, in the same
    order), `sequences` each one's ids so far (each extends what it was at its last turn), `keys` (N,)
    seed keys or None for greedy, `room` (N,) the tokens each row may take (`GenerationRequest.room`)."""

    def turn(self, episodes: Sequence[int], sequences: Sequence[list[int]], settings: SamplingSettings,
             keys: Tensor | None, *, logprobs: bool, room: Tensor | None) -> Generation: ...


def left_pad(rows: Sequence[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids, bool mask), (B, L) left-padded to the longest row."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows], dtype=torch.bool)
    return ids, mask


@dataclass
class Reprefill:
    """The stateless decoder: each turn is a new request for the whole sequences."""

    engine: GenerationEngine
    pad_id: int
    role: str = "actor"

    def turn(self, episodes: Sequence[int], sequences: Sequence[list[int]], settings: SamplingSettings,
             keys: Tensor | None, *, logprobs: bool, room: Tensor | None) -> Generation:
        ids, mask = left_pad(sequences, self.pad_id)
        return self.engine.generate(GenerationRequest(ids, mask, 1, settings, keys, logprobs=logprobs,
                                                      role=self.role, room=room))


def open_turns(engine: GenerationEngine, pad_id: int, role: str = "actor", reuse_cache: bool = True) -> TurnDecoder:
    """The engine's own turn decoder (`engine.turn_decoder(role)`) when it has one and `reuse_cache`, else `Reprefill`."""
    own: Any = getattr(engine, "turn_decoder", None) if reuse_cache else None
    return own(role) if own is not None else Reprefill(engine, pad_id, role)
