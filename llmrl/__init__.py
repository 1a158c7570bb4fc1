"""llmrl: fine-tune causal language models with reinforcement learning.

    from llmrl import load_config, train, read_run
    run = train(load_config(overrides={"algo": "grpo", "steps": 20, "out": "runs/demo"}))
    print(run.summary["eval_accuracy_after"])

`train`, `Run` and `read_run` are imported on first use (they pull in torch, transformers and peft), so
the command line can check the installation before any of them loads (`config/install.py`).
"""

import logging
from typing import Any

# peft imports bitsandbytes wherever it is installed (the `quant` extra); on a CPU with avx512_bf16 its
# import then asks the Hugging Face hub for a fused kernel and logs a warning when it cannot have it, on
# every llmrl command. llmrl never uses that kernel (llmrl/models/quantized.py says why): not a warning.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

from .config import Config, load_config
from .errors import LLMRLError

__all__ = ["Config", "LLMRLError", "Run", "load_config", "read_run", "train"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("train", "Run", "read_run"):
        from .config.install import broken_extras

        broken = broken_extras()
        if broken:
            raise ImportError(broken)
        from .run import folder, loop

        return {"train": loop.train, "Run": folder.Run, "read_run": folder.read_run}[name]
    raise AttributeError(f"module 'llmrl' has no attribute '{name}'")
