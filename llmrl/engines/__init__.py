"""Generation engines: prompts in, sampled token ids (and behaviour log-probs) out (base.py);
`hf` (hf.py) decodes from the policy stack with its KV cache; `vllm` (vllm_engine.py) samples with a
colocated vLLM engine (imported only when a run asks for it)."""

from . import hf, vllm_engine  # noqa: F401  (register 'hf' and 'vllm')
from .base import (ENGINES, Generation, GenerationEngine, GenerationRequest, SamplingSettings, build_engine,
                   check_engine, register_engine, row_keys)

__all__ = ["ENGINES", "Generation", "GenerationEngine", "GenerationRequest", "SamplingSettings", "build_engine",
           "check_engine", "register_engine", "row_keys"]
