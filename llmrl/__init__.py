"""llmrl: fine-tune causal language models with reinforcement learning.

    from llmrl import load_config, train, read_run
    run = train(load_config(overrides={"algo": "grpo", "steps": 20, "out": "runs/demo"}))
    print(run.summary["eval_accuracy_after"])
"""

from .config import Config, load_config
from .run.loop import train
from .errors import LLMRLError
from .run.folder import Run, read_run

__all__ = ["Config", "LLMRLError", "Run", "load_config", "read_run", "train"]
__version__ = "0.1.0"
