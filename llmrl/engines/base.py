"""The generation-engine interface and its registry (`rollout.engine` chooses one by name).

An engine turns a `GenerationRequest` (B prompts as token ids, G samples each, the sampling
settings and one seed key per row) into a `Generation` (token ids, masks and, when it has them,
the behaviour log-probs of the drawn tokens). The trainer tells it when the actor's weights have
changed (`sync(stack)`); an engine that samples from the stack itself has nothing to do then, one
that keeps its own copy of the weights (vLLM) pushes them. The loop never names an engine.

Seed keys make a row's sample independent of where it lands: row i's key depends only on
(seed, step, prompt index, sample index), so 1 and W processes, any batch size, and a resumed run
draw the same completion for the same prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch import Tensor

from ..errors import ConfigError

_MIX = (1_000_003, 10_007, 101, 7)


def row_keys(seed: int, step: int, prompt_index: Tensor, sample_index: Tensor) -> Tensor:
    """(N,) int64 seed keys: (seed·1000003 + step·10007 + prompt·101 + sample·7) mod (2^63 − 1)."""
    keys = [(seed * _MIX[0] + step * _MIX[1] + p * _MIX[2] + s * _MIX[3]) % (2**63 - 1)
            for p, s in zip(prompt_index.tolist(), sample_index.tolist())]
    return torch.tensor(keys, dtype=torch.long)


@dataclass(frozen=True)
class SamplingSettings:
    """max_new_tokens; the policy is softmax(logits / temperature) restricted to the top-p nucleus."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass(frozen=True)
class GenerationRequest:
    """B prompts, G samples of each.

    prompt_ids   (B, P) long, left-padded; prompt_mask (B, P) bool
    num_samples  G: the response rows are prompt-major, rows [b·G, (b+1)·G) answer prompt b
    settings     SamplingSettings
    keys         (B·G,) int64 seed keys (`row_keys`), one per response row; None: greedy decoding
    logprobs     also return log μ of the drawn tokens, when the engine can give them
    role         'actor' (the trained policy) or 'reference' (the frozen base: no adapter)
    room         (B·G,) int, episodes only: the new tokens each row may still take (≤ settings.max_new_tokens;
                 its episode's budget or the context ends there); an engine may stop a row there
                 (vllm must: it refuses to decode past its context), the caller cuts it there anyway
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    num_samples: int
    settings: SamplingSettings
    keys: Tensor | None = None
    logprobs: bool = False
    role: str = "actor"
    room: Tensor | None = None


@dataclass(frozen=True)
class Generation:
    """response_ids (N, T) right-padded with pad after the first stop token; response_mask (N, T)
    bool, True up to and including the first stop token; logprobs (N, T) log μ(a_t|s_t) of the drawn
    tokens (0 where masked) when asked for and available, else None."""

    response_ids: Tensor
    response_mask: Tensor
    logprobs: Tensor | None = None


class GenerationEngine(Protocol):
    """What the step needs from an engine."""

    name: str
    own_weights: bool  # True: samples from its own copy of the weights (log-probs are μ, synced by `sync`)

    def generate(self, request: GenerationRequest) -> Generation: ...

    def sync(self, stack: Any) -> None:
        """The actor's trainable weights may have changed: sample from the new ones from now on."""
        ...

    def stats(self) -> dict[str, float]:
        """Scalars for the step's metrics row (e.g. what the last sync pushed); {} for none."""
        ...


EngineFactory = Callable[..., GenerationEngine]
ENGINES: dict[str, EngineFactory] = {}
PREFLIGHTS: dict[str, Callable[[Any], None]] = {}


def register_engine(name: str, preflight: Callable[[Any], None] | None = None) -> Callable[[EngineFactory], EngineFactory]:
    """Decorator: register `factory(stack=, tokenizer=, config=, dist=) -> GenerationEngine`;
    `preflight(config)` raises a ConfigError for a run the engine cannot serve, before anything is loaded."""

    def wrap(factory: EngineFactory) -> EngineFactory:
        if name in ENGINES:
            raise ValueError(f"engine '{name}' is already registered")
        ENGINES[name] = factory
        if preflight is not None:
            PREFLIGHTS[name] = preflight
        return factory

    return wrap


def check_engine(name: str, config: Any) -> None:
    """Refuse an unknown engine, or a run the engine's preflight refuses (e.g. vLLM not installed)."""
    if name not in ENGINES:
        raise ConfigError(f"Unknown generation engine '{name}'; valid engines: {', '.join(sorted(ENGINES))}.")
    if name in PREFLIGHTS:
        PREFLIGHTS[name](config)


def build_engine(name: str, **context: Any) -> GenerationEngine:
    """The engine registered under `name`, built for this run; unknown names list the valid ones."""
    check_engine(name, context.get("config"))
    return ENGINES[name](**context)
