"""plan_memory: the plan's inputs gathered from the run's settings, without loading a weight.

The model folder (models/load.model_source: `tiny` is built on first use, a catalogued name is its
obtained copy), its ModelShape (shape.py: config.json and safetensors headers), the longest prompt of the
task's train and eval splits in the model's tokenizer, and a reward model's files: a reward run on the
actor's base (reward.json: its adapter, the fourth role) or a separate classifier (its weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Config
from ..models.load import model_source
from ..models.prompts import apply_chat_setting, tokenize_prompts
from ..tasks import Task, task_from_config
from .plan import HELD, MemoryPlan, Part, plan_run
from .shape import read_shape


def longest_prompt(config: Config, task: Task, source: str) -> int:
    """The longest prompt of the task's splits in tokens, rendered as the run renders them (chat template)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=config.model.trust_remote_code)
    apply_chat_setting(tokenizer, config.data.chat_template, config.model.name, config.data.system_prompt)
    rows = [r["prompt"] for split in (task.train, task.eval) for r in split]
    return max((len(ids) for ids in tokenize_prompts(tokenizer, rows).input_ids), default=1) if rows else 1


def _weights_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def reward_parts(config: Config) -> tuple[Part, ...]:
    """A held part per reward model folder in reward.functions: a reward run's adapter and head on the actor's
    base (reward.json) or a separate classifier's weights, at their size on disk."""
    out = []
    for entry in config.reward.functions or []:
        name = entry.get("model") or entry.get("name") if isinstance(entry, dict) else entry
        folder = Path(str(name)).expanduser()
        if not folder.is_dir():
            continue
        adapter = (folder / "reward.json").is_file()
        files = [d for d in (folder, folder / "adapter") if d.is_dir()] if adapter else [folder]
        what = "reward run's adapter (fourth role)" if adapter else "reward model (a separate classifier)"
        out.append(Part(f"{what}: {folder.name}", sum(_weights_bytes(d) for d in files), HELD))
    return tuple(out)


def plan_memory(config: Config, budget: Any, task: Task | None = None, world: int = 1,
             baseline: int | None = None) -> MemoryPlan:
    """The run's plan (plan.plan_run) from its settings: the model's shape, the task's longest prompt (the task
    built here when not given), the reward models' sizes. Reads no weight."""
    source, _ = model_source(config.model, show_progress=False)
    shape = read_shape(source, config.model.trust_remote_code)
    prompt = longest_prompt(config, task if task is not None else task_from_config(config), source)
    return plan_run(config, budget, shape=shape, prompt_tokens=prompt, baseline=baseline, world=world,
                    extra=reward_parts(config))
