"""Generation engines: prompts in, sampled token ids (and behaviour log-probs) out (base.py);
`hf` (hf.py) decodes from the policy stack with its KV cache."""

from . import hf  # noqa: F401  (registers 'hf')
from .base import (ENGINES, Generation, GenerationEngine, GenerationRequest, SamplingSettings, build_engine,
                   register_engine, row_keys)

__all__ = ["ENGINES", "Generation", "GenerationEngine", "GenerationRequest", "SamplingSettings", "build_engine",
           "register_engine", "row_keys"]
